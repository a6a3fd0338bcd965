"""pose-yolo: YOLOv8/11-pose heads before NMS, [N, 4 + C + K*D, A] (C classes, K keypoints of D values).

K and D come from the export's `kpt_shape` metadata (Ultralytics writes "[17, 3]": COCO's 17 body points,
each x, y and a visibility already through its sigmoid); without it, 17 x 3 where the rows allow. Decoding
as detection-yolo's YOLOv8 layout (best class, score threshold, class-aware NMS), and each kept box's
keypoints carried with it. Records: detection-yolo's "boxes", "scores", "classes", "labels", and
"keypoints": per box, K rows of [x, y] in source pixels (+ visibility where D is 3). Sinks draw the skeleton
(COCO's limbs for 17 points, else the points alone). Metric against FP32: box F1, score MAE and mAP as
detectors, and "oks": the mean object keypoint similarity of matched boxes' keypoints (COCO's sigmas).
GPU: the "yolo-nms" reduction with the keypoint rows carried: NMS on the device, and only the kept boxes'
keypoints cross the bus (K x D floats a box), finished by the same code as the CPU path.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import numpy as np

from jetpipe.runtime.api import Reduction
from jetpipe.tasks.agreement_metrics import keypoint_similarity
from jetpipe.tasks.base import (
    DetectorTask,
    JoinedRows,
    ModelFacts,
    TaskOptions,
    known,
    single_output,
    ultralytics_misfit,
)
from jetpipe.tasks.detection_yolo import anchor_points, kept_detections, nms_yolov8
from jetpipe.tasks.detections import Detections

COCO_KEYPOINTS = (17, 3)
# COCO's skeleton (pairs of keypoint indices, 0-based): what sinks draw for 17-point models
COCO_LIMBS = ((15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7), (6, 8),
              (7, 9), (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6))
VISIBLE = 0.5  # a keypoint's visibility at which sinks draw it


def keypoint_shape(metadata: dict, rows, classes: int | None) -> tuple[int, int] | None:
    """(K, D) from the export's kpt_shape, else 17 x 3 where the head's rows leave room for it."""
    k, d = COCO_KEYPOINTS
    text = metadata.get("kpt_shape")
    if text:
        try:
            k, d = (int(v) for v in ast.literal_eval(str(text)))
        except (ValueError, SyntaxError, TypeError):
            return None
        if k <= 0 or d not in (2, 3):
            return None
    if not known(rows):
        return (k, d) if text else None
    left = rows - 4 - k * d  # the class rows
    return (k, d) if left >= 1 and (classes is None or left == classes) else None


@dataclass
class YoloPose:
    classes: int = 1
    keypoints: tuple[int, int] = COCO_KEYPOINTS
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    max_detections: int = 300
    labels: tuple[str, ...] | None = None

    def __call__(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        return [found.to_results() for found in self.detections(outputs, letterboxes, sizes, pool)]

    def detections(self, outputs: dict, letterboxes, sizes, pool=None, reduced: bool = False) -> list[Detections]:
        """Each frame's people and their keypoints as arrays (the record's lists are made in the sinks);
        reduced: `outputs` are the GPU's kept boxes and their carried keypoint rows."""
        if reduced:
            rows, xyxy, score, cls = kept_detections(outputs, len(letterboxes))
            return self._frames(rows, xyxy, score, cls, rows.take(outputs["carried"]), letterboxes, sizes)
        out = next(iter(outputs.values()))
        k, d = self.keypoints
        found = []
        for pred, _ in zip(out, letterboxes):
            rows, xyxy, score, cls = nms_yolov8(pred, self.classes, self.score_threshold, self.iou_threshold,
                                                self.max_detections)
            found.append((xyxy, score, cls, pred[4 + self.classes:4 + self.classes + k * d, rows].T))
        if not found:
            return []
        rows, (xyxy, score, cls, points) = JoinedRows.joined(found)
        return self._frames(rows, xyxy, score, cls, points, letterboxes, sizes)

    def reduced(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        """Finish from the GPU's kept boxes (counts [B], detections [B, limit, 6]) and their keypoint rows
        (carried [B, limit, K * D])."""
        return [found.to_results() for found in self.detections(outputs, letterboxes, sizes, reduced=True)]

    def _frames(self, rows: JoinedRows, xyxy, score, cls, points, letterboxes, sizes) -> list[Detections]:
        """A batch's frames from its kept boxes and their keypoint rows ([T, K * D]), joined frame after frame."""
        k, d = self.keypoints
        points = points.reshape(-1, k, d).astype(np.float64)
        points = np.concatenate([rows.to_source(points[..., :2], letterboxes, sizes), points[..., 2:]], axis=-1)
        return rows.box_detections(xyxy, score, cls, letterboxes, sizes, self.labels,
                                   {"keypoints": np.round(points, 3 if d > 2 else 1)})

    def reduction(self, required: bool = False) -> Reduction:
        k, d = self.keypoints
        return Reduction("yolo-nms", {"layout": "yolov8", "score_threshold": self.score_threshold,
                                      "iou_threshold": self.iou_threshold, "limit": self.max_detections,
                                      "extra_rows": k * d, "carry": True}, required)


class PoseYoloTask(DetectorTask):
    name = "pose-yolo"
    summary = "YOLOv8/11-pose heads [N, 4+C+K*D, A] -> boxes, classes, keypoints (x, y, visibility)"
    metrics = {**DetectorTask.metrics, "oks": ">="}
    check_bounds = {**DetectorTask.check_bounds, "oks": 0.9}

    def mismatch(self, facts: ModelFacts) -> str | None:
        said = ultralytics_misfit(facts, "pose", "a pose model")
        if said:
            return said
        what = "[N, 4 + C + K*D, A] (YOLO boxes with keypoints, before NMS)"
        shape = single_output(facts, 3, what)
        if isinstance(shape, str):
            return shape
        _, rows, anchors = shape
        if known(anchors) and anchors not in (anchor_points(facts.input_hw),):
            return (f"expects {anchor_points(facts.input_hw)} anchor columns at {facts.input_hw[0]}x"
                    f"{facts.input_hw[1]}, found {facts.shapes()}")
        classes = len(facts.labels) if facts.labels else None
        if keypoint_shape(facts.metadata, rows, classes) is None:
            return (f"expects {what} with K x D keypoint rows (kpt_shape in the export's metadata, or 17 x 3), "
                    f"found {facts.shapes()}")
        return None

    def recognizes(self, facts: ModelFacts) -> bool:
        """Only where the export says it is a pose model: a detector with 52 classes has 56 rows too."""
        return facts.metadata.get("task") == "pose" and self.mismatch(facts) is None

    def postprocessor(self, options: TaskOptions) -> YoloPose:
        return YoloPose(**_layout(options), labels=options.labels)

    def object_metrics(self, reference: list[dict], candidate: list[dict], options: TaskOptions) -> dict:
        return {"oks": keypoint_similarity(reference, candidate)}


def _layout(options: TaskOptions) -> dict:
    """Classes and (K, D) of a bundle's head: from its rows, the labels and the stored kpt_shape."""
    rows = options.outputs[0][1][1] if options.outputs and len(options.outputs[0][1]) == 3 else None
    classes = len(options.labels) if options.labels else None
    keypoints = keypoint_shape(options.metadata, rows, classes) or COCO_KEYPOINTS
    if classes is None:
        classes = rows - 4 - keypoints[0] * keypoints[1] if known(rows) else 1
    return {"classes": max(1, classes), "keypoints": keypoints}
