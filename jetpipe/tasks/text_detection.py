"""text-detection: DB text detectors (PP-OCR det): a [N, 1, H, W] text probability map at the input's size.

Records: "boxes" (x0 y0 x1 y1, source pixels, reading order) and "scores" (mean probability inside).
GPU: the "components" reduction finds the regions on the device; only their boxes, areas and sums come back.
Metric against FP32: box F1 of the postprocessed boxes (IoU 0.5), and the binarized map's F1 per sample.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from jetpipe.lazy import lazy_import
from jetpipe.runtime.api import Reduction
from jetpipe.runtime.postprocess_gpu import SUM_SCALE
from jetpipe.tasks import metrics
from jetpipe.tasks.base import ModelFacts, Task, TaskOptions, boxes_to_source, identity_frames, known, single_output

cv2 = lazy_import("cv2")
log = logging.getLogger(__name__)


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
    truncated_frames: int = field(default=0, init=False)  # GPU frames with more regions than that

    def __call__(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        prob = next(iter(outputs.values()))
        jobs = list(zip(prob[:, 0], letterboxes, sizes))
        if pool is None or len(jobs) < 2:
            return [self.one(*job) for job in jobs]
        return list(pool.map(lambda job: self.one(*job), jobs))  # OpenCV releases the GIL

    def one(self, p: np.ndarray, box, hw) -> dict:
        mask = (p > self.threshold).view(np.uint8)
        count, labels, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
        on = np.flatnonzero(mask)  # text pixels only (a few %): scoring is cheap
        area = stats[1:, cv2.CC_STAT_AREA].astype(np.float64)
        score = np.bincount(labels.ravel()[on], weights=p.ravel()[on], minlength=count)[1:] / np.maximum(area, 1)
        x, y, w, h = (stats[1:, i] for i in range(4))
        return self._boxes(x, y, w, h, area, score, box, hw)

    def reduction(self, required: bool = False) -> Reduction:
        return Reduction("components", {"threshold": self.threshold, "limit": self.max_components}, required)

    def reduced(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        """Finish from the GPU's components (counts [B], components [B, limit])."""
        results = []
        for count, found, box, hw in zip(outputs["counts"], outputs["components"], letterboxes, sizes):
            if count > len(found):
                self.truncated_frames += 1
                if self.truncated_frames in (1, 100) or self.truncated_frames % 10000 == 0:
                    log.warning("text detection: a frame had %d regions, more than max_components %d "
                                "(%d such frames so far)", count, len(found), self.truncated_frames)
            c = found[:min(int(count), len(found))]
            area = c["area"].astype(np.float64)
            score = c["sum"] / SUM_SCALE / np.maximum(area, 1)
            results.append(self._boxes(c["x0"], c["y0"], c["x1"] - c["x0"] + 1, c["y1"] - c["y0"] + 1, area, score,
                                       box, hw))
        return results

    def _boxes(self, x, y, w, h, area, score, box, hw) -> dict:
        """Regions (left, top, width, height, area, mean probability) -> kept, unclipped boxes in
        source pixels, in reading order (top, then left)."""
        keep = (area >= self.min_area) & (score >= self.box_threshold)
        x, y, w, h, area, score = x[keep], y[keep], w[keep], h[keep], area[keep], score[keep]
        order = np.lexsort((area, w, h, x, y))
        x, y, w, h, score = x[order], y[order], w[order], h[order], score[order]
        # DB's unclip: grow by area * ratio / perimeter (the shrunk text kernel -> the word)
        d = (w * h * self.unclip_ratio) / (2.0 * (w + h))
        xyxy = np.stack([x - d, y - d, x + w + d, y + h + d], axis=1).astype(np.float64)
        return {"boxes": np.round(boxes_to_source(xyxy, box, *hw), 1).tolist(),
                "scores": np.round(score, 4).tolist()}


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
        agreement = metrics.box_agreement(post({"y": r}, boxes, sizes), post({"y": c}, boxes, sizes))
        f1 = metrics.per_sample_f1(r, c)
        return {"box_f1": agreement["box_f1"], "box_f1_min": agreement["box_f1_min"],
                "f1": float(f1.mean()), "f1_min": float(f1.min()), "mae": metrics.mean_abs_error(r, c)}
