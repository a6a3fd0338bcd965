"""The CPU runtime: OpenCV/numpy preprocessing + ONNX Runtime on the CPU (or a Triton server's model), the
fallback where there is no GPU and the reference the GPU runtime is compared with. Everything is allocated in
the constructor."""

from __future__ import annotations

import logging
import time

import numpy as np

from jetpipe.preprocess import preprocess_frame, preprocess_frame_fast
from jetpipe.runtime.api import BatchResult, Ticket, validate
from jetpipe.runtime.backends import OrtCpuBackend
from jetpipe.runtime.base import RuntimeBase, at_width
from jetpipe.runtime.triton_backend import TritonBackend, is_triton

log = logging.getLogger(__name__)


class CpuRuntime(RuntimeBase):
    """OpenCV preprocessing + ONNX Runtime CPU (or a Triton server's model) into preallocated buffers."""

    backend_name = "onnxruntime-cpu"

    def __init__(self, bundle_dir, max_batch: int | None = None, buffer_sets: int = 2,
                 exact_preprocess: bool = False, backend: str = "onnxruntime-cpu", threads: int = 0):
        """exact_preprocess: the float reference conversion the GPU kernel matches, instead of
        OpenCV's integer decoders (several times faster, within 1.5 8-bit steps). backend:
        onnxruntime-cpu, or triton://HOST:PORT/NAME (the model runs on that server). threads: ONNX Runtime's
        intra-op threads (0: a thread a core)."""
        super().__init__(bundle_dir, max_batch)
        self._preprocess = preprocess_frame if exact_preprocess else preprocess_frame_fast

        self._init_sets(buffer_sets)
        sample = (self.spec.channels, *self.size_hw)
        if is_triton(backend):
            self.backend = TritonBackend(backend, sample, self.max_batch, self.widths, buffer_sets)
        else:
            self.backend = OrtCpuBackend(self.model_path, sample, self.max_batch, self.widths, threads=threads)
        self.backend_name = self.backend.name
        self.check_io(self.backend.input.name, [o.name for o in self.backend.outputs])
        # one input and output buffer per set, sized for the widest width (a narrower batch uses their
        # start): a collected batch's outputs stay valid while the next runs
        b, spec = self.max_batch, self.backend.input
        # a backend may hold them itself (Triton's shared memory: the server reads and writes them in place)
        held = [getattr(self.backend, "buffers", lambda _: None)(i) for i in range(buffer_sets)]
        self.inputs = [h[0] if h else np.zeros(b * int(np.prod(spec.sample_shape)), spec.dtype) for h in held]
        self.outputs = [h[1] if h else {o.name: np.zeros(b * int(np.prod(o.sample_shape)), o.dtype)
                                        for o in self.backend.outputs} for h in held]
        for index, (inp, outs) in enumerate(zip(self.inputs, self.outputs)):
            self.backend.bind(index, inp.ctypes.data, {name: out.ctypes.data for name, out in outs.items()})

    def submit(self, frames, width: int | None = None) -> Ticket:
        """Preprocess and run now (the CPU has nothing to overlap); results wait in this set's buffers.
        width: the input width to run at (one of `widths`; None: the bundle's)."""
        width = self.width_of(width)
        usable, rejected = validate(frames, self.max_batch, device_frames=False)
        set_index = self._claim_set()
        try:
            self.rejected_frames += len(rejected)
            boxes = []
            size_hw = (self.size_hw[0], width)
            inputs = at_width(self.inputs[set_index], self.max_batch, (self.spec.channels, *size_hw))
            start = time.perf_counter()
            for row, (_, frame, _, _, matrix) in enumerate(usable):
                _, box = self._preprocess(frame.data, frame.format, size_hw, self.spec, matrix,
                                          out=inputs[row], crop=frame.crop, quad=frame.quad)
                boxes.append(box)
            preprocessed = time.perf_counter()
            if usable:
                self.backend.run(set_index, len(usable), width=width)
            done = time.perf_counter()
        except BaseException:
            self._unclaim(set_index)
            raise
        timings = {"preprocess": (preprocessed - start) * 1e3, "infer": (done - preprocessed) * 1e3}
        return self._submitted(Ticket(set_index, len(usable), boxes, [u[0] for u in usable], rejected, timings,
                                      width=width))

    def engine_times(self, sizes) -> dict[int, float]:
        """Seconds the model takes for a batch of each size, measured now (a run to warm the shape, then one
        timed, on zeros): what a latency budget is planned with before the first frame. A Triton server's
        model is not timed from here ({})."""
        if not isinstance(self.backend, OrtCpuBackend):
            return {}
        times = {}
        for size in sorted({min(max(1, s), self.max_batch) for s in sizes}):
            self.backend.run(0, size)
            start = time.perf_counter()
            self.backend.run(0, size)
            times[size] = time.perf_counter() - start
        return times

    def stage_times(self, ticket: Ticket) -> dict[str, float]:
        """Wall-clock milliseconds per stage of a submitted batch."""
        return dict(ticket.timings)

    def ready(self, ticket: Ticket) -> bool:
        """Whether collect(ticket) would return without waiting: submit ran the batch, unless a remote backend
        (Triton) answers it later."""
        return getattr(self.backend, "finish", None) is None or not ticket.batch

    def collect(self, ticket: Ticket, hold: bool = False) -> BatchResult:
        self._check_collect(ticket)
        finish = getattr(self.backend, "finish", None)  # a remote backend (Triton) answers asynchronously
        if finish is not None and ticket.batch:
            try:
                ticket.timings["infer"] += finish(ticket.set_index) * 1e3
            except BaseException:
                self._collected(ticket, False)  # the failed batch's set is free again
                raise
        self._collected(ticket, hold)
        shapes = self.backend.output_shapes[ticket.width]
        outputs = {spec.name: at_width(self.outputs[ticket.set_index][spec.name], ticket.batch, shape)
                   for spec, shape in zip(self.backend.outputs, shapes)}
        return BatchResult(outputs, ticket.letterboxes, ticket.frame_indices, ticket.rejected)

    def close(self) -> None:
        self.inputs, self.outputs = [], []  # before the backend: its shared memory unmaps once nothing views it
        if self.backend is not None:
            self.backend.close()
            self.backend = None
