"""Accuracy metrics of a processed model against its FP32 reference."""

from __future__ import annotations

import re

import numpy as np

from jetpipe.errors import JetpipeError


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


def topk_agreement(reference: np.ndarray, candidate: np.ndarray, k: int) -> float:
    """Share of samples whose reference top-1 class is in the candidate's top-k."""
    ref_top1 = reference.reshape(len(reference), -1).argmax(axis=1)
    cand_topk = np.argsort(-candidate.reshape(len(candidate), -1), axis=1)[:, :k]
    return float(np.mean([r in c for r, c in zip(ref_top1, cand_topk)]))


def _iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    tl = np.maximum(a[:, None, :2], b[None, :, :2])
    br = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(br - tl, 0, None), axis=2)
    area = lambda x: np.prod(x[:, 2:] - x[:, :2], axis=1)  # noqa: E731
    return inter / np.maximum(area(a)[:, None] + area(b)[None, :] - inter, 1e-12)


def detection_map(reference: list[dict], candidate: list[dict], iou: float = 0.5) -> float:
    """mAP@iou of candidate detections with the reference's detections as ground truth (VOC-style
    all-point AP per class, averaged over classes present in the reference)."""
    classes = sorted({c for r in reference for c in r.get("classes", [0] * len(r["boxes"]))})
    aps = []
    for cls in classes:
        scored, total = [], 0
        for ref, cand in zip(reference, candidate):
            rc = np.array(ref.get("classes", [0] * len(ref["boxes"])))
            cc = np.array(cand.get("classes", [0] * len(cand["boxes"])))
            gt = np.array(ref["boxes"], np.float64).reshape(-1, 4)[rc == cls] if len(rc) else np.zeros((0, 4))
            det = np.array(cand["boxes"], np.float64).reshape(-1, 4)[cc == cls] if len(cc) else np.zeros((0, 4))
            scores = np.array(cand["scores"], np.float64)[cc == cls] if len(cc) else np.zeros(0)
            total += len(gt)
            order = np.argsort(-scores)
            used = np.zeros(len(gt), bool)
            ious = _iou_matrix(det[order], gt) if len(gt) and len(det) else np.zeros((len(det), 0))
            for row, score in zip(ious, scores[order]):
                j = int(row.argmax()) if row.size else -1
                hit = j >= 0 and row[j] >= iou and not used[j]
                if hit:
                    used[j] = True
                scored.append((score, hit))
        if total == 0:
            continue
        scored.sort(key=lambda t: -t[0])
        hits = np.array([h for _, h in scored], bool)
        tp, fp = np.cumsum(hits), np.cumsum(~hits)
        recall = np.concatenate([[0], tp / total])
        precision = np.concatenate([[1], tp / np.maximum(tp + fp, 1)])
        precision = np.maximum.accumulate(precision[::-1])[::-1]
        aps.append(float(np.sum(np.diff(recall) * precision[1:])))
    return float(np.mean(aps)) if aps else 1.0


_BUDGET = re.compile(r"^\s*([a-z0-9_]+)\s*(>=|<=)\s*([-+0-9.eE]+)\s*$")
BUDGET_METRICS = {"f1": ">=", "f1_min": ">=", "top1": ">=", "top5": ">=", "top1_drop": "<=", "map": ">=",
                  "mae": "<=", "cosine": ">=", "snr_db": ">="}


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


def meets(value: float, op: str, bound: float) -> bool:
    return value >= bound if op == ">=" else value <= bound
