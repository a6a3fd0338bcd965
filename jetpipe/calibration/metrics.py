"""Accuracy metrics of a processed model against its FP32 reference."""

from __future__ import annotations

import numpy as np


def binary_f1(reference: np.ndarray, candidate: np.ndarray, threshold: float = 0.3) -> float:
    """F1 of the candidate's binarized map against the reference's (1.0 when both are empty)."""
    ref, cand = reference > threshold, candidate > threshold
    total = int(ref.sum()) + int(cand.sum())
    if total == 0:
        return 1.0
    return 2.0 * int(np.logical_and(ref, cand).sum()) / total


def per_sample_f1(reference: np.ndarray, candidate: np.ndarray, threshold: float = 0.3) -> np.ndarray:
    return np.array([binary_f1(r, c, threshold) for r, c in zip(reference, candidate)])


def mean_abs_error(reference: np.ndarray, candidate: np.ndarray) -> float:
    return float(np.abs(reference.astype(np.float64) - candidate).mean())
