"""text-detection: DB text detectors (PP-OCR det): a [N, 1, H, W] text probability map at the input's size.

Records: "boxes" (x0 y0 x1 y1, source pixels, reading order), "scores" (mean probability inside) and
"quads": each line's quadrilateral (four x, y corners: top-left, top-right, bottom-right, bottom-left along
the text), rotated with the line where it is tilted; a secondary stage cuts its crops along it.
GPU: the "components" reduction finds the regions on the device; only their boxes, areas, sums and pixel
moments come back.
Metric against FP32: box F1 of the postprocessed boxes (IoU 0.5), and the binarized map's F1 per sample.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from jetpipe.lazy import lazy_import
from jetpipe.runtime.api import Reduction
from jetpipe.runtime.postprocess_gpu import EXTENT_SCALE, SUM_SCALE
from jetpipe.tasks import agreement_metrics
from jetpipe.tasks.base import ModelFacts, Task, TaskOptions, identity_frames, known, single_output
from jetpipe.tasks.detections import Detections

cv2 = lazy_import("cv2")
log = logging.getLogger(__name__)

KEYS = ("boxes", "scores", "quads")  # the record's, in this order


@dataclass
class TextDetection:
    """DB text detection (PP-OCR): binarize, connected regions, unclip, map back.

    On the GPU runtime the regions are found on the device (Reduction "components") and only
    their boxes, areas and probability sums come back; both paths finish in `_boxes`."""

    threshold: float = 0.3
    box_threshold: float = 0.5
    unclip_ratio: float = 1.5  # PaddleOCR's default; smaller gives boxes closer to the ink
    min_area: int = 9
    max_components: int = 1000  # per frame, found on the GPU (PaddleOCR's max_candidates)
    # a line tilted less than this (degrees) keeps its axis-aligned box as its quadrilateral: the
    # bounding box measures a horizontal line exactly, the moments' rectangle only approximately
    upright_degrees: float = 5.0
    min_line_ratio: float = 1.5  # length / height below which a region keeps its upright box
    truncated_frames: int = field(default=0, init=False)  # GPU frames with more regions than that

    def __call__(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        return [found.to_results() for found in self.detections(outputs, letterboxes, sizes, pool)]

    def detections(self, outputs: dict, letterboxes, sizes, pool=None, reduced: bool = False) -> list[Detections]:
        """Each frame's lines as arrays (the pipelines' path: no per-line lists; the JSON's are made in the
        sinks); reduced: `outputs` are the GPU's components."""
        if reduced:
            return self._from_components(outputs, letterboxes, sizes)
        prob = next(iter(outputs.values()))
        jobs = list(zip(prob[:, 0], letterboxes, sizes))
        if pool is None or len(jobs) < 2:
            return [self.one(*job) for job in jobs]
        return list(pool.map(lambda job: self.one(*job), jobs))  # OpenCV releases the GIL

    def one(self, p: np.ndarray, box, hw) -> Detections:
        x, y, w, h, area, total, angle, extents = regions(p, self.threshold)
        return self._boxes(x, y, w, h, area, total / np.maximum(area, 1), angle, extents, box, hw)

    def reduction(self, required: bool = False) -> Reduction:
        return Reduction("components", {"threshold": self.threshold, "limit": self.max_components}, required)

    def reduced(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        """Finish from the GPU's components (counts [B], components [B, limit])."""
        return [found.to_results() for found in self._from_components(outputs, letterboxes, sizes)]

    def _from_components(self, outputs: dict, letterboxes, sizes) -> list[Detections]:
        """The batch's regions at once (one pass of array operations over every frame's, not one a frame)."""
        counts, found = np.asarray(outputs["counts"]), outputs["components"]
        limit = found.shape[1]
        for count in counts[counts > limit].tolist():
            self.truncated_frames += 1
            if self.truncated_frames in (1, 100) or self.truncated_frames % 10000 == 0:
                log.warning("text detection: a frame had %d regions, more than max_components %d "
                            "(%d such frames so far)", count, limit, self.truncated_frames)
        # every frame's first `count` rows in one step (concatenating structured arrays promotes their fields
        # frame by frame)
        taken = np.arange(limit) < counts[:, None]
        c = found[taken]
        frame = np.nonzero(taken)[0]
        area = c["area"].astype(np.float64)
        score = c["sum"] / SUM_SCALE / np.maximum(area, 1)
        extents = np.stack([c[k] for k in ("along_min", "along_max", "across_min", "across_max")], axis=1)
        # the direction the device measured the extents along (a region at +-45 degrees may fold either way)
        return self._frames_boxes(frame, c["x0"], c["y0"], c["x1"] - c["x0"] + 1, c["y1"] - c["y0"] + 1, area, score,
                                  c["angle"].astype(np.float64), extents / EXTENT_SCALE, letterboxes, sizes)

    def _boxes(self, x, y, w, h, area, score, angle, extents, box, hw) -> Detections:
        """One frame's regions (as _frames_boxes)."""
        return self._frames_boxes(np.zeros(len(x), np.int64), x, y, w, h, area, score, angle, extents, [box],
                                  [hw])[0]

    def _frames_boxes(self, frame, x, y, w, h, area, score, angle, extents, letterboxes, sizes) -> list[Detections]:
        """Regions of a batch's frames (left, top, width, height, area, mean probability, orientation, extents
        along and across it; `frame`: each one's) -> each frame's kept, unclipped boxes and quadrilaterals in
        source pixels, in reading order."""
        keep = (area >= self.min_area) & (score >= self.box_threshold)
        columns = (frame, x, y, w, h, area, score, angle, extents)
        frame, x, y, w, h, area, score, angle, extents = (v[keep] for v in columns)
        order = np.lexsort((area, w, h, x, y, frame))  # each frame's in reading order
        frame, x, y, w, h, area, score, angle, extents = (v[order] for v in (frame, x, y, w, h, area, score, angle,
                                                                              extents))
        # DB's unclip: grow by area * ratio / perimeter (the shrunk text kernel -> the word)
        d = (w * h * self.unclip_ratio) / (2.0 * (w + h))
        xyxy = np.stack([x - d, y - d, x + w + d, y + h + d], axis=1).astype(np.float64)
        quads = np.stack([xyxy[:, [0, 1]], xyxy[:, [2, 1]], xyxy[:, [2, 3]], xyxy[:, [0, 3]]], axis=1)
        tilted, quad = self._tilted_quads(angle, extents)
        quads[tilted] = quad
        xyxy[tilted] = np.concatenate([quad.min(axis=1), quad.max(axis=1)], axis=1)
        # to source pixels, each frame through its own letterbox; rounded as the JSON writes them, so that the
        # arrays and the record say the same
        pad = np.array([[b.pad_x, b.pad_y] for b in letterboxes], np.float64).reshape(-1, 2)[frame]
        scale = np.array([[b.scale_x, b.scale_y] for b in letterboxes], np.float64).reshape(-1, 2)[frame]
        limit = np.array([[w_, h_] for h_, w_ in sizes], np.float64).reshape(-1, 2)[frame]
        corners = (xyxy.reshape(-1, 2, 2) - pad[:, None]) / scale[:, None]
        corners = np.clip(corners, 0, limit[:, None]).reshape(-1, 4)
        boxes, scores = np.round(corners, 1), np.round(score, 4)
        quads = np.round((quads - pad[:, None]) / scale[:, None], 1).reshape(-1, 4, 2)
        ends = np.searchsorted(frame, np.arange(len(letterboxes) + 1))
        return [Detections(boxes[a:b], scores[a:b], data={"quads": quads[a:b]}, layout=KEYS)
                for a, b in zip(ends[:-1], ends[1:])]

    def _tilted_quads(self, angle, extents) -> tuple[np.ndarray, np.ndarray]:
        """The rectangle of each tilted region along its orientation, around its pixels (extents: the pixel
        centres' extremes along and across, each pixel half a pixel wide), unclipped like the boxes: the
        regions (indices) and their quadrilaterals. Upright regions (within upright_degrees) and squat ones
        (shorter than min_line_ratio heights) are left out."""
        rows = np.flatnonzero(np.abs(angle) > np.radians(self.upright_degrees))
        c, s = np.cos(angle[rows]), np.sin(angle[rows])
        half_pixel = 0.5 * (np.abs(c) + np.abs(s))
        a0, a1, b0, b1 = extents[rows].T
        length, height = a1 - a0 + 2 * half_pixel, b1 - b0 + 2 * half_pixel
        lines = ~(length < self.min_line_ratio * height)  # a short word's or a glyph's direction is noise
        rows, c, s, a0, a1, b0, b1, length, height = (v[lines] for v in (rows, c, s, a0, a1, b0, b1, length, height))
        d = length * height * self.unclip_ratio / (2.0 * (length + height))
        along, across = np.stack([c, s], axis=1), np.stack([-s, c], axis=1)  # across points down the page
        centre = along * (a0 + a1)[:, None] / 2 + across * (b0 + b1)[:, None] / 2
        half_l, half_h = along * (length / 2 + d)[:, None], across * (height / 2 + d)[:, None]
        return rows, np.stack([centre - half_l - half_h, centre + half_l - half_h,
                               centre + half_l + half_h, centre - half_l + half_h], axis=1)


def regions(p: np.ndarray, threshold: float) -> tuple:
    """One probability map's connected regions above threshold, as the GPU's components reduction measures them:
    left, top, width, height, area, probability sum, orientation (float32's, as the GPU stores it) and extents
    along and across it."""
    mask = (p > threshold).view(np.uint8)
    count, labels, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
    on = np.flatnonzero(mask)  # text pixels only (a few %): scoring is cheap
    area = stats[1:, cv2.CC_STAT_AREA].astype(np.float64)
    total = np.bincount(labels.ravel()[on], weights=p.ravel()[on], minlength=count)[1:]
    x, y, w, h = (stats[1:, i] for i in range(4))
    ys, xs = np.divmod(on, p.shape[1])
    owner = labels.ravel()[on]
    moments = np.stack([np.bincount(owner, weights=v.astype(np.float64), minlength=count)[1:]
                        for v in (xs, ys, xs * xs, ys * ys, xs * ys)], axis=1)
    angle = orientation(area, moments).astype(np.float32).astype(np.float64)
    return x, y, w, h, area, total, angle, _extents(xs, ys, owner, angle)


def orientation(area, moments) -> np.ndarray:
    """Each region's text direction from its pixel moments: the covariance's axis nearest horizontal, in
    radians folded into [-pi/4, pi/4) (the GPU's db_extents computes the same)."""
    n = np.maximum(area, 1.0)
    mx, my = moments[:, 0] / n, moments[:, 1] / n
    cxx, cyy = moments[:, 2] / n - mx * mx, moments[:, 3] / n - my * my
    cxy = moments[:, 4] / n - mx * my
    angle = (0.5 * np.arctan2(2.0 * cxy, cxx - cyy) + np.pi / 4) % (np.pi / 2) - np.pi / 4
    # a region at 45 degrees folds either way on rounding (the GPU fuses multiply-adds): both name it -45
    return np.where(angle > np.pi / 4 - 1e-6, angle - np.pi / 2, angle)


def _extents(xs, ys, owner, angle) -> np.ndarray:
    """[regions, 4]: the pixel centres' extremes along and across each region's orientation, in pixels,
    floored / ceiled to 1/16 as the GPU keeps them."""
    count = len(angle)
    extents = np.zeros((count, 4))
    if count == 0 or len(xs) == 0:
        return extents
    c, s = np.cos(angle)[owner - 1], np.sin(angle)[owner - 1]
    px, py = xs + 0.5, ys + 0.5
    along, across = np.floor((px * c + py * s) * EXTENT_SCALE), np.floor((py * c - px * s) * EXTENT_SCALE)
    along_up, across_up = np.ceil((px * c + py * s) * EXTENT_SCALE), np.ceil((py * c - px * s) * EXTENT_SCALE)
    extents[:, 0], extents[:, 2] = np.inf, np.inf
    extents[:, 1], extents[:, 3] = -np.inf, -np.inf
    np.minimum.at(extents[:, 0], owner - 1, along)
    np.maximum.at(extents[:, 1], owner - 1, along_up)
    np.minimum.at(extents[:, 2], owner - 1, across)
    np.maximum.at(extents[:, 3], owner - 1, across_up)
    return extents / EXTENT_SCALE


class TextDetectionTask(Task):
    name = "text-detection"
    boxes = True
    metrics = {"box_f1": ">=", "box_f1_min": ">=", "f1": ">=", "f1_min": ">="}
    check_bounds = {"box_f1": 0.95}
    summary = "DB text detectors (PP-OCR det): [N, 1, H, W] probability map -> word boxes"

    def mismatch(self, facts: ModelFacts) -> str | None:
        shape = single_output(facts, 4, "[N, 1, H, W] (a text probability map)")
        if isinstance(shape, str):
            return shape
        _, channels, h, w = shape
        if known(channels) and channels != 1:
            return f"expects a one-channel map [N, 1, H, W], found {facts.shapes()}"
        if any(known(d) and d != want for d, want in zip((h, w), facts.input_hw)):
            return (f"expects the map at the input's size {facts.input_hw[0]}x{facts.input_hw[1]}, "
                    f"found {facts.shapes()}")
        return None

    def postprocessor(self, options: TaskOptions) -> TextDetection:
        return TextDetection()

    def metric(self, reference: list, candidate: list, options: TaskOptions) -> dict:
        r, c = reference[0], candidate[0]
        post = self.postprocessor(options)
        boxes, sizes = identity_frames(len(r), options.input_hw)
        agreement = agreement_metrics.box_agreement(post({"y": r}, boxes, sizes), post({"y": c}, boxes, sizes))
        f1 = agreement_metrics.per_sample_f1(r, c)
        return {"box_f1": agreement["box_f1"], "box_f1_min": agreement["box_f1_min"],
                "f1": float(f1.mean()), "f1_min": float(f1.min()), "mae": agreement_metrics.mean_abs_error(r, c)}
