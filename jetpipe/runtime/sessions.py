"""One factory for every ONNX Runtime session jetpipe makes: build-step reference runs, calibration,
accuracy reports and the runtime's backends. Only here are providers and their options chosen."""

from __future__ import annotations

import logging
import os

import numpy as np

from jetpipe.errors import JetpipeError

log = logging.getLogger(__name__)

PROVIDERS = ("cpu", "cuda")
_said_basic = False  # the partial optimization is said once a process


def ort_session(model, provider: str = "cpu", *, optimize: bool = True, threads: int = 0, arena: bool = True,
                device_id: int = 0, stream=None, quiet: bool = False, spin: bool = True, cuda_options=None):
    """A session on a model (ModelProto, serialized once with no temp file, or a path).

    arena=False returns each run's memory to the system: for calibration runs that
    expose many activations, the arena would keep their peak forever.
    provider "cuda": FP32 stays FP32 (TF32 off: it would move results by ~1e-3);
    `stream` makes ORT run on the caller's CUDA stream. quiet: runs expected to fail (probes) log
    nothing; the caller turns the exception into its own message. spin=False: the intra-op threads sleep
    between a run's parallel sections instead of spinning, for sessions that run beside other busy threads.
    cuda_options: more CUDA provider options (name -> value)."""
    import onnxruntime as ort

    if provider not in PROVIDERS:
        raise JetpipeError(f"ONNX Runtime provider {provider!r}: choose one of {', '.join(PROVIDERS)}")
    options = ort.SessionOptions()
    options.log_severity_level = 4 if quiet else 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.enable_cpu_mem_arena = arena
    if threads:
        options.intra_op_num_threads = threads
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    providers: list = ["CPUExecutionProvider"]
    if provider == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise JetpipeError("onnxruntime has no CUDA execution provider: pip install onnxruntime-gpu")
        cuda = {"device_id": str(device_id), "use_tf32": "0", **{k: str(v) for k, v in (cuda_options or {}).items()}}
        if stream is not None:
            cuda["user_compute_stream"] = str(int(stream.handle))
        providers = [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]
    source = model.SerializeToString() if hasattr(model, "SerializeToString") else os.fspath(model)
    try:
        return ort.InferenceSession(source, options, providers=providers)
    except Exception as exc:
        if not optimize:
            raise
        return _with_basic_optimizations(ort, source, options, providers, exc)


def _with_basic_optimizations(ort, source, options, providers, failure: Exception):
    """Some ONNX Runtime versions' own graph rewrites fail on models they load (1.23.2, the newest for Python
    3.10, i.e. a Jetson's: its layer-norm fusion on an FP16 recognizer, "Attempting to get index by a name
    which does not exist"). The same graph with the basic rewrites only runs; anything else fails as it did."""
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    try:
        session = ort.InferenceSession(source, options, providers=providers)
    except Exception:
        raise failure from None
    global _said_basic
    if not _said_basic:
        _said_basic = True
        first = next((line for line in str(failure).splitlines() if line.strip()), type(failure).__name__)
        log.warning("ONNX Runtime %s failed to optimize a model fully (%s); it runs with its basic graph "
                    "optimizations instead", ort.__version__, first[:300])
    return session


def run_in_batches(session, inputs, batch: int = 4, names=None) -> list:
    """session.run over `inputs` a few rows at a time, each output concatenated along axis 0.

    Never more rows per run than a model with a fixed batch takes (a batch-1 export runs one at a time)."""
    meta = session.get_inputs()[0]
    fixed = meta.shape[0] if meta.shape else None
    if isinstance(fixed, int) and fixed > 0:
        batch = min(batch, fixed)
    parts = [session.run(names, {meta.name: inputs[i:i + batch]}) for i in range(0, len(inputs), batch)]
    if len(parts) == 1:
        return parts[0]  # no copy: pruning's layer inputs of all samples come in one run (GBs)
    return [np.concatenate([p[k] for p in parts]) for k in range(len(parts[0]))]


def cpu_session(model, **options):
    """ort_session on the CPU (the reference every other result is compared with)."""
    return ort_session(model, "cpu", **options)
