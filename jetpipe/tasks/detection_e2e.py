"""detection-e2e: detectors without NMS, whose heads already give one box per object.

Two layouts, as the exports write them:
- `xyxy`: YOLOv10 / YOLO26 end-to-end exports, [N, K, 6] = x0 y0 x1 y1 (input pixels), score, class;
- `cxcywh`: RT-DETR-style [N, Q, 4 + C] = normalized cx cy w h and C class scores per query (probabilities,
  or logits, which get a sigmoid).
Decoding: best class per row, score threshold, the highest `max_detections`; no NMS. Records as
detection-yolo's: "boxes" (source pixels), "scores", "classes", "labels". The outputs are compact already
([N, 300, 6] is 7 KB a frame): the GPU runtime copies them as they are, no reduction runs. Metric against
FP32: box F1 (same class, IoU 0.5), score MAE of matched boxes, mAP.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jetpipe.tasks.base import (
    DetectorTask,
    ModelFacts,
    TaskOptions,
    boxes_to_source,
    known,
    labels_misfit,
    with_labels,
)
from jetpipe.tasks.detection_yolo import anchor_points

MAX_QUERIES = 10_000  # rows of an end-to-end head (300 in YOLOv10, RT-DETR, D-FINE)


def layout_of(shape, input_hw) -> str | None:
    """'xyxy' for [N, K, 6], 'cxcywh' for [N, Q, 4 + C]: rows that are not a YOLO head's anchor points."""
    _, rows, width = shape
    if not (known(rows) and known(width)) or rows > MAX_QUERIES or rows in (anchor_points(input_hw),
                                                                            3 * anchor_points(input_hw)):
        return None
    return "xyxy" if width == 6 else "cxcywh" if width >= 5 else None


@dataclass
class EndToEndDetection:
    layout: str = "auto"  # xyxy | cxcywh | auto: by the output's shape
    score_threshold: float = 0.25
    input_hw: tuple[int, int] = (640, 640)
    max_detections: int = 300
    labels: tuple[str, ...] | None = None

    def decode(self, rows: np.ndarray, layout: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One image's rows -> (xyxy in network pixels, score, class)."""
        rows = rows.astype(np.float64)
        if layout == "xyxy":
            return rows[:, :4], rows[:, 4], rows[:, 5].astype(np.int64)
        scores = rows[:, 4:]
        if scores.size and (scores.min() < 0 or scores.max() > 1):  # logits
            scores = 1.0 / (1.0 + np.exp(-scores))
        cls = scores.argmax(axis=1)
        h, w = self.input_hw
        cx, cy, bw, bh = rows[:, 0] * w, rows[:, 1] * h, rows[:, 2] * w, rows[:, 3] * h
        xyxy = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], axis=1)
        return xyxy, scores[np.arange(len(scores)), cls], cls

    def __call__(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        out = next(iter(outputs.values()))
        layout = self.layout if self.layout != "auto" else (layout_of(out.shape, self.input_hw) or "xyxy")
        results = []
        for rows, box, hw in zip(out, letterboxes, sizes):
            xyxy, score, cls = self.decode(rows, layout)
            keep = np.flatnonzero(score >= self.score_threshold)
            keep = keep[np.argsort(-score[keep], kind="stable")][:self.max_detections]
            results.append(with_labels({"boxes": np.round(boxes_to_source(xyxy[keep], box, *hw), 1).tolist(),
                                        "scores": np.round(score[keep], 4).tolist(),
                                        "classes": cls[keep].tolist()}, self.labels))
        return results

    def reduction(self, required: bool = False):
        return None  # the head's output is the compact result


class EndToEndDetectionTask(DetectorTask):
    name = "detection-e2e"
    summary = "NMS-free detectors: YOLOv10/YOLO26 [N, K, 6], RT-DETR [N, Q, 4+C] -> boxes, classes"

    def mismatch(self, facts: ModelFacts) -> str | None:
        shape = self.detector_output(facts, "[N, K, 6] (x0 y0 x1 y1 score class) or [N, Q, 4+C] (cx cy w h, scores)")
        if isinstance(shape, str):
            return shape
        layout = layout_of(shape, facts.input_hw)
        if layout is None:
            return (f"expects [N, K, 6] or [N, Q, 4+C] with K, Q up to {MAX_QUERIES} and not a YOLO head's "
                    f"{anchor_points(facts.input_hw)} anchor rows, found {facts.shapes()}")
        return labels_misfit(facts, None if layout == "xyxy" else shape[2] - 4)

    def recognizes(self, facts: ModelFacts) -> bool:
        """[N, K, 6] by its shape alone; [N, Q, 4+C] only where the model says it is a detector (a
        recognizer's [N, T, C] has that shape too)."""
        if self.mismatch(facts) is not None:
            return False
        return layout_of(facts.outputs[0][1], facts.input_hw) == "xyxy" or facts.metadata.get("task") == "detect"

    def postprocessor(self, options: TaskOptions) -> EndToEndDetection:
        return EndToEndDetection(input_hw=tuple(options.input_hw), labels=options.labels)
