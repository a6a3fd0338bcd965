"""One factory for every ONNX Runtime session jetpipe makes: build-step reference runs, calibration,
accuracy reports and the runtime's backends. Only here are providers and their options chosen."""

from __future__ import annotations

import os

import numpy as np

from jetpipe.errors import JetpipeError

PROVIDERS = ("cpu", "cuda")


def ort_session(model, provider: str = "cpu", *, optimize: bool = True, threads: int = 0, arena: bool = True,
                device_id: int = 0, stream=None, quiet: bool = False):
    """A session on a model (ModelProto, serialized once with no temp file, or a path).

    arena=False returns each run's memory to the system: for calibration runs that
    expose many activations, the arena would keep their peak forever.
    provider "cuda": FP32 stays FP32 (TF32 off: it would move results by ~1e-3);
    `stream` makes ORT run on the caller's CUDA stream. quiet: runs expected to fail (probes) log
    nothing; the caller turns the exception into its own message."""
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
    providers: list = ["CPUExecutionProvider"]
    if provider == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise JetpipeError("onnxruntime has no CUDA execution provider: pip install onnxruntime-gpu")
        cuda = {"device_id": str(device_id), "use_tf32": "0"}
        if stream is not None:
            cuda["user_compute_stream"] = str(int(stream.handle))
        providers = [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]
    source = model.SerializeToString() if hasattr(model, "SerializeToString") else os.fspath(model)
    return ort.InferenceSession(source, options, providers=providers)


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
