"""Tensor errors of a processed model against its FP32 reference, and --budget expressions over the
metrics the tasks report (each task's own metrics live with it in jetpipe/tasks)."""

from __future__ import annotations

import re

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.tasks import budget_metrics


def tensor_errors(reference: np.ndarray, candidate: np.ndarray) -> dict:
    """Max/mean absolute and relative error, cosine similarity and SNR (dB) of one output."""
    ref = reference.astype(np.float64).ravel()
    diff = candidate.astype(np.float64).ravel() - ref
    scale = np.abs(ref).max() or 1.0
    rel = np.abs(diff) / np.maximum(np.abs(ref), 1e-6 * scale)
    signal, noise = float(np.sum(ref ** 2)), float(np.sum(diff ** 2))
    norm = float(np.linalg.norm(ref) * np.linalg.norm(candidate.astype(np.float64).ravel()))
    return {"max_abs": float(np.abs(diff).max()), "mean_abs": float(np.abs(diff).mean()),
            "max_rel": float(rel.max()), "mean_rel": float(rel.mean()),
            "cosine": float(np.dot(ref, candidate.astype(np.float64).ravel()) / norm) if norm else 1.0,
            "snr_db": float(10 * np.log10(signal / noise)) if noise > 0 else float("inf")}


_BUDGET = re.compile(r"^\s*([a-z0-9_]+)\s*(>=|<=)\s*([-+0-9.eE]+)\s*$")
COMMON_METRICS = {"mae": "<=", "cosine": ">=", "snr_db": ">="}  # what compare() reports for every task
BUDGET_METRICS = {**budget_metrics(), **COMMON_METRICS}


def parse_budget(text: str) -> tuple[str, str, float]:
    """'f1>=0.99' -> ('f1', '>=', 0.99), with an error listing what is allowed."""
    match = _BUDGET.match(text or "")
    allowed = ", ".join(f"{k}{v}X" for k, v in BUDGET_METRICS.items())
    if not match:
        raise JetpipeError(f"--budget {text!r}: write METRIC>=VALUE or METRIC<=VALUE, one of {allowed}")
    metric, op, value = match.group(1), match.group(2), float(match.group(3))
    if metric not in BUDGET_METRICS:
        raise JetpipeError(f"--budget metric {metric!r}: choose one of {allowed}")
    if op != BUDGET_METRICS[metric]:
        raise JetpipeError(f"--budget {text!r}: {metric} is bounded with {BUDGET_METRICS[metric]}")
    return metric, op, value

