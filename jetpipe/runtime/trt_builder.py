"""TensorRT engine building, one module for three families, version-guarded:
TensorRT 10.3 (JetPack 6), TensorRT 11.x (desktop) and TensorRT-RTX 1.x (RTX GPUs).

Precision lives in the ONNX file (float16 tensors, Q/DQ nodes), so the network
is always built strongly typed: the one path that works on 10.3 (opt-in flag),
11.x (always on; FP16/INT8 builder flags and calibrators removed) and
TensorRT-RTX (no precision flags at all). TensorRT-RTX also builds ahead of time
for named compute capabilities, without a GPU: that is how CI builds engines
(this project's machines cannot install TensorRT proper; see docs/tensorrt.md).
"""

from __future__ import annotations

import importlib
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jetpipe.bundle import atomic_write
from jetpipe.errors import EngineError
from jetpipe.runtime.probe import probe_gpu

log = logging.getLogger(__name__)


ENGINE_FAMILIES = ("auto", "tensorrt", "tensorrt-rtx")
_MODULES = {"tensorrt": ("tensorrt",), "tensorrt-rtx": ("tensorrt_rtx", "tensorrt_rtx_bindings")}
# compute capability -> TensorRT-RTX 1.7 target (its ComputeCapability): the GPUs its engines run on
RTX_TARGET_OF = {"7.5": "sm75", "8.0": "sm80", "8.6": "sm86", "8.9": "sm89", "12.0": "sm120", "12.1": "sm121"}
RTX_TARGETS = tuple(RTX_TARGET_OF.values())
RTX_DEFAULT_TARGETS = ("sm86", "sm89", "sm120")  # RTX 30, 40 and 50 series


def import_family(family: str):
    """The builder module of one family ("tensorrt" or "tensorrt-rtx"), or None where it is not installed."""
    for name in _MODULES[family]:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def import_tensorrt():
    """The tensorrt module (TensorRT proper), or None where it is not installed."""
    return import_family("tensorrt")


def resolve_family(requested: str) -> str | None:
    """The family that builds, or None where it is not installed. auto is TensorRT proper: a TensorRT-RTX
    engine, built ahead of time for other GPUs than this machine's, is built only when asked for."""
    family = "tensorrt" if requested == "auto" else requested
    return family if import_family(family) is not None else None


@dataclass(frozen=True)
class BuildOptions:
    input_name: str
    input_chw: tuple[int, int, int]
    max_batch: int
    workspace_bytes: int | None = None
    timing_cache: Path | None = None
    sparse_weights: bool = False
    dla_core: int | None = None
    family: str = "tensorrt"
    targets: tuple[str, ...] = ()  # TensorRT-RTX: compute capabilities to build for (ahead of time)
    width_range: tuple[int, int] | None = None  # a dynamic input width: (min, max); input_chw holds opt


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
    trt = import_family(opts.family)
    if trt is None:
        raise EngineError(f"{opts.family} is not installed: install it (TensorRT: JetPack on Jetson, NVIDIA's "
                          "index on desktops; TensorRT-RTX: pip install tensorrt-rtx-cu13-bindings "
                          "tensorrt-rtx-cu13-libs) or convert with --engine never")
    logger = make_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(_network_flags(trt))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        raise EngineError(f"{opts.family} could not parse the ONNX model: " + _parser_errors(parser))
    config = builder.create_builder_config()
    profile = _configure(trt, builder, config, opts)
    timing_cache = opts.timing_cache if opts.family == "tensorrt" else None
    if opts.timing_cache is not None and timing_cache is None:
        log.info("%s has no timing cache (its specialization happens on the device): --timing-cache unused",
                 opts.family)
    cache = _load_timing_cache(config, timing_cache) if opts.family == "tensorrt" else False
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        detail = "; ".join(logger.messages[-5:]) or "no message from the builder"
        raise EngineError(f"{opts.family} engine build failed: {detail}")
    atomic_write(out_path, bytes(plan))
    if timing_cache is not None:
        atomic_write(timing_cache, bytes(config.get_timing_cache().serialize()))
    rtx = opts.family == "tensorrt-rtx"
    return {"family": opts.family, "version": trt.__version__, "tensorrt": None if rtx else trt.__version__,
            "compute_capability": None if rtx else _compute_capability(), "targets": list(opts.targets),
            "max_batch": opts.max_batch, "timing_cache_reused": cache,
            "sparse_weights": opts.sparse_weights, "dla_core": opts.dla_core,
            "network": describe_network(trt, network, profile, opts.input_name)}


def describe_network(trt, network, profile, input_name: str) -> dict:
    """What the builder was given, for the manifest and tests: I/O, the optimization profile, and the
    layers by type and by output precision (the precision the strongly typed network asks for)."""
    def tensor(t) -> dict:
        return {"name": t.name, "dtype": _dtype_name(trt, t.dtype), "shape": list(t.shape)}

    layers = [network.get_layer(i) for i in range(network.num_layers)]
    outputs = Counter(_dtype_name(trt, layer.get_output(0).dtype) for layer in layers if layer.num_outputs)
    kinds = Counter(str(layer.type).rsplit(".", 1)[-1] for layer in layers)
    low, opt, high = profile.get_shape(input_name)
    return {"inputs": [tensor(network.get_input(i)) for i in range(network.num_inputs)],
            "outputs": [tensor(network.get_output(i)) for i in range(network.num_outputs)],
            "profile": {"min": list(low), "opt": list(opt), "max": list(high)},
            "layers": len(layers), "layer_types": dict(kinds), "layer_output_dtypes": dict(outputs)}


def _dtype_name(trt, dtype) -> str:
    """numpy's name for a TensorRT dtype (trt.nptype, as the backend uses), else the enum's (bf16, fp8...)."""
    try:
        return np.dtype(trt.nptype(dtype)).name
    except TypeError:
        return str(dtype).rsplit(".", 1)[-1].lower()


def _parser_errors(parser) -> str:
    errors = []
    for i in range(parser.num_errors):
        err = parser.get_error(i)
        node = err.node_name() if hasattr(err, "node_name") else ""
        errors.append(f"{err.desc()}" + (f" (node {node})" if node else ""))
    return "; ".join(errors) or "no details"


def _configure(trt, builder, config, opts: BuildOptions):
    """Builder settings; returns the optimization profile."""
    if opts.workspace_bytes:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, opts.workspace_bytes)
    profile = builder.create_optimization_profile()
    c, h, w = opts.input_chw
    low_w, high_w = opts.width_range or (w, w)
    opt_batch = max(1, opts.max_batch // 2)
    profile.set_shape(opts.input_name, (1, c, h, low_w), (opt_batch, c, h, w), (opts.max_batch, c, h, high_w))
    config.add_optimization_profile(profile)
    if opts.sparse_weights:
        config.set_flag(trt.BuilderFlag.SPARSE_WEIGHTS)
    if opts.targets:
        _set_targets(trt, config, opts)
    if opts.dla_core is not None:
        if opts.family != "tensorrt" or not trt.__version__.startswith("10."):
            raise EngineError(f"--dla needs TensorRT 10.x (JetPack 6); this is {opts.family} {trt.__version__}")
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = opts.dla_core
        config.set_flag(trt.BuilderFlag.GPU_FALLBACK)
    return profile


def _set_targets(trt, config, opts: BuildOptions) -> None:
    """TensorRT-RTX builds ahead of time for these compute capabilities (no GPU needed)."""
    if not hasattr(config, "set_compute_capability"):
        raise EngineError(f"target compute capabilities are a TensorRT-RTX setting; {opts.family} "
                          f"{trt.__version__} builds for the GPU it runs on")
    config.num_compute_capabilities = len(opts.targets)
    for index, target in enumerate(opts.targets):
        config.set_compute_capability(getattr(trt.ComputeCapability, target.upper()), index)


def _load_timing_cache(config, path: Path | None) -> bool:
    previous = path.read_bytes() if path is not None and path.is_file() else b""
    cache = config.create_timing_cache(previous)
    config.set_timing_cache(cache, ignore_mismatch=False)
    return bool(previous)


def _compute_capability() -> str | None:
    """sm of GPU 0 without creating a CUDA context; None (recorded as unknown) without PyCUDA or a GPU."""
    return probe_gpu().compute_capability
