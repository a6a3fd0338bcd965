"""detection-yolo: YOLO heads before NMS — YOLOv8/11 [N, 4+C, A], YOLOv5 [N, 3A, 5+C], YOLOX grids.

A = the anchor points of strides 8, 16 and 32 at the input size (8400 at 640x640). Records: "boxes" (x0 y0
x1 y1, source pixels), "scores", "classes", and "labels" where the bundle has class names (Ultralytics
exports carry them). GPU: the "yolo-nms" reduction (decode, score threshold, class-aware NMS on the
device). Metric against FP32: box F1 (same class, IoU 0.5), the score error of matched boxes, and mAP.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.lazy import lazy_import
from jetpipe.runtime.api import Reduction
from jetpipe.tasks.base import (
    DetectorTask,
    JoinedRows,
    ModelFacts,
    TaskOptions,
    known,
    labels_misfit,
)
from jetpipe.tasks.detections import Detections

cv2 = lazy_import("cv2")

STRIDES = (8, 16, 32)


def anchor_points(input_hw, strides=STRIDES) -> int:
    return sum((input_hw[0] // s) * (input_hw[1] // s) for s in strides)


def nms_yolov8(pred: np.ndarray, classes: int, score_threshold: float, iou_threshold: float,
               max_detections: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One image's YOLOv8-layout head [4 + classes + extra, A] -> the anchor columns kept (best first) and
    their xyxy (network pixels), score and class: best class, score threshold, class-aware NMS. The pose and
    segmentation heads carry their extra rows (keypoints, mask coefficients) along by those columns."""
    conf = pred[4:4 + classes].T
    cls = conf.argmax(axis=1)
    score = conf[np.arange(len(conf)), cls]
    columns = np.flatnonzero(score >= score_threshold)
    xywh = pred[:4, columns].T.astype(np.float64)
    xyxy = np.concatenate([xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2], axis=1)
    score, cls = score[columns].astype(np.float64), cls[columns]
    if len(columns):
        corner = np.concatenate([xyxy[:, :2], xyxy[:, 2:] - xyxy[:, :2]], axis=1)
        kept = cv2.dnn.NMSBoxesBatched(corner.tolist(), score.tolist(), cls.tolist(), score_threshold,
                                       iou_threshold)
        kept = np.asarray(kept, dtype=np.int64).reshape(-1)[:max_detections]
        columns, xyxy, score, cls = columns[kept], xyxy[kept], score[kept], cls[kept]
    return columns, xyxy, score, cls


def kept_detections(outputs: dict, frames: int) -> tuple[JoinedRows, np.ndarray, np.ndarray, np.ndarray]:
    """The yolo-nms reduction's kept rows (counts [B], detections [B, limit, 6]: x0 y0 x1 y1 score class) of a
    batch's first `frames` frames, joined: the rows, and their xyxy, score and class."""
    found = outputs["detections"]
    rows = JoinedRows.kept(outputs["counts"], frames, found.shape[1])
    d = rows.take(found).astype(np.float64)
    return rows, d[:, :4], d[:, 4], d[:, 5].astype(np.int64)


@dataclass
class YoloDetection:
    """YOLOv5 (B,N,5+C), YOLOv8 (B,4+C,N) and YOLOX (B,N,5+C, raw grid outputs) with class-aware NMS."""

    layout: str = "auto"            # yolov5 | yolov8 | yolox | auto (by shape)
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    input_hw: tuple[int, int] = (640, 640)
    strides: tuple[int, ...] = STRIDES
    max_detections: int = 300  # per frame, highest scores first (Ultralytics' max_det)
    labels: tuple[str, ...] | None = None

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
        return [found.to_results() for found in self.detections(outputs, letterboxes, sizes, pool)]

    def detections(self, outputs: dict, letterboxes, sizes, pool=None, reduced: bool = False) -> list[Detections]:
        """Each frame's boxes as arrays (the pipelines' path: the record's lists are made in the sinks);
        reduced: `outputs` are the GPU's detections after NMS."""
        if reduced:
            return self._frames(*kept_detections(outputs, len(letterboxes)), letterboxes, sizes)
        out = next(iter(outputs.values()))
        found = []
        for pred in out[:len(letterboxes)]:  # rows past the frames: a partial batch's padding
            xyxy, score, cls = self.decode(pred)
            keep = score >= self.score_threshold
            xyxy, score, cls = xyxy[keep], score[keep], cls[keep]
            if len(score):
                xywh = np.concatenate([xyxy[:, :2], xyxy[:, 2:] - xyxy[:, :2]], axis=1)
                kept = cv2.dnn.NMSBoxesBatched(xywh.tolist(), score.tolist(), cls.tolist(),
                                               self.score_threshold, self.iou_threshold)
                kept = np.asarray(kept, dtype=np.int64).reshape(-1)[:self.max_detections]
                xyxy, score, cls = xyxy[kept], score[kept], cls[kept]
            found.append((xyxy, score, cls))
        if not found:
            return []
        rows, (xyxy, score, cls) = JoinedRows.joined(found)
        return self._frames(rows, xyxy, score, cls, letterboxes, sizes)

    def reduction(self, required: bool = False) -> Reduction:
        return Reduction("yolo-nms", {"layout": self.layout, "score_threshold": self.score_threshold,
                                      "iou_threshold": self.iou_threshold, "limit": self.max_detections,
                                      "input_hw": tuple(self.input_hw), "strides": tuple(self.strides)}, required)

    def reduced(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        """Finish from the GPU's detections after NMS (counts [B], detections [B, limit, 6])."""
        return [found.to_results() for found in self.detections(outputs, letterboxes, sizes, reduced=True)]

    def _frames(self, rows: JoinedRows, xyxy, score, cls, letterboxes, sizes) -> list[Detections]:
        return rows.box_detections(xyxy, score, cls, letterboxes, sizes, self.labels)


def head_classes(shape, input_hw) -> int | None:
    """The classes of a head [N, 4 + C, A] (YOLOv8/11) or [N, A, 5 + C] (YOLOv5, YOLOX); None where the shape
    is neither (or dynamic)."""
    anchors = anchor_points(input_hw)
    _, a, b = shape
    if not (known(a) and known(b)):
        return None
    if b in (anchors, 3 * anchors) and a >= 5:  # YOLOv8/11: [N, 4 + C, A]
        return a - 4
    if a in (anchors, 3 * anchors) and b >= 6:  # YOLOv5 / YOLOX: [N, A, 5 + C]
        return b - 5
    return None


class YoloDetectionTask(DetectorTask):
    name = "detection-yolo"
    summary = "YOLOv5/v8/11/X heads before NMS -> boxes, classes (names from the export), NMS on the GPU"

    def mismatch(self, facts: ModelFacts) -> str | None:
        shape = self.detector_output(facts, "[N, 4+C, A] or [N, A, 5+C] (YOLO boxes before NMS)")
        if isinstance(shape, str):
            return shape
        if not (known(shape[1]) and known(shape[2])):
            return None  # a dynamic size: nothing to hold against it
        classes = head_classes(shape, facts.input_hw)
        if classes is not None:
            return labels_misfit(facts, classes)
        anchors = anchor_points(facts.input_hw)
        return (f"expects {anchors} (or {3 * anchors}) anchor rows for strides {STRIDES} at "
                f"{facts.input_hw[0]}x{facts.input_hw[1]}, found {facts.shapes()}")

    def recognizes(self, facts: ModelFacts) -> bool:
        shape = facts.outputs[0][1] if len(facts.outputs) == 1 else ()
        return self.mismatch(facts) is None and len(shape) == 3 and known(shape[1]) and known(shape[2])

    def class_count(self, options: TaskOptions) -> int | None:
        """The head's own: [N, 4 + C, A] (YOLOv8/11) or [N, A, 5 + C] (YOLOv5, YOLOX), or the names given."""
        if options.labels:
            return len(options.labels)
        shape = options.outputs[0][1] if len(options.outputs) == 1 else ()
        return head_classes(shape, options.input_hw) if len(shape) == 3 else None

    def postprocessor(self, options: TaskOptions) -> YoloDetection:
        return YoloDetection(input_hw=tuple(options.input_hw), labels=options.labels)
