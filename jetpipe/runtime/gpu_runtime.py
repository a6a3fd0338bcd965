"""GpuRuntime: frames -> fused kernel -> engine -> pinned outputs, all on our streams. It opens the backend and
the buffer sets (gpu_sets) and claims a set for each batch; FrameUpload places the frames, BatchLauncher
(gpu_launch) queues the rest and reads the outputs back.

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
from jetpipe.limits import MAX_MODEL_INSTANCES, MAX_SIDE
from jetpipe.runtime.api import BatchResult, Frame, Reduction, Ticket, check_priority, validate
from jetpipe.runtime.backends import OrtCudaBackend, out_of_memory
from jetpipe.runtime.base import RuntimeBase
from jetpipe.runtime.cuda import CudaDevice, GpuUnavailable, import_pycuda
from jetpipe.runtime.gpu_launch import BatchLauncher
from jetpipe.runtime.gpu_sets import FrameUpload, GpuStreams, ModelInstance, allocate_set, bind_set
from jetpipe.runtime.instances import AUTO, auto_instances, least_busy, why_one
from jetpipe.runtime.kernels import SOURCE, compile_module
from jetpipe.runtime.postprocess_gpu import SOURCE_NAME, ReductionUnsupported, make_reducer
from jetpipe.runtime.probe import probe_gpu
from jetpipe.runtime.triton_backend import TritonBackend, is_triton
from jetpipe.runtime.trt_backend import TensorRTBackend, check_engine_compatibility, engine_backend
from jetpipe.runtime.trt_builder import import_family

log = logging.getLogger(__name__)

ENGINE_BACKENDS = ("tensorrt", "tensorrt-rtx")
TIMED_RUNS = 5  # runs of each batch size engine_times() averages (a few ms each for the models served)


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


@dataclass(frozen=True)
class GpuOptions:
    """How a GpuRuntime is opened, beyond its bundle, batch and backend. max_frame_hw sizes the frame slots
    (bytes of a BGR frame that size); reduction: postprocessing run on the outputs in device memory (collect()
    then returns its compact arrays); cuda_graph: replay each (buffer set, batch bucket) inference from a CUDA
    graph captured at start-up (ONNX Runtime: see OrtCudaBackend; TensorRT: after each shape's first run), a
    model that cannot be captured runs without; priority "high": the inference runs on a stream at the GPU's
    highest priority (cuda.PriorityLane), ahead of other models' kernels: a secondary stage, whose batches hold
    up records the primary has finished; where the backend can run on no stream but its own (ONNX Runtime
    without graphs), it stays on the compute stream (logged). profile: CUDA events around every stage of every
    batch (stage_times). instances: copies of the model that run batches at once, each with sessions and a
    stream of its own (ONNX Runtime's CUDA provider only; one elsewhere, logged), or "auto" (instances.py: two
    where offered_fps, the frames a second the streams offer, comes near the model's measured rate)."""

    memory: str = "auto"
    max_frame_hw: tuple[int, int] = (1080, 1920)
    device: int = 0
    cuda_graph: bool = True
    profile: bool = False
    buffer_sets: int = 2
    reduction: Reduction | None = None
    priority: str = "normal"
    instances: int | str = 1
    offered_fps: float = 0.0

    def __post_init__(self):
        check_priority(self.priority)
        if not (self.instances == AUTO or type(self.instances) is int and 1 <= self.instances <= MAX_MODEL_INSTANCES):
            raise JetpipeError(f"model instances {self.instances!r}: auto or an integer 1..{MAX_MODEL_INSTANCES}")
        if not self.offered_fps >= 0:
            raise JetpipeError(f"offered_fps {self.offered_fps!r}: frames a second, 0 (not known) or more")
        height, width = self.max_frame_hw
        if not (1 <= height <= MAX_SIDE and 1 <= width <= MAX_SIDE):
            raise JetpipeError(f"max_frame_hw {height}x{width}: each side 1..{MAX_SIDE} pixels")
        if self.device < 0:
            raise JetpipeError(f"device {self.device}: a GPU's ordinal is 0 or more")


def warm_up(instance: ModelInstance, buffer_sets: int, widths) -> None:
    """Run every batch size on every buffer set once: the backend's per-shape work (cuDNN algorithm search, memory
    for the shape, TensorRT/ORT CUDA-graph capture) happens now, not in the frame loop."""
    stream = instance.streams.compute
    for buffers_index in range(buffer_sets):
        for width in widths:
            for batch in instance.backend.warm_batches():
                instance.backend.run(buffers_index, batch, stream, width)
    stream.synchronize()
    instance.backend.capture_graphs(stream)


def out_of_memory_said(rt: GpuRuntime, instance: ModelInstance) -> str:
    """The one line for a GPU that ran out of memory while an instance warmed up, and what to change."""
    which = (f"model instance {rt.instances.index(instance) + 1} of {len(rt.instances)}" if len(rt.instances) > 1
             else "the model")
    sizes = ", ".join(map(str, instance.backend.warm_batches()))
    return (f"the GPU ran out of memory warming up {which} ({rt.bundle_dir}: batches of {sizes} frames, each "
            f"size's memory its own, x {rt.buffer_sets} buffer sets): serve with a smaller --max-batch or "
            "--model-instances 1, or on a GPU with more memory free")


class GpuRuntime(RuntimeBase):
    """See the module docstring; `options`: GpuOptions' fields as keywords."""

    device_frames = True

    def __init__(self, bundle_dir, max_batch: int | None = None, backend: str = "onnxruntime-cuda", **options):
        super().__init__(bundle_dir, max_batch)
        self.options = GpuOptions(**options)
        self.reducer = None
        self.remote = is_triton(backend)  # the model runs on a Triton server: the input goes there from host memory
        self._init_sets(self.options.buffer_sets)
        self.instances: list[ModelInstance] = []  # the first is self.backend on self.streams
        self.device = CudaDevice(self.options.device)
        try:
            with self.device.active():
                self._open(backend)
        except BaseException:
            with self.device.active():
                for instance in self.instances:
                    instance.backend.close()
            self.device.close()
            raise
        log.info("GPU runtime on %s (sm %s, %s): backend %s, frames %s", self.device.name,
                 self.device.compute_capability, "integrated" if self.device.integrated else "discrete",
                 self.backend_name, self.memory)

    def _open(self, backend: str) -> None:
        d = self.device
        self.memory = d.memory_mode(self.options.memory)
        self.capacity = self.options.max_frame_hw[0] * self.options.max_frame_hw[1] * 3
        # a remote backend's answers are uploaded and reduced in the post thread, apart from the batches being
        # preprocessed on the compute stream
        self.streams = GpuStreams(d.stream(), d.stream(), d.stream(), d.stream() if self.remote else None)
        self.module = compile_module()
        free_before = d.free_memory()  # what the first instance takes: auto's room for a second
        self.backend = self._make_backend(backend, self.streams.compute)
        self.instances.append(ModelInstance(self.backend, self.streams))
        self._last_instance = 0
        self.check_io(self.backend.input.name, [o.name for o in self.backend.outputs])
        self.reducer = self._make_reducer(self.options.reduction)
        # a reduction runs on a stream of its own after its batch's inference, so that its kernels (an instance
        # mask's outline is traced by one thread) overlap the next batch's inference; non-blocking: ordered by
        # its events only, not behind work on the legacy default stream (a blocking one cost the light model
        # 17-31 % on one H100, docs/lab/benchmarks.md)
        if self.reducer is not None and not self.remote:
            self.streams.post = d.stream(non_blocking=True)
        self.sets = [allocate_set(self, i) for i in range(self.buffer_sets)]
        self.backend_name = self.backend.name  # a remote backend settles its transport as sets are shared
        self.upload = FrameUpload(d, self.memory)
        self._warm_up(self.instances)
        self._add_instances(backend, self._instances_wanted(backend, free_before))
        self.launcher = BatchLauncher(d, self.instances, self.reducer, self._priority_lane(),
                                      (self.spec.channels, self.size_hw[0]), self.buffer_sets, self.remote)

    def _instances_wanted(self, backend: str, free_before: int) -> int:
        """options.instances, or auto's choice (measured now: the model's rate, the memory the first took);
        1 where only one can run here (said in the log)."""
        asked = self.options.instances
        if asked == 1:
            return 1
        why = why_one(self.remote, self.options.priority, backend)
        if why is not None:  # auto (the default) says its choice; a number asked for says it was not followed
            said = "model_instances auto: one" if asked == AUTO else f"one model instance, not {asked}"
            log.info("%s: %s: %s", self.bundle_dir, said, why)
            return 1
        if asked != AUTO:
            return asked
        free = self.device.free_memory()
        count, why = auto_instances(self.options.offered_fps, self.max_batch_fps(), free, free_before - free)
        log.info("%s: model_instances auto: %s", self.bundle_dir, why)
        return count

    def _add_instances(self, backend: str, wanted: int) -> None:
        """The model instances past the first, each with its own sessions and compute stream, bound to every
        buffer set, warmed up and captured like the first."""
        for _ in range(wanted - 1):
            # the post stream is shared: a reduction's scratch is the runtime's (instances.py)
            streams = GpuStreams(self.device.stream(), self.streams.copy, self.streams.sink, post=self.streams.post)
            self.instances.append(ModelInstance(self._make_backend(backend, streams.compute), streams))
            for index, buffers in enumerate(self.sets):
                bind_set(self.instances[-1].backend, index, buffers)
            self._warm_up(self.instances[-1:])
        if wanted > 1:
            log.info("%s: %d model instances, each running its own batches on a stream of its own",
                     self.bundle_dir, wanted)

    @property
    def lane(self):
        """The high-priority stream inference runs on (None: the compute stream)."""
        return self.launcher.lane

    def priority_got(self) -> str | None:
        """"high" where its runs go on the high-priority lane, "normal" where not; None for a server's model."""
        if self.remote:
            return None
        return "high" if self.lane is not None else "normal"

    def _priority_lane(self):
        """The stream inference runs on at priority "high" (after warm-up: graphs are captured by then)."""
        if self.options.priority == "normal" or self.remote:  # a server's model runs at the server's priorities
            return None
        if not self.backend.runs_on_any_stream:
            log.info("%s: priority high needs the model's runs in CUDA graphs (%s ran without): it runs at "
                     "the default priority", self.bundle_dir, self.backend.name)
            return None
        return self.device.priority_lane()

    @property
    def reduction(self) -> str | None:
        return self.reducer.kind if self.reducer is not None else None

    # what the summaries report: bytes over the bus each way, and frames copied on the host
    host_frame_copies = property(lambda self: self.upload.host_frame_copies)
    frame_bytes_uploaded = property(lambda self: self.upload.frame_bytes_uploaded)
    output_bytes_downloaded = property(lambda self: self.launcher.output_bytes_downloaded)

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

    def _make_backend(self, backend: str, stream):
        sample, graphs = (self.spec.channels, *self.size_hw), self.options.cuda_graph
        if self.remote:
            return TritonBackend(backend, sample, self.max_batch, self.widths, self.buffer_sets, device=self.device)
        if backend in ENGINE_BACKENDS:
            check_engine_compatibility(self.manifest, import_family(backend).__version__,
                                       self.device.compute_capability, str(self.bundle_dir), backend)
            plan = (Path(self.bundle_dir) / self.manifest["engine"]["file"]).read_bytes()
            return TensorRTBackend(plan, self.max_batch, use_cuda_graphs=graphs, family=backend, widths=self.widths)
        return OrtCudaBackend(self.model_path, sample, self.max_batch, stream, device_id=self.device.ordinal,
                              cuda_graph=graphs, widths=self.widths)

    def _warm_up(self, instances: list[ModelInstance]) -> None:
        for instance in instances:
            try:
                warm_up(instance, self.buffer_sets, self.widths)
            except Exception as exc:
                if not out_of_memory(exc):
                    raise
                raise JetpipeError(out_of_memory_said(self, instance)) from exc

    def engine_times(self, sizes) -> dict[int, float]:
        """Seconds a batch of each size takes the model at the bundle's width, timed now over a few runs after
        warm-up (call before serving: the runs use the first buffer set); {} for a server's model (its time is
        the server's, measured as batches come)."""
        if self.remote:
            return {}
        times, stream = {}, self.streams.compute  # the first instance's
        with self.device.active():
            for size in sorted({min(max(1, int(s)), self.max_batch) for s in sizes}):
                stream.synchronize()
                start = time.perf_counter()
                for _ in range(TIMED_RUNS):
                    self.backend.run(0, size, stream, self.width_of(None))
                stream.synchronize()
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
            instance = self._pick_instance()
            streams = self.instances[instance].streams
            buffers.mark("h2d_start", self.upload.stream(streams))
            boxes, addresses = self.upload.upload(buffers, usable, (self.size_hw[0], width), streams)
            buffers.mark("h2d_end", self.upload.stream(streams))
            ticket = Ticket(set_index, len(usable), boxes, [u[0] for u in usable], rejected,
                            frame_addresses=addresses, width=width, instance=instance)
            self.launcher.launch(buffers, ticket)
        return ticket

    def _pick_instance(self) -> int:
        """The model instance with the fewest unfinished batches (the next one in turn among those tied), so
        that a batch starts on an idle instance where there is one."""
        if len(self.instances) == 1:
            return 0
        running = [0] * len(self.instances)
        for index in self._unfinished_sets():
            running[self._tickets[index].instance] += 1
        self._last_instance = least_busy(running, self._last_instance)
        return self._last_instance

    def stage_times(self, ticket: Ticket) -> dict[str, float]:
        """GPU milliseconds per stage of a collected batch (open the runtime with profile=True)."""
        return self.launcher.stage_times(self.sets[ticket.set_index])

    def ready(self, ticket: Ticket) -> bool:
        """Whether collect(ticket) would return without waiting: the batch's work on the GPU is done (a remote
        server's answer is not known before it is read: False)."""
        if self.remote:
            return False
        with self.device.active():
            return bool(self.sets[ticket.set_index].done.query())

    def batches_running(self) -> int:
        """Batches submitted that the GPU has not finished (their sets' done events not reached; 0 for a remote
        server's model, whose answers are known once read)."""
        return 0 if self.remote else len(self._unfinished_sets())

    def _unfinished_sets(self) -> list[int]:
        """The sets whose submitted batch the GPU has not finished. A set just claimed, not yet launched, is not
        among them: its done event is its last batch's, reached before it was collected (or never recorded)."""
        with self._sets_lock:
            submitted = [i for i, state in enumerate(self._states) if state == "in_flight"]
        with self.device.active():
            return [i for i in submitted if not self.sets[i].done.query()]

    def collect(self, ticket: Ticket, hold: bool = False) -> BatchResult:
        """Wait for the batch; hold=True keeps its buffers (and these views) until release(ticket)."""
        self._check_collect(ticket)
        buffers = self.sets[ticket.set_index]
        with self.device.active():
            buffers.done.synchronize()
        if self.remote:
            try:
                outputs = self.launcher.answer(buffers, ticket) if ticket.batch else {}
            except BaseException:
                self._collected(ticket, False)  # the failed batch's set is free again
                raise
            self._collected(ticket, hold)
            return BatchResult(outputs, ticket.letterboxes, ticket.frame_indices, ticket.rejected, self.reduction,
                               ticket.frame_addresses)
        engine_ms, busy_ms = self.launcher.engine_ms(buffers, ticket)  # before the set may be submitted again
        self._collected(ticket, hold)
        return BatchResult(self.launcher.outputs(buffers, ticket), ticket.letterboxes, ticket.frame_indices,
                           ticket.rejected, self.reduction, ticket.frame_addresses, engine_ms=engine_ms,
                           busy_ms=busy_ms)

    def describe(self) -> dict:
        return {**self.device.describe(), "free_memory_mb": self.gpu_free_memory() / 2**20}

    def gpu_free_memory(self) -> int:
        with self.device.active():
            return self.device.free_memory()

    def frame_to_host(self, frame: Frame, out: np.ndarray) -> None:
        """A device frame (NVDEC's ring slot) copied into host array `out` on a stream of its own (no wait
        on the inference streams); for sinks that draw, at their own rate."""
        if not frame.device:
            raise JetpipeError("frame_to_host copies frames in device memory; this one is in host memory")
        with self.device.active():
            self.device.cuda.memcpy_dtoh_async(out, frame.address, self.streams.sink)
            self.streams.sink.synchronize()

    def preprocess_only(self, frames, width: int | None = None) -> np.ndarray:
        """The kernel's output for a batch, copied to a new host array (tests and benchmarks)."""
        width = self.width_of(width)
        usable, _ = validate(frames, self.max_batch, self.capacity)
        set_index = self._claim_set()
        buffers, stream = self.sets[set_index], self.streams.compute
        out = np.empty((len(usable), self.spec.channels, self.size_hw[0], width), self.backend.input.dtype)
        try:
            with self.device.active():
                self.upload.upload(buffers, usable, (self.size_hw[0], width), self.streams)
                buffers.preprocessor.launch(len(usable), int(buffers.input), stream)
                stream.synchronize()
                self.device.cuda.memcpy_dtoh(out, buffers.input)
            return out
        finally:
            self._unclaim(set_index)

    def close(self) -> None:
        if getattr(self, "device", None) is None:
            return
        with self.device.active():
            for instance in self.instances:
                instance.streams.compute.synchronize()
                if instance.streams.post is not None:
                    instance.streams.post.synchronize()  # a reduction may still read the outputs
                instance.backend.close()
        self.device.close()
        self.device = None
