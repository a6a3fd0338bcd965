"""Runtimes: a bundle + max batch -> infer(frames) / submit(frames) + collect(ticket).

CpuRuntime (OpenCV/numpy preprocessing + ONNX Runtime CPU) is the fallback and
the reference; GpuRuntime (fused kernel + ONNX Runtime CUDA or TensorRT) does
the same on the GPU. Everything is allocated in the constructor.
"""

from __future__ import annotations

import logging
import os
import platform
import threading
import time
from pathlib import Path

from jetpipe import bundle as bundles
from jetpipe.errors import BundleError, JetpipeError
from jetpipe.preprocess import preprocess_frame, preprocess_frame_fast
from jetpipe.runtime.api import BatchResult, Ticket, validate
from jetpipe.spec import PreprocessSpec

log = logging.getLogger(__name__)

BACKENDS = ("auto", "tensorrt", "onnxruntime-cuda", "onnxruntime-cpu")


class _Base:
    """Bundle loading and the buffer-set lifecycle shared by the CPU and GPU runtimes.

    Each buffer set holds one batch: free -> in flight (submit) -> collected.
    collect(ticket, hold=True) keeps the set (and the output views) reserved
    until release(ticket), so another thread can postprocess while the next
    batches run; collect() without hold frees it at once."""

    backend_name = "?"

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
        self.model_path = str(self.bundle_dir / bundles.MODEL_FILE)
        self.rejected_frames = 0

    def check_io(self, input_name: str, output_names) -> None:
        """The manifest's tensors must be the model's: a stale or edited bundle is refused."""
        io = self.manifest["io"]
        want_in, want_out = io["inputs"][0]["name"], [o["name"] for o in io["outputs"]]
        if want_in != input_name or sorted(want_out) != sorted(output_names):
            raise BundleError(f"bundle {self.bundle_dir}: the manifest names input {want_in!r} and outputs "
                              f"{want_out}, the model has {input_name!r} and {list(output_names)}: "
                              "rebuild the bundle with `jetpipe convert`")

    def infer(self, frames) -> BatchResult:
        return self.collect(self.submit(frames))

    def frame_ring(self, count: int, max_hw: tuple[int, int], device: bool = False):
        """Slots for `count` frames up to max_hw (BGR-sized), allocated now: for one source.
        device=True (the GPU runtime only): slots in device memory, for a hardware decoder."""
        from jetpipe.runtime.ring import host_ring

        if device:
            raise JetpipeError("device-memory frame rings need the GPU runtime")
        return host_ring(count, max_hw[0] * max_hw[1] * 3)

    def hardware_decoder(self, uri, loop: bool = False, realtime: bool = False):
        """A source that decodes `uri` on this runtime's GPU into device memory, or None (the CPU has none)."""
        return None

    def describe(self) -> dict:
        """What reports say of the device this runtime runs on."""
        return {"kind": "cpu", "name": platform.processor() or platform.machine(), "cores": os.cpu_count()}

    def gpu_free_memory(self) -> int | None:
        """Free GPU memory in bytes (None: no GPU)."""
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class CpuRuntime(_Base):
    """OpenCV preprocessing + ONNX Runtime CPU into preallocated buffers."""

    backend_name = "onnxruntime-cpu"

    def __init__(self, bundle_dir, max_batch: int | None = None, buffer_sets: int = 2,
                 exact_preprocess: bool = False):
        """exact_preprocess: the float reference conversion the GPU kernel matches, instead of
        OpenCV's integer decoders (several times faster, within 1.5 8-bit steps)."""
        super().__init__(bundle_dir, max_batch)
        self._preprocess = preprocess_frame if exact_preprocess else preprocess_frame_fast
        from jetpipe.runtime.backends import OrtCpuBackend

        self._init_sets(buffer_sets)
        self.backend = OrtCpuBackend(self.model_path, (3, *self.size_hw), self.max_batch, sets=buffer_sets)
        self.check_io(self.backend.input.name, [o.name for o in self.backend.outputs])

    def submit(self, frames) -> Ticket:
        """Preprocess and run now (the CPU has nothing to overlap); results wait in this set's buffers."""
        usable, rejected = validate(frames, self.max_batch, device_frames=False)
        set_index = self._claim_set()
        try:
            self.rejected_frames += len(rejected)
            boxes = []
            inputs = self.backend.input_buffers[set_index]
            start = time.perf_counter()
            for row, (_, frame, _, _, matrix) in enumerate(usable):
                _, box = self._preprocess(frame.data, frame.format, self.size_hw, self.spec, matrix,
                                          out=inputs[row])
                boxes.append(box)
            preprocessed = time.perf_counter()
            if usable:
                self.backend.run(set_index, len(usable))
            done = time.perf_counter()
        except BaseException:
            self._unclaim(set_index)
            raise
        timings = {"preprocess": (preprocessed - start) * 1e3, "infer": (done - preprocessed) * 1e3}
        return self._submitted(Ticket(set_index, len(usable), boxes, [u[0] for u in usable], rejected, timings))

    def stage_times(self, ticket: Ticket) -> dict[str, float]:
        """Wall-clock milliseconds per stage of a submitted batch."""
        return dict(ticket.timings)

    def collect(self, ticket: Ticket, hold: bool = False) -> BatchResult:
        self._check_collect(ticket)
        self._collected(ticket, hold)
        buffers = self.backend.output_buffers[ticket.set_index]
        outputs = {name: buf[:ticket.batch] for name, buf in buffers.items()}
        return BatchResult(outputs, ticket.letterboxes, ticket.frame_indices, ticket.rejected)

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None


def open_runtime(bundle_dir, max_batch: int | None = None, backend: str = "auto", memory: str = "auto",
                 **gpu_options):
    """The best runtime this machine offers for the bundle (or the one asked for); logs the choice."""
    if backend not in BACKENDS:
        raise JetpipeError(f"backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    cpu_options = {k: v for k, v in gpu_options.items() if k == "buffer_sets"}
    if backend == "onnxruntime-cpu":
        return _chosen(CpuRuntime(bundle_dir, max_batch, **cpu_options), "requested")
    from jetpipe.runtime.cuda import GpuUnavailable

    try:
        from jetpipe.runtime.gpu_runtime import GpuRuntime, pick_gpu_backend

        gpu_backend = pick_gpu_backend(bundle_dir, backend)
        return _chosen(GpuRuntime(bundle_dir, max_batch, backend=gpu_backend, memory=memory, **gpu_options),
                       "requested" if backend != "auto" else "auto")
    except GpuUnavailable as exc:
        if backend != "auto":
            raise
        return _chosen(CpuRuntime(bundle_dir, max_batch, **cpu_options), f"auto; no GPU runtime: {exc}")


def _chosen(runtime, why: str):
    log.info("runtime backend: %s (%s)", runtime.backend_name, why)
    return runtime
