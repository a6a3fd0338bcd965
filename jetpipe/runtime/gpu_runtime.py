"""GpuRuntime: frames -> fused kernel -> engine -> pinned outputs, all on our streams.

Two buffer sets alternate so batch k+1's frame copy (copy stream) overlaps batch
k's compute (compute stream), and batch k's GPU postprocessing (post stream) overlaps
batch k+1's inference. Frame memory by strategy:
  mapped  frames in pinned mapped host memory, read by the kernel directly (Jetson)
  staged  pinned host ring -> async copy on the copy stream -> device frames (discrete GPU)
  device  device frames filled by a copy on the compute stream (no overlap; producers on the GPU)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jetpipe import bundle as bundles
from jetpipe.errors import JetpipeError
from jetpipe.runtime.api import BatchResult, Frame, Reduction, Ticket, check_priority, validate
from jetpipe.runtime.backends import OrtCudaBackend
from jetpipe.runtime.base import RuntimeBase, at_width
from jetpipe.runtime.cuda import CudaDevice, GpuUnavailable, import_pycuda
from jetpipe.runtime.jpeg import CpuJpeg, GpuJpeg
from jetpipe.runtime.kernels import SOURCE, GpuPreprocessor, compile_module
from jetpipe.runtime.nvdec import import_nvdec, open_nvdec
from jetpipe.runtime.postprocess_gpu import SOURCE_NAME, ReductionUnsupported, make_reducer
from jetpipe.runtime.probe import probe_gpu
from jetpipe.runtime.ring import FrameRing, slot_bytes
from jetpipe.runtime.triton_backend import TritonBackend, is_triton
from jetpipe.runtime.trt_backend import TensorRTBackend, check_engine_compatibility, engine_backend
from jetpipe.runtime.trt_builder import import_family

log = logging.getLogger(__name__)

ENGINE_BACKENDS = ("tensorrt", "tensorrt-rtx")
TIMED_RUNS = 5  # runs of each batch size engine_times() averages (a few ms each for the models served)
# profiling events: frame upload (copy stream), kernel, inference, GPU postprocessing, download (compute stream)
STAGE_MARKS = ("h2d_start", "h2d_end", "pre_start", "pre_end", "infer_end", "post_end", "d2h_end")
STAGES = {"h2d": ("h2d_start", "h2d_end"), "preprocess": ("pre_start", "pre_end"),
          "infer": ("pre_end", "infer_end"), "postprocess": ("infer_end", "post_end"),
          "d2h": ("post_end", "d2h_end")}


def pick_gpu_backend(bundle_dir, requested: str) -> str:
    """The bundle's engine where this machine can run it (tensorrt, tensorrt-rtx), else onnxruntime-cuda."""

    import_pycuda()  # GpuUnavailable with the install hint when PyCUDA is missing
    engine = bundles.read_manifest(bundle_dir).get("engine") or {}
    if requested in ("auto", *ENGINE_BACKENDS):
        choice, why = engine_backend(engine, requested, lambda family: import_family(family) is not None,
                                     probe_gpu().compute_capability)
        if choice is not None:
            return choice
        if requested != "auto":
            raise JetpipeError(f"backend {requested}: {why}")
        if engine.get("built"):
            log.info("the bundle's engine is not used: %s; running ONNX Runtime", why)
    try:
        import onnxruntime as ort
    except ImportError:
        raise GpuUnavailable("onnxruntime is not installed") from None
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise GpuUnavailable("onnxruntime has no CUDA execution provider (pip install onnxruntime-gpu)")
    return "onnxruntime-cuda"


@dataclass
class _BufferSet:
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


def busy_added_ms(engine_ms: float, previous_end_after_start_ms: float) -> float:
    """The part of a batch's span [start, start + engine_ms] not covered by the batches before it, the last
    of which ended at start + previous_end_after_start_ms. Spans start in order (the compute stream) and end in
    order (the stream they finish on), so summed over the batches this is the union of their spans; the sum of
    the spans counts each overlap twice."""
    return engine_ms - min(engine_ms, max(0.0, previous_end_after_start_ms))


class GpuRuntime(RuntimeBase):
    """See the module docstring. `max_frame_hw` sizes the frame ring (bytes of a BGR frame that size).
    `reduction`: postprocessing run on the outputs in device memory (collect() then returns its compact
    arrays). `cuda_graph`: replay each (buffer set, batch bucket) inference from a CUDA graph
    captured at start-up (ONNX Runtime: see OrtCudaBackend; TensorRT: after each shape's first
    run); a model that cannot be captured runs without. `priority` "high": the inference runs on a stream at
    the GPU's highest priority (cuda.PriorityLane), ahead of other models' kernels: a secondary stage, whose
    batches hold up records the primary has finished; where the backend can run on no stream but its own
    (ONNX Runtime without graphs), it stays on the compute stream (logged)."""

    def __init__(self, bundle_dir, max_batch: int | None = None, backend: str = "onnxruntime-cuda",
                 memory: str = "auto", max_frame_hw: tuple[int, int] = (1080, 1920), device: int = 0,
                 cuda_graph: bool = True, profile: bool = False, buffer_sets: int = 2,
                 reduction: Reduction | None = None, priority: str = "normal"):
        super().__init__(bundle_dir, max_batch)
        check_priority(priority)
        self.profile = profile
        self.host_frame_copies = 0      # frames copied on the host into pinned staging (not ring slots)
        self.frame_bytes_uploaded = 0   # frame bytes copied host -> device (0 for NVDEC and mapped frames)
        self.output_bytes_downloaded = 0  # bytes of outputs (or compact reductions) copied device -> host
        self.reducer, self.post_stream, self.lane = None, None, None
        self.remote = is_triton(backend)  # the model runs on a Triton server: the input goes there from host memory
        self._init_sets(buffer_sets)
        self.device = CudaDevice(device)
        try:
            with self.device.active():
                self.memory = self.device.memory_mode(memory)
                self.capacity = max_frame_hw[0] * max_frame_hw[1] * 3
                self.compute_stream, self.copy_stream = self.device.stream(), self.device.stream()
                self.sink_stream = self.device.stream()  # device frames to host for drawing sinks
                # a remote backend's answers: uploaded and reduced in the post thread, apart from the batches
                # being preprocessed on the compute stream
                self.answer_stream = self.device.stream() if self.remote else None
                self.module = compile_module()
                self.backend = self._make_backend(backend, cuda_graph)
                self.backend_name = self.backend.name
                self.check_io(self.backend.input.name, [o.name for o in self.backend.outputs])
                self.reducer = self._make_reducer(reduction)
                # a reduction runs on a stream of its own after its batch's inference, so that its kernels
                # (an instance mask's outline is traced by one thread) overlap the next batch's inference;
                # non-blocking: ordered by its events only, not behind work on the legacy default stream (a
                # blocking one cost the light model 17-31 % on one H100, docs/lab/benchmarks.md)
                if self.reducer is not None and not self.remote:
                    self.post_stream = self.device.stream(non_blocking=True)
                self.sets = [self._make_set(i) for i in range(self.buffer_sets)]
                # each batch's end again, in a ring one longer than the sets: batch N reads batch N-1's end,
                # which batch N+sets overwrites, and that one cannot start before batch N's set is free
                self._ends = [self.device.event() for _ in range(self.buffer_sets + 1)]
                self._batches_run = 0
                self.backend_name = self.backend.name  # a remote backend settles its transport as sets are shared
                self._warm_up()
                self.lane = self._priority_lane(priority)
        except BaseException:
            if getattr(self, "backend", None) is not None:
                with self.device.active():
                    self.backend.close()
            self.device.close()
            raise
        log.info("GPU runtime on %s (sm %s, %s): backend %s, frames %s", self.device.name,
                 self.device.compute_capability, "integrated" if self.device.integrated else "discrete",
                 self.backend_name, self.memory)

    def priority_got(self) -> str | None:
        """"high" where its runs go on the high-priority lane, "normal" where not; None for a server's model."""
        if self.remote:
            return None
        return "high" if self.lane is not None else "normal"

    def _priority_lane(self, priority: str):
        """The stream inference runs on at priority "high" (after warm-up: graphs are captured by then)."""
        if priority == "normal" or self.remote:  # a server's model runs at the server's priorities
            return None
        if not self.backend.runs_on_any_stream:
            log.info("%s: priority high needs the model's runs in CUDA graphs (%s ran without): it runs at "
                     "the default priority", self.bundle_dir, self.backend.name)
            return None
        return self.device.priority_lane()

    @property
    def reduction(self) -> str | None:
        return self.reducer.kind if self.reducer is not None else None

    def _make_reducer(self, reduction: Reduction | None):
        if reduction is None:
            return None
        try:
            module = compile_module(SOURCE.with_name(SOURCE_NAME))
            return make_reducer(reduction, self.device, module, self.max_batch, self.buffer_sets,
                                self.backend.outputs)
        except ReductionUnsupported as exc:
            if reduction.required:
                raise
            log.warning("postprocessing on the CPU: %s", exc)
            return None

    def _make_backend(self, backend: str, cuda_graph: bool):
        sample = (self.spec.channels, *self.size_hw)
        if self.remote:
            return TritonBackend(backend, sample, self.max_batch, self.widths, self.buffer_sets, device=self.device)
        if backend in ENGINE_BACKENDS:
            check_engine_compatibility(self.manifest, import_family(backend).__version__,
                                       self.device.compute_capability, str(self.bundle_dir), backend)
            plan = (Path(self.bundle_dir) / self.manifest["engine"]["file"]).read_bytes()
            return TensorRTBackend(plan, self.max_batch, use_cuda_graphs=cuda_graph, family=backend,
                                   widths=self.widths)

        return OrtCudaBackend(self.model_path, sample, self.max_batch, self.compute_stream,
                              device_id=self.device.ordinal, cuda_graph=cuda_graph, widths=self.widths)

    def _make_set(self, index: int) -> _BufferSet:
        d, b = self.device, self.max_batch
        mapped = self.memory == "mapped"
        host_frames = d.pinned((b, self.capacity), np.uint8, mapped=mapped)
        device_frames = None
        if mapped:
            base = d.device_pointer(host_frames)
            addresses = [base + i * self.capacity for i in range(b)]
        else:
            device_frames = d.alloc(b * self.capacity)
            addresses = [int(device_frames) + i * self.capacity for i in range(b)]
        input_dtype = np.dtype(self.backend.input.dtype)
        input_buffer = d.alloc(self.backend.input.nbytes(b))
        specs = self.backend.outputs
        outputs = {s.name: d.alloc(s.nbytes(b)) for s in specs}
        addresses_out = {n: int(a) for n, a in outputs.items()}
        # CUDA shared memory: a Triton server reads and writes these device buffers as a local backend does
        on_device = not self.remote or self.backend.share(index, int(input_buffer), addresses_out)
        host_input = None
        if on_device:  # outputs come to the host only where the task is finished on the CPU
            host_outputs = {} if self.reducer else {s.name: d.pinned((b * int(np.prod(s.sample_shape)),), s.dtype)
                                                    for s in specs}
            if not self.remote:
                self.backend.bind(index, int(input_buffer), addresses_out)
        else:
            host_input, host_outputs = self._remote_buffers(index)
        pre = GpuPreprocessor(d, self.module, b, self.size_hw, self.spec, out_dtype=input_dtype)
        marks = {name: d.event() for name in STAGE_MARKS} if self.profile else None
        return _BufferSet(host_frames, addresses, device_frames, input_buffer, outputs, host_outputs, pre,
                          d.event(), d.event(blocking=True), marks, host_input, (d.event(), d.event()), d.event())

    def _remote_buffers(self, index: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Host memory a Triton server reads the set's input from and writes its outputs to: its shared-memory
        region (page-locked here, so the copies to and from the GPU are asynchronous DMA), or pinned arrays
        the gRPC messages are filled from and answered into."""
        d, b = self.device, self.max_batch
        held = self.backend.buffers(index)
        if held is not None:
            host_input = d.register_host(held[0])
            host_outputs = {name: d.register_host(array) for name, array in held[1].items()}
        else:
            spec = self.backend.input
            host_input = d.pinned((b * int(np.prod(spec.sample_shape)),), spec.dtype)
            host_outputs = {s.name: d.pinned((b * int(np.prod(s.sample_shape)),), s.dtype)
                            for s in self.backend.outputs}
        self.backend.bind(index, host_input.ctypes.data, {n: a.ctypes.data for n, a in host_outputs.items()})
        return host_input, host_outputs

    def _warm_up(self) -> None:
        """Run every batch size on every buffer set once: the backend's per-shape work (cuDNN
        algorithm search, memory for the shape, TensorRT/ORT CUDA-graph capture) happens now,
        not in the frame loop."""
        for buffers_index in range(self.buffer_sets):
            for width in self.widths:
                for batch in self.backend.warm_batches():
                    self.backend.run(buffers_index, batch, self.compute_stream, width)
        self.compute_stream.synchronize()
        self.backend.capture_graphs(self.compute_stream)

    def engine_times(self, sizes) -> dict[int, float]:
        """Seconds a batch of each size takes the model at the bundle's width, timed now over a few runs after
        warm-up (call before serving: the runs use the first buffer set); {} for a server's model (its time is
        the server's, measured as batches come)."""
        if self.remote:
            return {}
        times = {}
        with self.device.active():
            for size in sorted({min(max(1, int(s)), self.max_batch) for s in sizes}):
                self.compute_stream.synchronize()
                start = time.perf_counter()
                for _ in range(TIMED_RUNS):
                    self.backend.run(0, size, self.compute_stream, self.width_of(None))
                self.compute_stream.synchronize()
                times[size] = (time.perf_counter() - start) / TIMED_RUNS
        return times

    def submit(self, frames, width: int | None = None) -> Ticket:
        """Queue one batch on the GPU's streams and return (collect() waits for it). width: the input width
        to run at (one of `widths`; None: the bundle's)."""
        width = self.width_of(width)
        usable, rejected = validate(frames, self.max_batch, self.capacity)
        set_index = self._claim_set()
        try:
            return self._submitted(self._submit(set_index, usable, rejected, width))
        except BaseException:
            self._unclaim(set_index)
            raise

    def _submit(self, set_index: int, usable, rejected, width: int) -> Ticket:
        buffers = self.sets[set_index]
        self.rejected_frames += len(rejected)
        with self.device.active():
            self._mark(buffers, "h2d_start", self._upload_stream())
            boxes, addresses = self._upload(buffers, usable, width)
            self._mark(buffers, "h2d_end", self._upload_stream())
            ticket = Ticket(set_index, len(usable), boxes, [u[0] for u in usable], rejected,
                            frame_addresses=addresses, width=width)
            if usable:
                self._enqueue(buffers, ticket)
                buffers.span[1].record(self._finish_stream())
                ticket.run_number = self._batches_run
                self._ends[self._batches_run % len(self._ends)].record(self._finish_stream())
                self._batches_run += 1
            buffers.done.record(self._finish_stream())
        return ticket

    def _finish_stream(self):
        """The stream a batch's work ends on: the reduction's where there is one."""
        return self.post_stream if self.post_stream is not None else self.compute_stream

    def _upload(self, buffers: _BufferSet, usable, width: int) -> tuple[list, list[int]]:
        """Place every frame and point the kernel at it; the compute stream waits for staged copies.
        Returns the letterboxes and where each frame was read."""
        boxes, addresses = [], []
        buffers.preprocessor.size_hw = (self.size_hw[0], width)
        for row, (_, frame, height, width, matrix) in enumerate(usable):
            addresses.append(self._place(buffers, row, frame))
            boxes.append(buffers.preprocessor.set_frame(row, frame.format, height, width, addresses[-1], matrix,
                                                        crop=frame.crop, quad=frame.quad))
        if self.memory == "staged" and usable:
            buffers.copied.record(self.copy_stream)
            self.compute_stream.wait_for_event(buffers.copied)
        return boxes, addresses

    def _place(self, buffers: _BufferSet, row: int, frame) -> int:
        """Where the kernel reads this frame: in place from a mapped ring slot, or uploaded.

        Ring frames (pinned) are uploaded straight from their slot; other arrays are
        first copied into this buffer set's pinned ring."""
        if frame.device or (self.memory == "mapped" and frame.address is not None):
            return frame.address  # device ring slot (hardware decoder) or mapped host slot: read in place
        if frame.pinned and self.memory != "mapped":
            source = frame.data.reshape(-1)
        else:
            source = buffers.host_frames[row, :frame.data.nbytes]
            np.copyto(source, frame.data.reshape(-1))
            self.host_frame_copies += 1
        self._stage(buffers, row, source)
        return buffers.frame_addresses[row]

    def frame_ring(self, count: int, max_hw: tuple[int, int], device: bool = False, fmt: str | None = None):
        """Pinned slots (mapped in 'mapped' mode: the kernel reads them with no copy), or with
        device=True slots in device memory for a hardware decoder (read in place by the kernel); sized for
        `fmt` where the source's format is known."""

        nbytes = slot_bytes(max_hw, device, fmt)
        with self.device.active():
            if device:
                allocations = [self.device.alloc(nbytes) for _ in range(count)]
                return FrameRing(allocations, [int(a) for a in allocations], pinned=False, device=True,
                                 slot_bytes=nbytes)
            mapped = self.memory == "mapped"
            arrays = [self.device.pinned((nbytes,), np.uint8, mapped=mapped) for _ in range(count)]
        addresses = [self.device.device_pointer(a) if mapped else None for a in arrays]
        return FrameRing(arrays, addresses, pinned=True)

    def describe(self) -> dict:
        return {**self.device.describe(), "free_memory_mb": self.gpu_free_memory() / 2**20}

    def gpu_free_memory(self) -> int:
        with self.device.active():
            return self.device.free_memory()

    device_frames = True

    @property
    def decodes_to_device(self) -> bool:
        return not self.device.integrated and import_nvdec() is not None

    def hardware_decoder(self, uri, loop: bool = False, realtime: bool = False, feed=None, fallback=None):
        """An NVDEC source (PyNvVideoCodec) for a video file, or a network stream given its feed, on this
        GPU; or None, logged why."""

        return open_nvdec(self.device, uri, loop, realtime, feed, fallback)

    def _stage(self, buffers: _BufferSet, row: int, slot: np.ndarray) -> None:
        if self.memory != "mapped":
            self.frame_bytes_uploaded += slot.nbytes
        if self.memory == "staged":
            self.device.cuda.memcpy_htod_async(buffers.frame_addresses[row], slot, self.copy_stream)
        elif self.memory == "device":
            self.device.cuda.memcpy_htod_async(buffers.frame_addresses[row], slot, self.compute_stream)

    def _upload_stream(self):
        return self.copy_stream if self.memory == "staged" else self.compute_stream

    @staticmethod
    def _mark(buffers: _BufferSet, name: str, stream) -> None:
        if buffers.marks is not None:
            buffers.marks[name].record(stream)

    def _enqueue(self, buffers: _BufferSet, ticket: Ticket) -> None:
        stream, batch = self.compute_stream, ticket.batch
        buffers.span[0].record(stream)  # once the stream is free and the frames are on the device
        self._mark(buffers, "pre_start", stream)
        buffers.preprocessor.launch(batch, int(buffers.input), stream)
        self._mark(buffers, "pre_end", stream)
        if self.remote:
            self._send(buffers, ticket)
            return
        if self.lane is not None:
            self.lane.run_after(stream, lambda lane: self.backend.run(ticket.set_index, batch, lane, ticket.width))
        else:
            self.backend.run(ticket.set_index, batch, stream, ticket.width)
        self._mark(buffers, "infer_end", stream)
        shapes = self.backend.output_shapes[ticket.width]
        if self.reducer is not None:  # its kernels and copies on the post stream, once the outputs are written
            buffers.inferred.record(stream)
            stream = self._finish_stream()
            stream.wait_for_event(buffers.inferred)
            self.reducer.place(ticket.set_index, ticket.letterboxes)
            self.reducer.launch(ticket.set_index, batch, self._output_addresses(buffers), stream, shapes[0])
        self._mark(buffers, "post_end", stream)
        if self.reducer is not None:
            self.output_bytes_downloaded += self.reducer.download(ticket.set_index, batch, stream, shapes[0])
        for spec, shape in zip(self.backend.outputs, shapes):
            if spec.name not in buffers.host_outputs:
                continue  # reduced on the device: only the reduction's arrays come back
            host = at_width(buffers.host_outputs[spec.name], batch, shape)
            self.device.cuda.memcpy_dtoh_async(host, buffers.outputs[spec.name], stream)
            self.output_bytes_downloaded += host.nbytes
        self._mark(buffers, "d2h_end", stream)

    def _send(self, buffers: _BufferSet, ticket: Ticket) -> None:
        """The preprocessed batch to host memory, then to the Triton server (the request is asynchronous:
        collect() waits for its answer). The stage marks after preprocessing say nothing of the server."""
        stream, sample = self.compute_stream, (self.spec.channels, self.size_hw[0], ticket.width)
        if buffers.host_input is not None:  # not with CUDA shared memory: the server reads the device buffer
            host = at_width(buffers.host_input, ticket.batch, sample)
            self.device.cuda.memcpy_dtoh_async(host, buffers.input, stream)
        stream.synchronize()  # the request may go once the input is where the server reads it
        self.backend.run(ticket.set_index, ticket.batch, stream, ticket.width)
        for mark in ("infer_end", "post_end", "d2h_end"):
            self._mark(buffers, mark, stream)

    def _answer(self, ticket: Ticket, buffers: _BufferSet) -> dict[str, np.ndarray]:
        """Wait for the server's outputs (in host memory); with a reduction, uploaded and reduced here."""
        self.backend.finish(ticket.set_index)
        shapes = self.backend.output_shapes[ticket.width]
        on_device = buffers.host_input is None  # CUDA shared memory: the outputs are in the device buffers
        if self.reducer is None:
            outputs = {spec.name: at_width(buffers.host_outputs[spec.name], ticket.batch, shape)
                       for spec, shape in zip(self.backend.outputs, shapes)}
            if on_device:
                with self.device.active():
                    for spec in self.backend.outputs:
                        self.device.cuda.memcpy_dtoh_async(outputs[spec.name], buffers.outputs[spec.name],
                                                           self.answer_stream)
                        self.output_bytes_downloaded += outputs[spec.name].nbytes
                    self.answer_stream.synchronize()
            return outputs
        stream = self.answer_stream
        with self.device.active():
            if not on_device:
                for spec, shape in zip(self.backend.outputs, shapes):
                    host = at_width(buffers.host_outputs[spec.name], ticket.batch, shape)
                    self.device.cuda.memcpy_htod_async(buffers.outputs[spec.name], host, stream)
            self.reducer.place(ticket.set_index, ticket.letterboxes)
            self.reducer.launch(ticket.set_index, ticket.batch, self._output_addresses(buffers), stream, shapes[0])
            self.output_bytes_downloaded += self.reducer.download(ticket.set_index, ticket.batch, stream, shapes[0])
            stream.synchronize()
        return self._reduced(ticket, shapes[0])

    def _output_addresses(self, buffers: _BufferSet) -> list[int]:
        return [int(buffers.outputs[spec.name]) for spec in self.backend.outputs]

    def _reduced(self, ticket: Ticket, sample_shape) -> dict[str, np.ndarray]:
        """The reduction's arrays of a finished batch; what its kernels wrote into mapped memory counted."""
        self.output_bytes_downloaded += self.reducer.written(ticket.set_index, ticket.batch)
        return self.reducer.host(ticket.set_index, ticket.batch, sample_shape)

    def stage_times(self, ticket: Ticket) -> dict[str, float]:
        """GPU milliseconds per stage of a collected batch (open the runtime with profile=True)."""
        marks = self.sets[ticket.set_index].marks
        if marks is None:
            raise JetpipeError("stage times need a runtime opened with profile=True")
        with self.device.active():
            return {stage: marks[end].time_since(marks[start]) for stage, (start, end) in STAGES.items()}

    def collect(self, ticket: Ticket, hold: bool = False) -> BatchResult:
        """Wait for the batch; hold=True keeps its buffers (and these views) until release(ticket)."""
        self._check_collect(ticket)
        buffers = self.sets[ticket.set_index]
        with self.device.active():
            buffers.done.synchronize()
        if self.remote:
            try:
                outputs = self._answer(ticket, buffers) if ticket.batch else {}
            except BaseException:
                self._collected(ticket, False)  # the failed batch's set is free again
                raise
            self._collected(ticket, hold)
            return BatchResult(outputs, ticket.letterboxes, ticket.frame_indices, ticket.rejected, self.reduction,
                               ticket.frame_addresses)
        engine_ms, busy_ms = self._engine_ms(buffers, ticket)  # read before the set may be submitted again
        self._collected(ticket, hold)
        shapes = self.backend.output_shapes[ticket.width]
        if self.reducer is not None:
            outputs = self._reduced(ticket, shapes[0])
        else:
            outputs = {spec.name: at_width(buffers.host_outputs[spec.name], ticket.batch, shape)
                       for spec, shape in zip(self.backend.outputs, shapes)}
        return BatchResult(outputs, ticket.letterboxes, ticket.frame_indices, ticket.rejected, self.reduction,
                           ticket.frame_addresses, engine_ms=engine_ms, busy_ms=busy_ms)

    def _engine_ms(self, buffers: _BufferSet, ticket: Ticket) -> tuple[float | None, float | None]:
        """The GPU's time on a collected batch, from the compute stream reaching it to its outputs in host
        memory (waiting behind earlier batches not counted), and what of it did not overlap the batch before
        (busy_added_ms); None, None for an empty batch."""
        if not ticket.batch:
            return None, None
        with self.device.active():
            engine_ms = buffers.span[1].time_since(buffers.span[0])
            if not ticket.run_number:
                return engine_ms, engine_ms
            previous_end = self._ends[(ticket.run_number - 1) % len(self._ends)]
            return engine_ms, busy_added_ms(engine_ms, previous_end.time_since(buffers.span[0]))

    def frame_to_host(self, frame: Frame, out: np.ndarray) -> None:
        """A device frame (NVDEC's ring slot) copied into host array `out` on a stream of its own (no wait
        on the inference streams); for sinks that draw, at their own rate."""
        if not frame.device:
            raise JetpipeError("frame_to_host copies frames in device memory; this one is in host memory")
        with self.device.active():
            self.device.cuda.memcpy_dtoh_async(out, frame.address, self.sink_stream)
            self.sink_stream.synchronize()

    def jpeg_encoder(self, choice: str, quality: int, buffers: int, max_hw: tuple[int, int]):
        """nvJPEG through nvImageCodec (`auto` and `gpu`; a trial picture at start-up), OpenCV where asked for
        or (auto) where the GPU's cannot be had, said in the log."""
        if choice != "cpu":
            try:
                encoder = GpuJpeg(self.device, self.module, quality, buffers, max_hw)
                encoder.encode_image(np.zeros((16, 16, 3), np.uint8))
                return encoder
            except Exception as exc:
                if choice == "gpu":
                    raise JetpipeError(f"JPEG encoder 'gpu': {str(exc).strip()[:300]}") from None
                log.info("JPEG pictures are encoded by OpenCV on the CPU: the GPU's encoder cannot be had (%s)",
                         str(exc).strip()[:200])
        return CpuJpeg(quality, buffers, max_hw, self.frame_to_host)

    def preprocess_only(self, frames, width: int | None = None) -> np.ndarray:
        """The kernel's output for a batch, copied to a new host array (tests and benchmarks)."""
        width = self.width_of(width)
        usable, _ = validate(frames, self.max_batch, self.capacity)
        set_index = self._claim_set()
        try:
            return self._preprocess_only(self.sets[set_index], usable, width)
        finally:
            self._unclaim(set_index)

    def _preprocess_only(self, buffers: _BufferSet, usable, width: int) -> np.ndarray:
        out = np.empty((len(usable), self.spec.channels, self.size_hw[0], width), self.backend.input.dtype)
        with self.device.active():
            self._upload(buffers, usable, width)
            buffers.preprocessor.launch(len(usable), int(buffers.input), self.compute_stream)
            self.compute_stream.synchronize()
            self.device.cuda.memcpy_dtoh(out, buffers.input)
        return out

    def close(self) -> None:
        if getattr(self, "device", None) is None:
            return
        with self.device.active():
            self.compute_stream.synchronize()
            if self.post_stream is not None:
                self.post_stream.synchronize()  # a reduction may still read the outputs
            self.backend.close()
        self.device.close()
        self.device = None
