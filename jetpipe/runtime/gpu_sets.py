"""A GPU runtime's buffer sets, its streams, and how a batch's frames get to where the kernel reads them.

A buffer set holds one batch on its way through the GPU: slots for its frames, the engine's input and
outputs, the pinned host memory the outputs come back to, the kernel that fills the input, and the events
that order it all. Everything is allocated once, when the runtime opens (allocate_set). FrameUpload places a
batch's frames by the runtime's memory strategy (gpu_runtime's module docstring: mapped, staged, device).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jetpipe.runtime.kernels import GpuPreprocessor

# profiling events: frame upload (copy stream), kernel, inference, GPU postprocessing, download (compute stream)
STAGE_MARKS = ("h2d_start", "h2d_end", "pre_start", "pre_end", "infer_end", "post_end", "d2h_end")


@dataclass
class BufferSet:
    host_frames: np.ndarray              # pinned [max_batch, capacity] uint8 (mapped in 'mapped' mode)
    frame_addresses: list[int]           # what the kernel reads for each slot
    device_frames: object | None         # allocation of max_batch * capacity bytes (staged/device)
    input: object                        # device NCHW input of the engine
    outputs: dict                        # name -> device allocation
    host_outputs: dict                   # name -> pinned flat array, max_batch samples at the widest width
    #                                      (none with a reduction)
    preprocessor: object
    copied: object                       # event: frames on the device
    done: object                         # event: outputs in host memory
    marks: dict | None = None            # stage events when profiling
    host_input: np.ndarray | None = None  # a remote backend (Triton): the batch's input sent from here
    span: tuple = ()                     # timing events around the batch's work on the GPU
    inferred: object | None = None       # event: outputs written (the post stream's reduction waits on it)

    def mark(self, name: str, stream) -> None:
        """Record a profiling event (only in a runtime opened with profile=True)."""
        if self.marks is not None:
            self.marks[name].record(stream)

    def output_addresses(self, specs) -> list[int]:
        return [int(self.outputs[spec.name]) for spec in specs]


@dataclass
class GpuStreams:
    """The runtime's CUDA streams, one a job so that the jobs overlap."""

    compute: object              # preprocessing and inference, in batch order
    copy: object                 # staged frames host -> device, ahead of their batch's kernel
    sink: object                 # device frames to the host for drawing sinks, at their own rate
    answer: object | None = None  # a remote backend's answers, uploaded and reduced in the post thread
    post: object | None = None    # a reduction's kernels, overlapping the next batch's inference

    def finish(self):
        """The stream a batch's work ends on: the reduction's where there is one."""
        return self.post if self.post is not None else self.compute


@dataclass
class ModelInstance:
    """A copy of the model that runs batches on a stream of its own: its backend (sessions of its own: a CUDA
    graph replays its session's intermediate buffers, so one session's runs cannot overlap) and its streams
    (compute its own; copy, sink, answer and post shared: a reduction's scratch is the runtime's). Two instances
    run two batches at once."""

    backend: object
    streams: GpuStreams


def allocate_set(runtime, index: int) -> BufferSet:
    """Buffer set `index` of a GPU runtime being opened: its device, memory strategy, backend (whose buffers
    are bound to the set here) and reducer decide what is allocated."""
    d, b, backend = runtime.device, runtime.max_batch, runtime.backend
    mapped = runtime.memory == "mapped"
    host_frames = d.pinned((b, runtime.capacity), np.uint8, mapped=mapped)
    device_frames = None
    if mapped:
        base = d.device_pointer(host_frames)
    else:
        device_frames = d.alloc(b * runtime.capacity)
        base = int(device_frames)
    addresses = [base + i * runtime.capacity for i in range(b)]
    input_buffer = d.alloc(backend.input.nbytes(b))
    outputs = {s.name: d.alloc(s.nbytes(b)) for s in backend.outputs}
    addresses_out = {n: int(a) for n, a in outputs.items()}
    # CUDA shared memory: a Triton server reads and writes these device buffers as a local backend does
    on_device = not runtime.remote or backend.share(index, int(input_buffer), addresses_out)
    host_input = None
    if on_device:  # outputs come to the host only where the task is finished on the CPU
        host_outputs = {} if runtime.reducer else {s.name: d.pinned((b * int(np.prod(s.sample_shape)),), s.dtype)
                                                   for s in backend.outputs}
        if not runtime.remote:  # the first instance's; any later one is bound to every set by bind_set
            backend.bind(index, int(input_buffer), addresses_out)
    else:
        host_input, host_outputs = _remote_buffers(d, backend, b, index)
    pre = GpuPreprocessor(d, runtime.module, b, runtime.size_hw, runtime.spec, out_dtype=np.dtype(backend.input.dtype))
    marks = {name: d.event() for name in STAGE_MARKS} if runtime.options.profile else None
    return BufferSet(host_frames, addresses, device_frames, input_buffer, outputs, host_outputs, pre,
                     d.event(), d.event(blocking=True), marks, host_input, (d.event(), d.event()), d.event())


def bind_set(backend, index: int, buffers: BufferSet) -> None:
    """A set already allocated bound to another model instance's backend (its input and outputs)."""
    backend.bind(index, int(buffers.input), {name: int(address) for name, address in buffers.outputs.items()})


def _remote_buffers(device, backend, batch: int, index: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Host memory a Triton server reads the set's input from and writes its outputs to: its shared-memory
    region (page-locked here, so the copies to and from the GPU are asynchronous DMA), or pinned arrays
    the gRPC messages are filled from and answered into."""
    held = backend.buffers(index)
    if held is not None:
        host_input = device.register_host(held[0])
        host_outputs = {name: device.register_host(array) for name, array in held[1].items()}
    else:
        spec = backend.input
        host_input = device.pinned((batch * int(np.prod(spec.sample_shape)),), spec.dtype)
        host_outputs = {s.name: device.pinned((batch * int(np.prod(s.sample_shape)),), s.dtype)
                        for s in backend.outputs}
    backend.bind(index, host_input.ctypes.data, {n: a.ctypes.data for n, a in host_outputs.items()})
    return host_input, host_outputs


class FrameUpload:
    """Puts a batch's frames where the kernel reads them and points the kernel at each: in place (a mapped
    host slot, a device ring slot a hardware decoder wrote), or copied to the set's device frames (staged: on
    the copy stream, which the compute stream then waits for; device: on the compute stream). The streams are
    those of the model instance the batch runs on."""

    def __init__(self, device, memory: str):
        self.device, self.memory = device, memory
        self.host_frame_copies = 0      # frames copied on the host into pinned staging (not ring slots)
        self.frame_bytes_uploaded = 0   # frame bytes copied host -> device (0 for NVDEC and mapped frames)

    def stream(self, streams: GpuStreams):
        """The stream the frames go to the device on."""
        return streams.copy if self.memory == "staged" else streams.compute

    def upload(self, buffers: BufferSet, usable, size_hw: tuple[int, int],
               streams: GpuStreams) -> tuple[list, list[int]]:
        """Place every frame (validate()'s usable rows) for a kernel writing size_hw on streams.compute; returns
        the letterboxes and where each frame was read."""
        boxes, addresses = [], []
        buffers.preprocessor.size_hw = size_hw
        for row, (_, frame, height, width, matrix) in enumerate(usable):
            addresses.append(self._place(buffers, row, frame, streams))
            boxes.append(buffers.preprocessor.set_frame(row, frame.format, height, width, addresses[-1], matrix,
                                                        crop=frame.crop, quad=frame.quad))
        if self.memory == "staged" and usable:
            buffers.copied.record(streams.copy)
            streams.compute.wait_for_event(buffers.copied)
        return boxes, addresses

    def _place(self, buffers: BufferSet, row: int, frame, streams: GpuStreams) -> int:
        """Ring frames (pinned) are uploaded straight from their slot; other arrays are first copied into this
        buffer set's pinned staging."""
        if frame.device or (self.memory == "mapped" and frame.address is not None):
            if frame.ready is not None:  # its copy into the slot, queued on its source's stream
                streams.compute.wait_for_event(frame.ready)
            return frame.address  # device ring slot (hardware decoder) or mapped host slot: read in place
        if frame.pinned and self.memory != "mapped":
            source = frame.data.reshape(-1)
        else:
            source = buffers.host_frames[row, :frame.data.nbytes]
            np.copyto(source, frame.data.reshape(-1))
            self.host_frame_copies += 1
        self._stage(buffers, row, source, streams)
        return buffers.frame_addresses[row]

    def _stage(self, buffers: BufferSet, row: int, slot: np.ndarray, streams: GpuStreams) -> None:
        if self.memory == "mapped":
            return  # the kernel reads the pinned host slot itself
        self.frame_bytes_uploaded += slot.nbytes
        self.device.cuda.memcpy_htod_async(buffers.frame_addresses[row], slot, self.stream(streams))
