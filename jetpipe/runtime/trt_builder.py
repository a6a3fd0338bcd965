"""TensorRT engine building (10.3 on Jetson, 11.x on desktops): thin and version-guarded.

Precision lives in the ONNX file (float16 tensors, Q/DQ nodes), so the network
is always built strongly typed: the one path that works on both 10.3 (opt-in
flag) and 11.x (always on; FP16/INT8 builder flags and calibrators removed).
Written from NVIDIA's documentation (see docs/tensorrt.md); it cannot run on
this project's machines, which have no TensorRT.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from jetpipe.bundle import atomic_write
from jetpipe.errors import EngineError
from jetpipe.runtime.probe import probe_gpu

log = logging.getLogger(__name__)


def import_tensorrt():
    """The tensorrt module, or None where it is not installed."""
    try:
        import tensorrt as trt
    except ImportError:
        return None
    return trt


@dataclass(frozen=True)
class BuildOptions:
    input_name: str
    input_chw: tuple[int, int, int]
    max_batch: int
    workspace_bytes: int | None = None
    timing_cache: Path | None = None
    sparse_weights: bool = False
    dla_core: int | None = None


def make_logger(trt):
    """A trt.ILogger that keeps warnings and errors for the exception message."""

    class CapturingLogger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.messages: list[str] = []

        def log(self, severity, msg):
            if severity <= trt.ILogger.Severity.WARNING:
                self.messages.append(str(msg))
                log.debug("tensorrt: %s", msg)

    return CapturingLogger()


def _network_flags(trt) -> int:
    flags = 0
    strongly_typed = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if strongly_typed is not None:  # value differs between 10.3 and 11.x: never a literal
        flags |= 1 << int(strongly_typed)
    explicit = getattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH", None)
    if explicit is not None and trt.__version__.startswith("10."):
        flags |= 1 << int(explicit)  # ignored on 10.x, removed on 11.x
    return flags


def build_engine(onnx_path: Path, out_path: Path, opts: BuildOptions) -> dict:
    """Build and write an engine (atomically); returns facts for the manifest."""
    trt = import_tensorrt()
    if trt is None:
        raise EngineError("TensorRT is not installed: install it (JetPack on Jetson, NVIDIA's "
                          "index on desktops) or convert with --engine never")
    logger = make_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(_network_flags(trt))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        raise EngineError("TensorRT could not parse the ONNX model: " + _parser_errors(parser))
    config = builder.create_builder_config()
    _configure(trt, builder, config, opts)
    cache = _load_timing_cache(config, opts.timing_cache)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        detail = "; ".join(logger.messages[-5:]) or "no message from TensorRT"
        raise EngineError(f"TensorRT engine build failed: {detail}")
    atomic_write(out_path, bytes(plan))
    if opts.timing_cache is not None:
        atomic_write(opts.timing_cache, bytes(config.get_timing_cache().serialize()))
    return {"tensorrt": trt.__version__, "compute_capability": _compute_capability(),
            "max_batch": opts.max_batch, "timing_cache_reused": cache,
            "sparse_weights": opts.sparse_weights, "dla_core": opts.dla_core}


def _parser_errors(parser) -> str:
    errors = []
    for i in range(parser.num_errors):
        err = parser.get_error(i)
        node = err.node_name() if hasattr(err, "node_name") else ""
        errors.append(f"{err.desc()}" + (f" (node {node})" if node else ""))
    return "; ".join(errors) or "no details"


def _configure(trt, builder, config, opts: BuildOptions) -> None:
    if opts.workspace_bytes:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, opts.workspace_bytes)
    profile = builder.create_optimization_profile()
    c, h, w = opts.input_chw
    opt_batch = max(1, opts.max_batch // 2)
    profile.set_shape(opts.input_name, (1, c, h, w), (opt_batch, c, h, w), (opts.max_batch, c, h, w))
    config.add_optimization_profile(profile)
    if opts.sparse_weights:
        config.set_flag(trt.BuilderFlag.SPARSE_WEIGHTS)
    if opts.dla_core is not None:
        if not trt.__version__.startswith("10."):
            raise EngineError("--dla needs TensorRT 10.x (JetPack 6); this is TensorRT " + trt.__version__)
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = opts.dla_core
        config.set_flag(trt.BuilderFlag.GPU_FALLBACK)


def _load_timing_cache(config, path: Path | None) -> bool:
    previous = path.read_bytes() if path is not None and path.is_file() else b""
    cache = config.create_timing_cache(previous)
    config.set_timing_cache(cache, ignore_mismatch=False)
    return bool(previous)


def _compute_capability() -> str | None:
    """sm of GPU 0 without creating a CUDA context; None (recorded as unknown) without PyCUDA or a GPU."""
    return probe_gpu().compute_capability
