"""Running a model and its FP32 reference on the same inputs, and the task's agreement metrics.

Shared by the accuracy report and the precision search (which re-measures each candidate)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from jetpipe.calibration import comparison as m
from jetpipe.runtime.sessions import ort_session, run_in_batches
from jetpipe.tasks import Task, TaskOptions


@dataclass
class Context:
    """Everything the comparison, the localisation and the search share."""

    manifest: dict
    reference: onnx.ModelProto       # FP32, prepared like the bundle's base
    processed_path: str
    inputs: np.ndarray               # N,C,H,W float32 (identical for both models)
    input_name: str
    task: Task
    options: TaskOptions
    provider: str
    frames: list | None = None       # `--backend`: the samples as NV12 frames, what the runtime is fed
    _reference_outputs: list | None = None

    def reference_outputs(self) -> list[np.ndarray]:
        """FP32 outputs on the inputs, computed once (every search trial compares against them)."""
        if self._reference_outputs is None:
            self._reference_outputs = run_outputs(self.reference, self)
        return self._reference_outputs


def run_outputs(model, ctx: Context, batch: int = 4) -> list[np.ndarray]:
    return run_in_batches(ort_session(model, ctx.provider), ctx.inputs, batch)


def compare(ctx: Context, candidate=None, outputs: list[np.ndarray] | None = None) -> tuple[dict, dict]:
    """(per-output errors, task metrics) against FP32 of the bundle, a candidate model, or
    outputs already computed."""
    ref = ctx.reference_outputs()
    out = outputs if outputs is not None else \
        run_outputs(candidate if candidate is not None else ctx.processed_path, ctx)
    names = [o.name for o in ctx.reference.graph.output]
    per_output = {n: m.tensor_errors(a, b) for n, a, b in zip(names, ref, out)}
    tm = ctx.task.metric(ref, out, ctx.options)
    tm["cosine"] = min(v["cosine"] for v in per_output.values())
    tm["snr_db"] = min(v["snr_db"] for v in per_output.values())
    tm.setdefault("mae", float(np.mean([v["mean_abs"] for v in per_output.values()])))
    return per_output, tm
