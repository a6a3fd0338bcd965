"""Inference backends behind one interface.

A backend runs the bundle's model on a batch whose input already sits in a
buffer the runtime owns, writing outputs into buffers the runtime owns:
  - OrtCpuBackend:  ONNX Runtime CPU EP, I/O bound to numpy arrays.
  - OrtCudaBackend: ONNX Runtime CUDA EP, I/O bound to our PyCUDA device
    buffers (IOBinding with raw pointers), on our stream.
  - TensorRTBackend (trt_backend.py): execute_async_v3 on our stream.
Every binding is made at construction for each batch size, input width and buffer set.

A model with a dynamic input width (a text-line recognizer) runs each batch at one of the runtime's
widths (`widths`, from the bundle's width range): buffers are sized for the widest, and a batch at a
narrower width uses the start of each buffer, laid out for that width (`output_shapes[width]`).
"""

from __future__ import annotations

import logging

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.runtime.api import TensorSpec
from jetpipe.runtime.cuda_graph import CudaGraph
from jetpipe.runtime.sessions import cpu_session, ort_session

log = logging.getLogger(__name__)


def ort_tensor_specs(session, input_sample_shape) -> tuple[TensorSpec, list[TensorSpec]]:
    """Input and output specs from one batch-1 run (per-sample shapes must be static)."""
    inp = session.get_inputs()[0]
    dummy = np.zeros((1, *input_sample_shape), np.float32)
    try:
        outputs = session.run(None, {inp.name: dummy})
    except Exception as exc:  # ONNX Runtime's own error, at start-up: one line, not a traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise JetpipeError(f"the bundle's model fails on a blank {list(input_sample_shape)} input at start-up "
                           f"({first[:300]}): check it with `jetpipe calibrate accuracy`, or convert it again"
                           ) from None
    specs = []
    for meta, value in zip(session.get_outputs(), outputs):
        if value.ndim == 0 or value.shape[0] != 1:
            raise JetpipeError(f"output {meta.name} has shape {list(value.shape)} for one image: "
                               "jetpipe's runtime needs outputs batched on axis 0")
        specs.append(TensorSpec(meta.name, value.dtype, tuple(value.shape[1:])))
    return TensorSpec(inp.name, np.dtype(np.float32), tuple(input_sample_shape)), specs


def specs_at_widths(session, input_sample_shape, widths) -> tuple[TensorSpec, list[TensorSpec], dict]:
    """Specs at the widest width (what buffers are sized for) and each width's output sample shapes."""
    channels, height = input_sample_shape[:2]
    shapes = {}
    for width in widths:
        inp, outs = ort_tensor_specs(session, (channels, height, width))
        shapes[width] = [o.sample_shape for o in outs]
    return inp, outs, shapes


class OrtCpuBackend:
    """ONNX Runtime on the CPU, reading and writing the runtime's host buffers in place."""

    name = "onnxruntime-cpu"

    def __init__(self, model_path: str, input_sample_shape, max_batch: int, widths=None, threads: int = 0):
        # no spinning: a pipeline's sources, postprocessing and a secondary model's session share the cores;
        # a primary's threads spinning while they wait took them (jetpipe demo, det + rec on 2 cores:
        # 3.9-4.0 -> 4.7-5.3 frames/s, docs/lab/benchmarks.md). threads: intra-op threads (0: ONNX Runtime's, a
        # thread a core)
        self.session = cpu_session(model_path, spin=False, threads=threads)
        self.widths = tuple(widths or (input_sample_shape[2],))
        self.input, self.outputs, self.output_shapes = specs_at_widths(self.session, input_sample_shape,
                                                                       self.widths)
        self.max_batch = max_batch
        self.bindings: dict[tuple[int, int, int], object] = {}

    def bind(self, set_index: int, input_address: int, output_addresses: dict[str, int]) -> None:
        channels, height = self.input.sample_shape[:2]
        for width in self.widths:
            for batch in range(1, self.max_batch + 1):
                binding = self.session.io_binding()
                binding.bind_input(self.input.name, "cpu", 0, self.input.dtype, [batch, channels, height, width],
                                   input_address)
                for spec, shape in zip(self.outputs, self.output_shapes[width]):
                    binding.bind_output(spec.name, "cpu", 0, spec.dtype, [batch, *shape],
                                        output_addresses[spec.name])
                self.bindings[(set_index, batch, width)] = binding

    def run(self, set_index: int, batch: int, stream=None, width: int | None = None) -> None:
        self.session.run_with_iobinding(self.bindings[(set_index, batch, width or self.widths[0])])

    def warm_batches(self) -> list[int]:
        return []  # nothing is planned per shape on the CPU worth a start-up run

    def capture_graphs(self, stream) -> None:
        """No CUDA graphs on the CPU."""

    def close(self) -> None:
        self.bindings.clear()
        self.session = None


# Batch sizes that get a session of their own; past it, powers of two and the maximum. A batch runs in the smallest
# bucket that holds it, so the rows past it cost GPU time: with powers of two, PP-OCRv4 det's (640 x 640) batches of
# 5, 6 and 7 ran 48, 27 and 13 % longer as 8 than at their own size, and a busy GPU's batches are mostly 5-8 frames
# (H100, scripts/diag/bucket_cost.py, session 64). A session's memory is what its size's activations take: sizes 3,
# 5, 6 and 7 add ~3.3 GB an instance there (~6.2 GB in all with the CUDA context, against ~3.0 with powers of two).
EVERY_SIZE_UP_TO = 8
# Each session sees one shape, so its arena's size is set at warm-up; ORT's default doubles each extension, which
# left ~0.8 GB of the 8 sessions' 7.0 GB unused there (the same run times).
SESSION_CUDA_OPTIONS = {"arena_extend_strategy": "kSameAsRequested"}


def out_of_memory(exc: BaseException) -> bool:
    """Whether an ONNX Runtime (or CUDA) error says the GPU's memory ran out."""
    text = str(exc).lower()
    return "out of memory" in text or "failed to allocate memory" in text


def batch_buckets(max_batch: int, every_size_up_to: int = EVERY_SIZE_UP_TO) -> list[int]:
    """Every size up to every_size_up_to, then powers of two up to max_batch, and max_batch itself:
    8 -> [1, ..., 8]; 32 -> [1, ..., 8, 16, 32]; 24 -> [1, ..., 8, 16, 24]; with every_size_up_to=1,
    8 -> [1, 2, 4, 8]."""
    buckets = list(range(1, min(every_size_up_to, max_batch) + 1))
    b = 1
    while b < max_batch:
        if b > buckets[-1]:
            buckets.append(b)
        b *= 2
    return buckets if buckets[-1] == max_batch else buckets + [max_batch]


class OrtCudaBackend:
    """ONNX Runtime CUDA EP with I/O bound to device buffers, running on our stream.

    One session per batch bucket (batch_buckets: every size up to 8, then powers of two and the
    max): ONNX Runtime's CUDA convolutions re-plan whenever the input shape changes between runs
    (measured on an H200: 0.4-0.7 s per batch when batch sizes alternate), so each session only
    ever sees one shape; a batch runs in the smallest bucket that holds it, the rows past it are
    ignored.
    `bind` makes one IOBinding per (buffer set, bucket) here, none in the frame loop.

    cuda_graph: after warm-up, `capture_graphs` records each (set, bucket) run in a CUDA
    graph of jetpipe's own (thread-local capture: other threads' CUDA calls, e.g. an NVDEC
    source's, are unaffected) and `run` replays it without waiting — one launch instead of
    ONNX Runtime's per-node launches on the CPU. ORT's own `enable_cuda_graph` is not used:
    it captures lazily in each calling thread in global mode and replays synchronously.
    A model whose run cannot be captured runs without graphs (logged).
    """

    name = "onnxruntime-cuda"

    def __init__(self, model_path: str, input_sample_shape, max_batch: int, stream, device_id: int = 0,
                 cuda_graph: bool = False, widths=None):
        import onnxruntime as ort

        self.widths = tuple(widths or (input_sample_shape[2],))
        self.input, self.outputs, self.output_shapes = specs_at_widths(cpu_session(model_path), input_sample_shape,
                                                                       self.widths)
        self.buckets = batch_buckets(max_batch)
        # one session per (batch bucket, width): each sees one shape, so none re-plans
        self.sessions = {(b, w): ort_session(model_path, "cuda", device_id=device_id, stream=stream,
                                             cuda_options=SESSION_CUDA_OPTIONS)
                         for b in self.buckets for w in self.widths}
        first = self.sessions[(self.buckets[0], self.widths[0])]
        if first.get_providers()[0] != "CUDAExecutionProvider":
            raise JetpipeError("onnxruntime did not enable the CUDA execution provider "
                               f"(providers: {first.get_providers()})")
        self.device_id, self.max_batch, self.cuda_graph = device_id, max_batch, cuda_graph
        self.bindings: dict[tuple[int, int, int], object] = {}
        self.graphs: dict[tuple[int, int, int], object] = {}
        self.run_options = ort.RunOptions()
        # return once the run is queued on our stream, without waiting for the GPU: the runtime
        # waits on its own event after the download, so the next batch is prepared meanwhile
        self.run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")

    def bucket(self, batch: int) -> int:
        return next(b for b in self.buckets if b >= batch)

    def bind(self, set_index: int, input_address: int, output_addresses: dict[str, int]) -> None:
        channels, height = self.input.sample_shape[:2]
        for (bucket, width), session in self.sessions.items():
            binding = session.io_binding()
            binding.bind_input(self.input.name, "cuda", self.device_id, np.float32,
                               [bucket, channels, height, width], input_address)
            for spec, shape in zip(self.outputs, self.output_shapes[width]):
                binding.bind_output(spec.name, "cuda", self.device_id, spec.dtype,
                                    [bucket, *shape], output_addresses[spec.name])
            self.bindings[(set_index, bucket, width)] = binding

    def run(self, set_index: int, batch: int, stream=None, width: int | None = None) -> None:
        key = (set_index, self.bucket(batch), width or self.widths[0])
        graph = self.graphs.get(key)
        if graph is not None:
            graph.launch(stream)
            return
        self.sessions[key[1:]].run_with_iobinding(self.bindings[key], self.run_options)

    @property
    def runs_on_any_stream(self) -> bool:
        """Whether run() goes on the stream it is given: its graphs do; a session without them runs on the
        stream it was made with."""
        return bool(self.graphs)

    def capture_graphs(self, stream) -> None:
        """Capture every bound (set, bucket) run (call after warm-up runs, with the stream idle)."""
        if not self.cuda_graph:
            return
        try:
            for key, binding in self.bindings.items():
                with CudaGraph.capture(stream) as graph:
                    self.sessions[key[1:]].run_with_iobinding(binding, self.run_options)
                self.graphs[key] = graph
        except Exception as exc:  # e.g. an op that synchronizes or allocates during the run
            log.warning("ONNX Runtime run cannot be captured in a CUDA graph (%s): running without graphs",
                        str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
            self._drop_graphs()
            self.cuda_graph = False
        stream.synchronize()

    def warm_batches(self) -> list[int]:
        return list(self.buckets)

    def _drop_graphs(self) -> None:
        for graph in self.graphs.values():
            graph.close()
        self.graphs.clear()

    def close(self) -> None:
        self._drop_graphs()
        self.bindings.clear()
        self.sessions.clear()
