"""ONNX Runtime CPU sessions for the build step (reference runs, calibration)."""

from __future__ import annotations

import onnx


def cpu_session(model: onnx.ModelProto | str, optimize: bool = True, threads: int = 0,
                arena: bool = True):
    """A CPU session on an in-memory model (serialized once, no temp files).

    arena=False returns each run's memory to the system: for calibration runs
    that expose many activations, the arena would keep their peak forever.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.enable_cpu_mem_arena = arena
    if threads:
        options.intra_op_num_threads = threads
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
