"""What the CPU and GPU runtimes share: bundle loading and the buffer-set lifecycle."""

from __future__ import annotations

import os
import platform
import threading
from pathlib import Path

import numpy as np

from jetpipe import bundle as bundles
from jetpipe.errors import BundleError, JetpipeError
from jetpipe.runtime.api import BatchResult, Ticket
from jetpipe.spec import PreprocessSpec


def width_buckets(width: int, width_range) -> tuple[int, ...]:
    """The input widths a runtime runs a bundle at: its own, and for a dynamic width range (text-line
    recognizers, 80:320:960) its own doubled up to the range's max, and the max (320, 640, 960): a batch
    of long lines runs wide enough for the longest, each engine shape planned once at start-up."""
    if not width_range:
        return (width,)
    widths, w = [], width
    while w < width_range[1]:
        widths.append(w)
        w *= 2
    return (*widths, width_range[1])


def at_width(buffer: np.ndarray, batch: int, sample_shape) -> np.ndarray:
    """The first `batch` samples of a buffer sized for the widest width, laid out at one width."""
    return buffer.reshape(-1)[:batch * int(np.prod(sample_shape))].reshape(batch, *sample_shape)


class RuntimeBase:
    """Bundle loading and the buffer-set lifecycle shared by the CPU and GPU runtimes.

    Each buffer set holds one batch: free -> in flight (submit) -> collected.
    collect(ticket, hold=True) keeps the set (and the output views) reserved
    until release(ticket), so another thread can postprocess while the next
    batches run; collect() without hold frees it at once."""

    backend_name = "?"
    device = None  # the CUDA device (cuda.CudaDevice) frames, rings and encoders live on; None on the CPU
    device_frames = False  # reads frames (and crops of them) in GPU memory
    reduction = None  # the CPU runtime returns the model's outputs; the GPU one may reduce them
    output_bytes_downloaded = 0  # device -> host bytes of outputs (none on the CPU)
    frame_bytes_uploaded = 0  # host -> device bytes of frames (none on the CPU)
    memory = "host"  # where frames wait: host, or the GPU runtime's mapped / staged / device

    def _init_sets(self, count: int) -> None:
        if count < 2:
            raise JetpipeError(f"buffer_sets {count}: at least 2 are needed")
        self.buffer_sets = count
        self._states = ["free"] * count
        self._tickets = [None] * count
        self._next = 0
        self._sets_lock = threading.Lock()

    def _claim_set(self) -> int:
        with self._sets_lock:
            for step in range(self.buffer_sets):
                index = (self._next + step) % self.buffer_sets
                if self._states[index] == "free":
                    self._states[index] = "in_flight"
                    self._next = (index + 1) % self.buffer_sets
                    return index
        raise JetpipeError(f"all {self.buffer_sets} buffer sets are busy: collect() (and release() held "
                           "batches) before submitting more")

    def _unclaim(self, index: int) -> None:
        with self._sets_lock:
            self._states[index] = "free"

    def _submitted(self, ticket: Ticket) -> Ticket:
        self._tickets[ticket.set_index] = ticket
        return ticket

    def batches_running(self) -> int:
        """Batches submitted that the device has not finished: 0 here (the CPU runs a batch within submit(); a
        remote server's answer is known once it is read)."""
        return 0

    def _check_collect(self, ticket: Ticket) -> None:
        with self._sets_lock:
            if self._states[ticket.set_index] != "in_flight" or self._tickets[ticket.set_index] is not ticket:
                raise JetpipeError("this batch was already collected (or never submitted here)")

    def _collected(self, ticket: Ticket, hold: bool) -> None:
        with self._sets_lock:
            self._states[ticket.set_index] = "held" if hold else "free"

    def release(self, ticket: Ticket) -> None:
        """Free a set collected with hold=True; its output views may be overwritten from now on."""
        with self._sets_lock:
            if self._states[ticket.set_index] == "held" and self._tickets[ticket.set_index] is ticket:
                self._states[ticket.set_index] = "free"

    def __init__(self, bundle_dir, max_batch: int | None):
        self.bundle_dir = Path(bundle_dir)
        self.manifest = bundles.load(self.bundle_dir)
        limit = self.manifest["batch"]["max"]
        self.max_batch = max_batch or limit
        if not 1 <= self.max_batch <= limit:
            raise JetpipeError(f"max_batch {self.max_batch} is outside the bundle's batch range 1..{limit}")
        self.spec = PreprocessSpec.from_dict(self.manifest["preprocess"])
        self.size_hw = tuple(self.manifest["input_size"])
        self.widths = width_buckets(self.size_hw[1], self.manifest.get("input_width_range"))
        self.model_path = str(self.bundle_dir / bundles.MODEL_FILE)
        self.rejected_frames = 0
        self._max_batch_fps: float | None = None
        self._rate_measured = False  # max_batch_fps() measures once: a worker's hello and auto decode ask both

    def width_of(self, width: int | None) -> int:
        """The width a batch runs at: one of `widths` (None: the bundle's own)."""
        if width is None:
            return self.size_hw[1]
        if width not in self.widths:
            raise JetpipeError(f"input width {width}: this runtime runs the bundle at "
                               f"{', '.join(map(str, self.widths))}")
        return width

    def check_io(self, input_name: str, output_names) -> None:
        """The manifest's tensors must be the model's: a stale or edited bundle is refused."""
        io = self.manifest["io"]
        want_in, want_out = io["inputs"][0]["name"], [o["name"] for o in io["outputs"]]
        if want_in != input_name or sorted(want_out) != sorted(output_names):
            raise BundleError(f"bundle {self.bundle_dir}: the manifest names input {want_in!r} and outputs "
                              f"{want_out}, the model has {input_name!r} and {list(output_names)}: "
                              "rebuild the bundle with `jetpipe convert`")

    def infer(self, frames, width: int | None = None) -> BatchResult:
        return self.collect(self.submit(frames, width))

    def frame_to_host(self, frame, out) -> None:
        """Copy a frame in device memory (a hardware decoder's ring slot) into host array `out`: for sinks
        that draw on frames. The CPU runtime never has one."""
        raise JetpipeError("frames in device memory need the GPU runtime")

    def engine_times(self, sizes) -> dict[int, float]:
        """Seconds a batch of each size takes, where the runtime measures them before serving ({}: it does not, and
        the batches' own times are learnt as they come)."""
        return {}

    def max_batch_fps(self) -> float | None:
        """Frames a second the model runs at its largest batch, measured the first time it is asked (before
        serving: engine_times); None where the runtime does not measure."""
        if not self._rate_measured:
            seconds = self.engine_times((self.max_batch,)).get(self.max_batch)
            self._max_batch_fps = self.max_batch / seconds if seconds else None
            self._rate_measured = True
        return self._max_batch_fps

    def describe(self) -> dict:
        """What reports say of the device this runtime runs on."""
        return {"kind": "cpu", "name": platform.processor() or platform.machine(), "cores": os.cpu_count()}

    def gpu_free_memory(self) -> int | None:
        """Free GPU memory in bytes (None: no GPU)."""
        return None

    def priority_got(self) -> str | None:
        """No GPU stream to raise on the CPU (the GPU runtime says what its runs got)."""
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
