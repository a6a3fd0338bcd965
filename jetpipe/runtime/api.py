"""What every runtime takes and returns (no CUDA here)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.frames import ColourMatrix, check_crop, check_frame, frame_shape, frame_size
from jetpipe.geometry import Letterbox, Quad


@dataclass
class Frame:
    """A camera frame: a tightly packed uint8 array in host memory (layouts in jetpipe.frames), or,
    with `device=True`, a tightly packed frame of size `hw` at `address` in device memory
    (a hardware decoder's ring slot, read by the kernel in place; `data` is None)."""

    data: np.ndarray | None
    format: str = "bgr"
    standard: str = "bt601"
    range: str = "limited"
    address: int | None = None  # device-readable address when data lives in a mapped ring slot
    pinned: bool = False        # data is page-locked (a ring slot): uploaded without a host copy
    device: bool = False        # the frame is in device memory at `address` (no host copy exists)
    hw: tuple[int, int] | None = None  # (height, width) of a device frame
    crop: tuple[int, int, int, int] | None = None  # x0, y0, x1, y1: only this part is the input (a secondary's)
    quad: Quad | None = None  # four (x, y) corners inside crop's region: warped upright into the input
    ready: object | None = None  # a device frame: an event its readers on the GPU wait for (its copy into the slot,
    #                             queued and not waited for: NvdecSource.read_queued); None: it is there now

    def size(self) -> tuple[int, int]:
        if self.device:
            if self.address is None or self.hw is None:
                raise JetpipeError("a device frame needs its address and (height, width)")
            frame_shape(self.format, *self.hw)  # validates format and even sizes
            height, width = self.hw
        else:
            height, width = frame_size(self.data, self.format)
            check_frame(self.data, self.format, height, width)
        if self.crop is not None:
            check_crop(self.crop, height, width)
        if self.quad is not None:
            check_quad(self.quad, self.crop)
        return height, width

    @property
    def nbytes(self) -> int:
        if self.device:
            return math.prod(frame_shape(self.format, *self.hw))
        return self.data.nbytes

    def matrix(self) -> ColourMatrix:
        return ColourMatrix.of(self.standard, self.range)


def check_quad(quad, crop) -> None:
    """Four finite corners, and the region read around them (the samples outside it repeat its border)."""
    try:  # plain Python: checked for every crop of a batch
        finite = len(quad) == 4 and all(len(c) == 2 and math.isfinite(c[0]) and math.isfinite(c[1]) for c in quad)
    except TypeError:
        finite = False
    if not finite:
        raise JetpipeError(f"quad {quad!r}: four (x, y) corners, finite")
    if crop is None:
        raise JetpipeError("a quad needs `crop`: the rectangle of the frame that holds it (geometry.quad_region)")


@dataclass
class Ticket:
    """A submitted batch; pass it to collect()."""

    set_index: int
    batch: int
    letterboxes: list[Letterbox]
    frame_indices: list[int]          # input index of each output row
    rejected: list[tuple[int, str]]   # (input index, reason) of frames left out
    timings: dict | None = None       # CPU runtime: wall-clock ms per stage
    frame_addresses: list[int] | None = None  # GPU runtime: where the kernel read each row's frame
    width: int | None = None          # the input width the batch ran at (one of the runtime's widths)
    run_number: int | None = None     # GPU runtime: the batch's number among those that ran on the GPU
    instance: int = 0                 # GPU runtime: the model instance (its sessions and stream) it ran on


@dataclass
class BatchResult:
    """Outputs of one batch.

    `outputs` are views into the runtime's reused host buffers (pinned on the
    GPU): they stay valid until that buffer set is submitted again, i.e. for
    one more submit() with two sets in flight. Copy what you keep.
    """

    outputs: dict[str, np.ndarray]
    letterboxes: list[Letterbox]
    frame_indices: list[int]
    rejected: list[tuple[int, str]] = field(default_factory=list)
    reduction: str | None = None  # set: `outputs` are that reduction's compact arrays, not the model's
    # GPU runtime: the device-readable address of each row's frame as the kernel read it (a ring slot, or
    # this batch's staging copy): valid while the batch is held (collect(hold=True) .. release()), so a
    # secondary model can cut crops from it without the frame crossing the bus again
    frame_addresses: list[int] | None = None
    # GPU runtime: milliseconds the GPU spent on the batch (CUDA events on its compute stream), without the
    # time it queued behind earlier batches; None where not measured (CPU runtime, a Triton server)
    engine_ms: float | None = None
    # GPU runtime: what the batch added to the GPU's busy time, engine_ms less the part that overlapped the
    # batch before it (a reduction on the post stream runs while the next batch's inference does)
    busy_ms: float | None = None


@dataclass(frozen=True)
class Reduction:
    """Postprocessing the GPU runtime runs on the engine's outputs in device memory, so that only
    compact per-frame arrays are copied to the host (kinds in runtime/postprocess_gpu.py).

    required=False: a runtime that cannot run it (the CPU runtime, an output it does not fit) returns
    the model's outputs instead and says why in its log; required=True: it refuses to open."""

    kind: str                                     # "components" | "topk" | "yolo-nms"
    options: dict = field(default_factory=dict)   # the kind's parameters (thresholds, limits)
    required: bool = False


PRIORITIES = ("normal", "high")  # a GPU runtime's inference stream: the default priority, or the highest


def check_priority(priority: str) -> None:
    if priority not in PRIORITIES:
        raise JetpipeError(f"priority = {priority!r}: choose {' or '.join(PRIORITIES)}")


def as_frame(item) -> Frame:
    return item if isinstance(item, Frame) else Frame(np.asarray(item), "bgr")


def validate(frames, max_batch: int, capacity: int | None = None, device_frames: bool = True):
    """Split a batch into usable frames and rejected ones (with reasons); never raises per frame.

    device_frames=False: this runtime reads host memory only (frames in device memory are rejected)."""
    if len(frames) == 0:
        raise JetpipeError("empty batch: pass at least one frame")
    if len(frames) > max_batch:
        raise JetpipeError(f"batch of {len(frames)} frames exceeds the runtime's max batch {max_batch}: "
                           "split it or open the runtime with a larger max_batch")
    usable, rejected = [], []
    for index, item in enumerate(frames):
        try:
            frame = as_frame(item)
            if frame.device and not device_frames:
                raise JetpipeError("a frame in device memory needs the GPU runtime")
            height, width = frame.size()
            matrix = frame.matrix()
            if capacity is not None and frame.nbytes > capacity:
                raise JetpipeError(f"frame of {frame.nbytes} bytes exceeds the ring slot of {capacity} "
                                   "bytes: open the runtime with a larger max_frame_hw")
            usable.append((index, frame, height, width, matrix))
        except JetpipeError as exc:
            rejected.append((index, str(exc)))
    return usable, rejected


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype
    sample_shape: tuple[int, ...]  # without the batch axis

    def nbytes(self, batch: int) -> int:
        return int(np.prod((batch, *self.sample_shape))) * np.dtype(self.dtype).itemsize


class Runtime(Protocol):
    """What callers get from open_runtime (CpuRuntime, GpuRuntime): nothing outside runtime touches CUDA."""

    backend_name: str
    reduction: str | None  # the Reduction kind collect() applies, None: the model's outputs
    memory: str            # where frames wait: host (CPU), mapped, staged or device (GPU)
    manifest: dict
    max_batch: int
    size_hw: tuple[int, int]

    widths: tuple[int, ...]  # input widths a batch can run at (submit's width): more than one for a width range
    buffer_sets: int       # batches that can be between submit() and release() at once
    device_frames: bool    # the kernel reads frames in GPU memory (a secondary must cut its crops there too)
    device: object         # the CUDA device frames, rings, encoders and decode processes use (None: the CPU runtime)
    output_bytes_downloaded: int  # device -> host bytes of outputs so far
    frame_bytes_uploaded: int     # host -> device bytes of frames so far (0 for NVDEC's and mapped frames)

    def submit(self, frames, width: int | None = None) -> Ticket: ...

    def collect(self, ticket: Ticket, hold: bool = False) -> BatchResult: ...

    def ready(self, ticket: Ticket) -> bool: ...  # collect(ticket) would not wait

    def batches_running(self) -> int: ...  # submitted, not finished by the device (0 where it cannot tell)

    def release(self, ticket: Ticket) -> None: ...

    def infer(self, frames, width: int | None = None) -> BatchResult: ...

    def stage_times(self, ticket: Ticket) -> dict[str, float]: ...

    def frame_to_host(self, frame: Frame, out: np.ndarray) -> None: ...

    def engine_times(self, sizes) -> dict[int, float]: ...

    def max_batch_fps(self) -> float | None: ...

    def describe(self) -> dict: ...

    def priority_got(self) -> str | None:
        """The GPU priority its runs got ("high", or "normal" where the backend cannot raise it); None where
        there is no stream of ours to raise (the CPU runtime, a Triton server's model)."""

    def gpu_free_memory(self) -> int | None: ...

    def close(self) -> None: ...
