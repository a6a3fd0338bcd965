"""Postprocessing registry: network outputs -> per-frame results in source pixels.

Vectorised with numpy and OpenCV: no Python loop over boxes on the hot path
(one loop over the frames of a batch). Each postprocessor but `raw` also names
the reduction the GPU runtime can run on the outputs in device memory
(`reduction()`), and finishes from its compact arrays (`reduced()`) with the
same code as its CPU path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.lazy import lazy_import
from jetpipe.runtime.api import Reduction
from jetpipe.runtime.postprocess_gpu import SUM_SCALE

cv2 = lazy_import("cv2")

log = logging.getLogger(__name__)


def _to_source(xyxy: np.ndarray, box, height: int, width: int) -> np.ndarray:
    """Network-input boxes -> source pixels through the letterbox, clipped to the frame."""
    pts = box.to_source(xyxy.reshape(-1, 2, 2)).reshape(-1, 4)
    pts[:, 0::2] = pts[:, 0::2].clip(0, width)
    pts[:, 1::2] = pts[:, 1::2].clip(0, height)
    return pts


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
        return {"boxes": np.round(_to_source(xyxy, box, *hw), 1).tolist(),
                "scores": np.round(score, 4).tolist()}


@dataclass
class Classification:
    top_k: int = 5

    def __call__(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        logits = next(iter(outputs.values())).reshape(len(letterboxes), -1).astype(np.float64)
        sums = logits.sum(axis=1, keepdims=True)
        is_prob = (logits.min() >= 0) and np.allclose(sums, 1.0, atol=1e-3)
        probs = logits if is_prob else np.exp(logits - logits.max(1, keepdims=True))
        probs = probs / probs.sum(1, keepdims=True)
        k = min(self.top_k, probs.shape[1])
        top = np.argsort(-probs, axis=1)[:, :k]
        return self._results(top, np.take_along_axis(probs, top, axis=1))

    def reduction(self, required: bool = False) -> Reduction:
        return Reduction("topk", {"k": self.top_k}, required)

    def reduced(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        """Finish from the GPU's top-k values and row statistics (max, min, sum, sum of exp(v - max))."""
        stats = outputs["stats"].astype(np.float64)
        values = outputs["top_value"].astype(np.float64)
        is_prob = (stats[:, 1].min() >= 0) and np.allclose(stats[:, 2], 1.0, atol=1e-3)
        probs = values / stats[:, 2:3] if is_prob else np.exp(values - stats[:, 0:1]) / stats[:, 3:4]
        return self._results(outputs["top_index"], probs)

    @staticmethod
    def _results(top: np.ndarray, scores: np.ndarray) -> list[dict]:
        return [{"classes": t.tolist(), "scores": np.round(s, 5).tolist()} for t, s in zip(top, scores)]


@dataclass
class YoloDetection:
    """YOLOv5 (B,N,5+C), YOLOv8 (B,4+C,N) and YOLOX (B,N,5+C, raw grid outputs) with class-aware NMS."""

    layout: str = "auto"            # yolov5 | yolov8 | yolox | auto (by shape)
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    input_hw: tuple[int, int] = (640, 640)
    strides: tuple[int, ...] = (8, 16, 32)
    max_detections: int = 300  # per frame, highest scores first (Ultralytics' max_det)

    def _layout(self, out: np.ndarray) -> str:
        if self.layout != "auto":
            return self.layout
        return "yolov8" if out.shape[1] < out.shape[2] else "yolov5"

    def decode(self, out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One image's output -> (xyxy in network pixels, score, class) before NMS."""
        layout = self._layout(out[None])
        if layout == "yolov8":
            pred = out.T
            xywh, cls = pred[:, :4], pred[:, 4:]
            conf = cls
        else:
            pred = out.astype(np.float64)
            if layout == "yolox":
                pred = pred.copy()
                grid, stride = self._grids(pred.shape[0])
                pred[:, :2] = (pred[:, :2] + grid) * stride
                pred[:, 2:4] = np.exp(pred[:, 2:4]) * stride
            xywh, obj, cls = pred[:, :4], pred[:, 4:5], pred[:, 5:]
            conf = obj * cls
        class_id = conf.argmax(axis=1)
        score = conf[np.arange(len(conf)), class_id]
        xyxy = np.concatenate([xywh[:, :2] - xywh[:, 2:4] / 2, xywh[:, :2] + xywh[:, 2:4] / 2], axis=1)
        return xyxy, score, class_id

    def _grids(self, n: int):
        h, w = self.input_hw
        grids, strides = [], []
        for s in self.strides:
            gy, gx = np.meshgrid(np.arange(h // s), np.arange(w // s), indexing="ij")
            grids.append(np.stack([gx.ravel(), gy.ravel()], 1))
            strides.append(np.full((gx.size, 1), s))
        grid, stride = np.concatenate(grids), np.concatenate(strides)
        if len(grid) != n:
            raise JetpipeError(f"YOLOX output has {n} anchors; strides {self.strides} at {h}x{w} "
                               f"give {len(grid)}")
        return grid, stride

    def __call__(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        out = next(iter(outputs.values()))
        results = []
        for pred, box, hw in zip(out, letterboxes, sizes):
            xyxy, score, cls = self.decode(pred)
            keep = score >= self.score_threshold
            xyxy, score, cls = xyxy[keep], score[keep], cls[keep]
            if len(score):
                xywh = np.concatenate([xyxy[:, :2], xyxy[:, 2:] - xyxy[:, :2]], axis=1)
                kept = cv2.dnn.NMSBoxesBatched(xywh.tolist(), score.tolist(), cls.tolist(),
                                               self.score_threshold, self.iou_threshold)
                kept = np.asarray(kept, dtype=np.int64).reshape(-1)[:self.max_detections]
                xyxy, score, cls = xyxy[kept], score[kept], cls[kept]
            results.append(self._result(xyxy, score, cls, box, hw))
        return results

    def reduction(self, required: bool = False) -> Reduction:
        return Reduction("yolo-nms", {"layout": self.layout, "score_threshold": self.score_threshold,
                                      "iou_threshold": self.iou_threshold, "limit": self.max_detections,
                                      "input_hw": tuple(self.input_hw), "strides": tuple(self.strides)}, required)

    def reduced(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        """Finish from the GPU's detections after NMS (counts [B], detections [B, limit, 6])."""
        results = []
        for count, found, box, hw in zip(outputs["counts"], outputs["detections"], letterboxes, sizes):
            d = found[:int(count)].astype(np.float64)
            results.append(self._result(d[:, :4], d[:, 4], d[:, 5].astype(np.int64), box, hw))
        return results

    @staticmethod
    def _result(xyxy, score, cls, box, hw) -> dict:
        return {"boxes": np.round(_to_source(xyxy, box, *hw), 1).tolist(),
                "scores": np.round(score, 4).tolist(), "classes": np.asarray(cls).tolist()}


class Raw:
    """Output tensors' shapes and a few statistics (the tensors stay on the device side)."""

    def reduction(self, required: bool = False) -> Reduction | None:
        return None

    def __call__(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        return [{name: {"shape": list(arr.shape[1:]), "mean": float(arr[i].mean()),
                        "max": float(arr[i].max())} for name, arr in outputs.items()}
                for i in range(len(letterboxes))]


POSTPROCESSORS = {"text-detection": TextDetection, "classification": Classification,
                  "detection-yolo": YoloDetection, "raw": Raw}


def make_postprocessor(task: str | None, input_hw=(640, 640)):
    task = task or "raw"
    if task not in POSTPROCESSORS:
        raise JetpipeError(f"task {task!r}: choose one of {', '.join(POSTPROCESSORS)}")
    if task == "detection-yolo":
        return YoloDetection(input_hw=tuple(input_hw))
    return POSTPROCESSORS[task]()
