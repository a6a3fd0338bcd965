"""Agreement metrics the tasks report: a model's results against its FP32 reference's, sample by sample."""

from __future__ import annotations

import numpy as np


def meets(value: float, op: str, bound: float) -> bool:
    """Whether a metric's value is within its bound (op: ">=" or "<=", as the task's metrics say)."""
    return value >= bound if op == ">=" else value <= bound


def binary_f1(reference: np.ndarray, candidate: np.ndarray, threshold: float = 0.3) -> float:
    """F1 of the candidate's binarized map against the reference's (1.0 when both are empty)."""
    ref, cand = reference > threshold, candidate > threshold
    total = int(ref.sum()) + int(cand.sum())
    if total == 0:
        return 1.0
    return 2.0 * int(np.logical_and(ref, cand).sum()) / total


def per_sample_f1(reference: np.ndarray, candidate: np.ndarray, threshold: float = 0.3) -> np.ndarray:
    return np.array([binary_f1(r, c, threshold) for r, c in zip(reference, candidate)])


def relative_mae(reference: list[np.ndarray], candidate: list[np.ndarray]) -> float:
    """Mean absolute error over all outputs, relative to the reference's mean magnitude."""
    num = sum(float(np.abs(r - c).mean()) for r, c in zip(reference, candidate))
    den = sum(float(np.abs(r).mean()) for r in reference)
    return num / max(den, 1e-12)


def mean_abs_error(reference: np.ndarray, candidate: np.ndarray) -> float:
    return float(np.abs(reference.astype(np.float64) - candidate).mean())


def topk_agreement(reference: np.ndarray, candidate: np.ndarray, k: int) -> float:
    """Share of samples whose reference top-1 class is in the candidate's top-k."""
    ref_top1 = reference.reshape(len(reference), -1).argmax(axis=1)
    cand_topk = np.argsort(-candidate.reshape(len(candidate), -1), axis=1)[:, :k]
    return float(np.mean([r in c for r, c in zip(ref_top1, cand_topk)]))


def intersection_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise intersection areas of xyxy boxes: (len(a), len(b))."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    return np.prod(np.clip(hi - lo, 0, None), axis=2)


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of xyxy boxes: (len(a), len(b))."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    inter = intersection_matrix(a, b)
    area_a, area_b = np.prod(a[:, 2:] - a[:, :2], axis=1), np.prod(b[:, 2:] - b[:, :2], axis=1)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-12)


def greedy_match(iou: np.ndarray, threshold: float) -> list[tuple[int, int]]:
    """(row, column) pairs, best IoU first, each row and column used once, IoU >= threshold."""
    pairs = []
    if iou.size == 0:
        return pairs
    order = np.dstack(np.unravel_index(np.argsort(-iou, axis=None), iou.shape))[0]
    rows, cols = set(), set()
    for r, c in order:
        if iou[r, c] < threshold:
            break
        if r not in rows and c not in cols:
            pairs.append((int(r), int(c)))
            rows.add(r)
            cols.add(c)
    return pairs


def match_boxes(predicted, truth, threshold: float = 0.5, same=None) -> list[tuple[int, int]]:
    """One-to-one matches (predicted index, truth index), highest IoU first, at IoU >= threshold;
    `same` (a bool matrix) restricts the pairs that may match (e.g. the same class)."""
    overlap = iou_matrix(predicted, truth)
    return greedy_match(np.where(same, overlap, 0.0) if same is not None else overlap, threshold)


def box_agreement(reference: list[dict], candidate: list[dict], iou: float = 0.5) -> dict:
    """Boxes of the candidate's records against the reference's, one-to-one at IoU >= iou and the same class
    where records carry classes: F1 over all samples, the lowest sample's F1, and the mean |score
    difference| of matched boxes (a collapse of confidences shows there, not in the boxes)."""
    matched = total_ref = total_cand = 0
    per_sample, score_diffs = [], []
    for ref, cand in zip(reference, candidate):
        rb = np.asarray(ref["boxes"], np.float64).reshape(-1, 4)
        cb = np.asarray(cand["boxes"], np.float64).reshape(-1, 4)
        same = None
        if "classes" in ref and "classes" in cand:
            same = np.asarray(cand["classes"])[:, None] == np.asarray(ref["classes"])[None, :]
        pairs = match_boxes(cb, rb, iou, same) if len(rb) and len(cb) else []
        matched, total_ref, total_cand = matched + len(pairs), total_ref + len(rb), total_cand + len(cb)
        per_sample.append(2 * len(pairs) / (len(rb) + len(cb)) if len(rb) + len(cb) else 1.0)
        score_diffs += [abs(cand["scores"][i] - ref["scores"][j]) for i, j in pairs]
    total = total_ref + total_cand
    return {"box_f1": 2 * matched / total if total else 1.0, "box_f1_min": min(per_sample, default=1.0),
            "score_mae": float(np.mean(score_diffs)) if score_diffs else 0.0,
            "boxes_fp32": total_ref, "boxes": total_cand}


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
            ious = iou_matrix(det[order], gt) if len(gt) and len(det) else np.zeros((len(det), 0))
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


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions), one row at a time."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ca != cb))
    return row[-1]


def text_agreement(reference: list[str], candidate: list[str]) -> dict:
    """Strings read against the reference's: the share read exactly alike, and the character error rate
    (edit distance over the reference's characters, all lines together)."""
    exact = [r == c for r, c in zip(reference, candidate)]
    errors = sum(edit_distance(r, c) for r, c in zip(reference, candidate))
    chars = sum(len(r) for r in reference)
    return {"exact": float(np.mean(exact)) if exact else 1.0,
            "cer": errors / chars if chars else float(sum(len(c) for c in candidate) > 0),
            "lines": len(exact)}


def matched_objects(reference: list[dict], candidate: list[dict], iou: float = 0.5) -> tuple[list, int]:
    """Every pair of boxes matched one-to-one (same class, IoU >= iou) as (reference record, candidate record,
    reference index, candidate index), and how many objects the reference has: what the per-object metrics
    (keypoints, masks) compare."""
    pairs, objects = [], 0
    for ref, cand in zip(reference, candidate):
        rb, cb = (np.asarray(r["boxes"], np.float64).reshape(-1, 4) for r in (ref, cand))
        objects += len(rb)
        if len(rb) and len(cb):
            same = np.asarray(cand["classes"])[:, None] == np.asarray(ref["classes"])[None, :]
            pairs += [(ref, cand, j, i) for i, j in match_boxes(cb, rb, iou, same)]
    return pairs, objects


# COCO's per-keypoint sigmas (nose, eyes, ears, shoulders, elbows, wrists, hips, knees, ankles)
COCO_SIGMAS = np.array([.26, .25, .25, .35, .35, .79, .79, .72, .72, .62, .62, 1.07, 1.07, .87, .87, .89, .89]) / 10


def keypoint_similarity(reference: list[dict], candidate: list[dict], iou: float = 0.5) -> float:
    """Mean object keypoint similarity (OKS, as Ultralytics computes it: the object's area taken as 0.53 of
    its box's) of the candidate's keypoints against the reference's, over boxes matched one-to-one (same class,
    IoU >= iou); keypoints the reference sees (visibility >= 0.5, or all where there is none) count. COCO's
    sigmas for 17 points, 1/K otherwise. No reference objects: 1.0; none matched: 0.0."""
    pairs, objects = matched_objects(reference, candidate, iou)
    similarities = []
    for ref, cand, j, i in pairs:
        r, c = np.asarray(ref["keypoints"][j], np.float64), np.asarray(cand["keypoints"][i], np.float64)
        sigmas = COCO_SIGMAS if len(r) == len(COCO_SIGMAS) else np.full(len(r), 1.0 / len(r))
        x0, y0, x1, y1 = ref["boxes"][j]
        area = 0.53 * (x1 - x0) * (y1 - y0)
        seen = r[:, 2] >= 0.5 if r.shape[1] > 2 else np.ones(len(r), bool)
        if not seen.any():
            continue
        d2 = np.square(r[:, :2] - c[:, :2]).sum(axis=1)
        similarities.append(float(np.exp(-d2 / ((2 * sigmas) ** 2 * (area + 1e-9) * 2))[seen].mean()))
    if not similarities:
        return 1.0 if objects == 0 else 0.0
    return float(np.mean(similarities))
