"""Engine backends: TensorRT (10.3 and 11.x) and TensorRT-RTX (1.x, RTX GPUs), one class.

Neither can run on this project's machines (no TensorRT there; TensorRT-RTX engines
do not load on the H100/H200): the choice of backend (`engine_backend`) and the
checks made before deserializing (`check_engine_compatibility`) need neither and
are tested everywhere.
"""

from __future__ import annotations

import logging

import numpy as np

from jetpipe.errors import EngineError
from jetpipe.runtime.api import TensorSpec
from jetpipe.runtime.cuda_graph import CudaGraph
from jetpipe.runtime.trt_builder import RTX_TARGET_OF, import_family, make_logger

log = logging.getLogger(__name__)


def engine_family(engine: dict) -> str:
    return engine.get("family", "tensorrt")  # bundles written before TensorRT-RTX name no family


def engine_backend(engine: dict, requested: str, installed, compute_capability: str | None) -> tuple[str | None, str]:
    """The backend that can run this bundle's engine here, or (None, why not).

    requested: auto, tensorrt or tensorrt-rtx; installed(family) -> bool; compute_capability: "8.6"."""
    if not engine.get("built"):
        return None, f"the bundle has no engine ({engine.get('reason', 'none built')})"
    family = engine_family(engine)
    if requested not in ("auto", family):
        return None, f"its engine was built by {family}, not {requested}"
    if not installed(family):
        return None, f"{family} is not installed"
    if family == "tensorrt-rtx":
        target = RTX_TARGET_OF.get(compute_capability or "")
        if target is None:
            return None, (f"TensorRT-RTX engines do not run on compute capability {compute_capability} "
                          f"(RTX GPUs: {', '.join(RTX_TARGET_OF)})")
        if target not in engine.get("targets", []):
            return None, (f"the engine was built for {', '.join(engine.get('targets', []))}, not this GPU's "
                          f"{target}: convert again with --rtx-targets including {target}")
    return family, ""


def check_engine_compatibility(manifest: dict, trt_version: str, compute_capability: str,
                               bundle_path: str, family: str = "tensorrt") -> None:
    """Refuse a plan built for another TensorRT (family, version) or GPU before it can crash deserialization."""
    engine = manifest.get("engine") or {}
    rebuild = (f"rebuild it with `jetpipe convert {manifest['source']['path']} -o {bundle_path} --force "
               "--engine require`")
    if not engine.get("built"):
        reason = engine.get("reason", "none built")
        raise EngineError(f"bundle {bundle_path} has no TensorRT engine ({reason}): {rebuild} on this device, "
                          "or use backend onnxruntime")
    if engine_family(engine) != family:
        raise EngineError(f"bundle {bundle_path}: its engine was built by {engine_family(engine)}, which the "
                          f"{family} runtime cannot load: use backend onnxruntime-cuda")
    if family == "tensorrt-rtx":
        target = RTX_TARGET_OF.get(compute_capability)
        if engine.get("version") != trt_version or target not in engine.get("targets", []):
            raise EngineError(f"engine built with TensorRT-RTX {engine.get('version')} for "
                              f"{', '.join(engine.get('targets', []))} cannot load on TensorRT-RTX {trt_version} / "
                              f"compute capability {compute_capability}: {rebuild} --engine-family tensorrt-rtx")
        return
    built_trt, built_cc = engine.get("tensorrt"), engine.get("compute_capability")
    if built_trt != trt_version or (built_cc and built_cc != compute_capability):
        raise EngineError(
            f"engine built with TensorRT {built_trt} for sm {built_cc} cannot load on TensorRT "
            f"{trt_version} / sm {compute_capability}: rebuild it with `jetpipe convert "
            f"{manifest['source']['path']} -o {bundle_path} --force --engine require` on this device")


class TensorRTBackend:
    """Deserialized engine + one execution context, run with execute_async_v3 on our stream.
    family: tensorrt or tensorrt-rtx (the same runtime API)."""

    def __init__(self, plan: bytes, max_batch: int, use_cuda_graphs: bool = True, family: str = "tensorrt",
                 widths=None):
        trt = import_family(family)
        if trt is None:
            raise EngineError(f"{family} is not installed")
        self.name, self.trt = family, trt
        self.logger = make_logger(trt)
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(plan)
        if self.engine is None:
            detail = "; ".join(self.logger.messages[-3:]) or "no message"
            raise EngineError(f"{family} could not deserialize the engine: {detail}")
        self.context = self.engine.create_execution_context()
        self.max_batch, self.use_cuda_graphs = max_batch, use_cuda_graphs
        self.input, outputs = self._tensor_specs()
        # a width range's engine: its profile's max is the widest width, each width runs at its own shape
        self.widths = tuple(widths or (self.input.sample_shape[2],))
        specs = {w: self._resolve_outputs(outputs, w) for w in self.widths}
        self.output_shapes = {w: [spec.sample_shape for spec in specs[w]] for w in self.widths}
        self.outputs = specs[self.widths[-1]]  # buffers are sized for the widest
        self.addresses: dict[int, tuple[int, dict[str, int]]] = {}
        self.graphs: dict[tuple[int, int, int], object] = {}

    def _tensor_specs(self):
        trt, engine = self.trt, self.engine
        inputs, outputs = [], []
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
            shape = tuple(engine.get_tensor_shape(name))
            if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
                shape = tuple(engine.get_tensor_profile_shape(name, 0)[2])  # max of profile 0
                inputs.append(TensorSpec(name, dtype, shape[1:]))
            else:
                outputs.append((name, dtype, shape))
        if len(inputs) != 1:
            raise EngineError(f"engine has {len(inputs)} inputs; jetpipe feeds one image input")
        return inputs[0], outputs

    def _resolve_outputs(self, outputs, width: int) -> list[TensorSpec]:
        """Output per-sample shapes once the input shape is set at `width` (-1 axes resolved)."""
        self.context.set_input_shape(self.input.name, (1, *self.input.sample_shape[:2], width))
        return [TensorSpec(name, dtype, tuple(self.context.get_tensor_shape(name))[1:]) for name, dtype, _ in outputs]

    def bind(self, set_index: int, input_address: int, output_addresses: dict[str, int]) -> None:
        self.addresses[set_index] = (input_address, output_addresses)

    def _set(self, set_index: int, batch: int, width: int) -> None:
        input_address, output_addresses = self.addresses[set_index]
        ok = self.context.set_input_shape(self.input.name, (batch, *self.input.sample_shape[:2], width))
        ok &= self.context.set_tensor_address(self.input.name, input_address)
        for name, address in output_addresses.items():
            ok &= self.context.set_tensor_address(name, address)
        if not ok:
            raise EngineError(f"TensorRT rejected the shapes or addresses for batch {batch}")

    def run(self, set_index: int, batch: int, stream=None, width: int | None = None) -> None:
        key = (set_index, batch, width or self.widths[0])
        graph = self.graphs.get(key)
        if graph is not None:
            graph.launch(stream)
            return
        self._set(*key)
        if not self.context.execute_async_v3(stream.handle):
            raise EngineError("TensorRT execute_async_v3 failed")
        if self.use_cuda_graphs:
            self._capture(key, stream)

    runs_on_any_stream = True  # execute_async_v3 and graph launches take the stream they are given

    def warm_batches(self) -> list[int]:
        return list(range(1, self.max_batch + 1))  # an optimization profile, not buckets: every size

    def capture_graphs(self, stream) -> None:
        """Nothing to do at start-up: each shape is captured after its first (warm-up) run."""

    def _capture(self, key, stream) -> None:
        """After the first (warm-up) run of a shape, capture it; replays need no set-up."""

        stream.synchronize()
        try:
            with CudaGraph.capture(stream) as graph:
                self.context.execute_async_v3(stream.handle)
            self.graphs[key] = graph
        except Exception as exc:  # e.g. data-dependent shapes: run without graphs
            log.warning("TensorRT CUDA graph capture failed (%s): running without graphs", exc)
            self.use_cuda_graphs = False

    def close(self) -> None:
        for graph in self.graphs.values():
            graph.close()
        self.graphs.clear()
        self.context = self.engine = self.runtime = None
