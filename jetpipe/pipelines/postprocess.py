"""Postprocessing registry: network outputs -> per-frame results in source pixels.

Vectorised with numpy and OpenCV: no Python loop over boxes on the hot path
(one loop over the frames of a batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jetpipe.errors import JetpipeError


def _to_source(xyxy: np.ndarray, box, height: int, width: int) -> np.ndarray:
    """Network-input boxes -> source pixels through the letterbox, clipped to the frame."""
    pts = box.to_source(xyxy.reshape(-1, 2, 2)).reshape(-1, 4)
    pts[:, 0::2] = pts[:, 0::2].clip(0, width)
    pts[:, 1::2] = pts[:, 1::2].clip(0, height)
    return pts


@dataclass
class TextDetection:
    """DB text detection (PP-OCR): binarize, connected regions, unclip, map back."""

    threshold: float = 0.3
    box_threshold: float = 0.5
    unclip_ratio: float = 1.5  # PaddleOCR's default; smaller gives boxes closer to the ink
    min_area: int = 9

    def __call__(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        prob = next(iter(outputs.values()))
        jobs = list(zip(prob[:, 0], letterboxes, sizes))
        if pool is None or len(jobs) < 2:
            return [self.one(*job) for job in jobs]
        return list(pool.map(lambda job: self.one(*job), jobs))  # OpenCV releases the GIL

    def one(self, p: np.ndarray, box, hw) -> dict:
        import cv2

        mask = (p > self.threshold).view(np.uint8)
        count, labels, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
        on = np.flatnonzero(mask)  # text pixels only (a few %): scoring is cheap
        area = stats[1:, cv2.CC_STAT_AREA].astype(np.float64)
        score = np.bincount(labels.ravel()[on], weights=p.ravel()[on], minlength=count)[1:] / np.maximum(area, 1)
        keep = (area >= self.min_area) & (score >= self.box_threshold)
        x, y = stats[1:, 0][keep], stats[1:, 1][keep]
        bw, bh = stats[1:, 2][keep], stats[1:, 3][keep]
        # DB's unclip: grow by area * ratio / perimeter (the shrunk text kernel -> the word)
        d = (bw * bh * self.unclip_ratio) / (2.0 * (bw + bh))
        xyxy = np.stack([x - d, y - d, x + bw + d, y + bh + d], axis=1).astype(np.float64)
        return {"boxes": np.round(_to_source(xyxy, box, *hw), 1).tolist(),
                "scores": np.round(score[keep], 4).tolist()}


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
        scores = np.take_along_axis(probs, top, axis=1)
        return [{"classes": t.tolist(), "scores": np.round(s, 5).tolist()} for t, s in zip(top, scores)]


@dataclass
class YoloDetection:
    """YOLOv5 (B,N,5+C), YOLOv8 (B,4+C,N) and YOLOX (B,N,5+C, raw grid outputs) with class-aware NMS."""

    layout: str = "auto"            # yolov5 | yolov8 | yolox | auto (by shape)
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    input_hw: tuple[int, int] = (640, 640)
    strides: tuple[int, ...] = (8, 16, 32)

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
        import cv2

        out = next(iter(outputs.values()))
        results = []
        for pred, box, (h, w) in zip(out, letterboxes, sizes):
            xyxy, score, cls = self.decode(pred)
            keep = score >= self.score_threshold
            xyxy, score, cls = xyxy[keep], score[keep], cls[keep]
            if len(score):
                xywh = np.concatenate([xyxy[:, :2], xyxy[:, 2:] - xyxy[:, :2]], axis=1)
                kept = cv2.dnn.NMSBoxesBatched(xywh.tolist(), score.tolist(), cls.tolist(),
                                               self.score_threshold, self.iou_threshold)
                kept = np.asarray(kept, dtype=np.int64).reshape(-1)
                xyxy, score, cls = xyxy[kept], score[kept], cls[kept]
            results.append({"boxes": np.round(_to_source(xyxy, box, h, w), 1).tolist(),
                            "scores": np.round(score, 4).tolist(), "classes": cls.tolist()})
        return results


class Raw:
    """Output tensors' shapes and a few statistics (the tensors stay on the device side)."""

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
