"""Runtimes: a bundle + max batch -> infer(frames) / submit(frames) + collect(ticket).

CpuRuntime (OpenCV/numpy preprocessing + ONNX Runtime CPU) is the fallback and
the reference; GpuRuntime (fused kernel + ONNX Runtime CUDA or TensorRT) does
the same on the GPU. Everything is allocated in the constructor.
"""

from __future__ import annotations

import logging
from pathlib import Path

from jetpipe import bundle as bundles
from jetpipe.errors import BundleError, JetpipeError
from jetpipe.preprocess import preprocess_frame
from jetpipe.runtime.api import BatchResult, Ticket, validate
from jetpipe.spec import PreprocessSpec

log = logging.getLogger(__name__)

BACKENDS = ("auto", "tensorrt", "onnxruntime-cuda", "onnxruntime-cpu")


class _Base:
    backend_name = "?"

    def __init__(self, bundle_dir, max_batch: int | None):
        self.bundle_dir = Path(bundle_dir)
        self.manifest = bundles.read_manifest(self.bundle_dir)
        problems = bundles.verify(self.bundle_dir)
        if problems:
            raise BundleError(f"bundle {bundle_dir} fails verification ({problems[0]}): rebuild it")
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

    def frame_ring(self, count: int, max_hw: tuple[int, int]):
        """Slots for `count` frames up to max_hw (BGR-sized), allocated now: for one source."""
        from jetpipe.runtime.ring import host_ring

        return host_ring(count, max_hw[0] * max_hw[1] * 3)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class CpuRuntime(_Base):
    """OpenCV preprocessing + ONNX Runtime CPU into preallocated buffers."""

    backend_name = "onnxruntime-cpu"

    def __init__(self, bundle_dir, max_batch: int | None = None):
        super().__init__(bundle_dir, max_batch)
        from jetpipe.runtime.backends import OrtCpuBackend

        self.backend = OrtCpuBackend(self.model_path, (3, *self.size_hw), self.max_batch)
        self.in_flight, self.next_set = [False, False], 0
        self.check_io(self.backend.input.name, [o.name for o in self.backend.outputs])

    def submit(self, frames) -> Ticket:
        """Preprocess and run now (the CPU has nothing to overlap); results wait in this set's buffers."""
        set_index = self.next_set
        if self.in_flight[set_index]:
            raise JetpipeError("2 batches are in flight: collect() one before submitting more")
        usable, rejected = validate(frames, self.max_batch)
        self.rejected_frames += len(rejected)
        boxes = []
        inputs = self.backend.input_buffers[set_index]
        for row, (_, frame, _, _, matrix) in enumerate(usable):
            _, box = preprocess_frame(frame.data, frame.format, self.size_hw, self.spec, matrix,
                                      out=inputs[row])
            boxes.append(box)
        if usable:
            self.backend.run(set_index, len(usable))
        self.in_flight[set_index] = True
        self.next_set = 1 - set_index
        return Ticket(set_index, len(usable), boxes, [u[0] for u in usable], rejected)

    def collect(self, ticket: Ticket) -> BatchResult:
        if not self.in_flight[ticket.set_index]:
            raise JetpipeError("this batch was already collected (or never submitted here)")
        self.in_flight[ticket.set_index] = False
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
    if backend == "onnxruntime-cpu":
        return _chosen(CpuRuntime(bundle_dir, max_batch), "requested")
    from jetpipe.runtime.cuda import GpuUnavailable

    try:
        from jetpipe.runtime.gpu_runtime import GpuRuntime, pick_gpu_backend

        gpu_backend = pick_gpu_backend(bundle_dir, backend)
        return _chosen(GpuRuntime(bundle_dir, max_batch, backend=gpu_backend, memory=memory, **gpu_options),
                       "requested" if backend != "auto" else "auto")
    except GpuUnavailable as exc:
        if backend != "auto":
            raise
        log.info("GPU runtime unavailable (%s): using the CPU", exc)
        return _chosen(CpuRuntime(bundle_dir, max_batch), f"auto, {exc}")


def _chosen(runtime, why: str):
    log.info("runtime backend: %s (%s)", runtime.backend_name, why)
    return runtime
