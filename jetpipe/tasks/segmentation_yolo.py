"""segmentation-yolo: YOLOv8/11-seg heads, [N, 4 + C + M, A] boxes with M mask coefficients, and the
prototypes [N, M, H/4, W/4].

Decoding as detection-yolo's YOLOv8 layout (best class, score threshold, class-aware NMS); each kept object's
mask is coefficients x prototypes, sampled up to network pixels bilinearly (half-pixel centres, as
Ultralytics' upsampling), cut to its box and taken where the logit is above 0 (sigmoid above 0.5), as
Ultralytics' process_mask does. Records: detection-yolo's "boxes", "scores", "classes", "labels", and per
object its outline, "polygons" (the largest outer contour of its mask, [x, y] points in source pixels; []
where the mask is empty), and "mask_areas" (its mask's area in source pixels); never a full-resolution mask.
Sinks fill the outlines translucent. Metric against FP32: box F1, score MAE and mAP as detectors, and
"mask_iou": the mean IoU of matched objects' masks. GPU: no reduction yet: both outputs come to the host and
this CPU path finishes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from jetpipe.lazy import lazy_import
from jetpipe.tasks.base import (
    DetectorTask,
    ModelFacts,
    TaskOptions,
    boxes_to_source,
    known,
    labels_misfit,
    ultralytics_misfit,
    with_labels,
)
from jetpipe.tasks.detection_yolo import anchor_points, nms_yolov8
from jetpipe.tasks.metrics import matched_objects

cv2 = lazy_import("cv2")

PROTO_STRIDE = 4  # prototypes are a quarter of the input's size (Ultralytics' Proto module)


def split_outputs(shapes: list[tuple]) -> tuple[int, int] | None:
    """(index of the head, index of the prototypes) among two outputs: a [N, R, A] and a [N, M, h, w]."""
    ranks = [len(shape) for shape in shapes]
    if sorted(ranks) != [3, 4]:
        return None
    return ranks.index(3), ranks.index(4)


@dataclass
class YoloSegmentation:
    classes: int = 80
    coefficients: int = 32
    input_hw: tuple[int, int] = (640, 640)
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    max_detections: int = 300
    labels: tuple[str, ...] | None = None

    def __call__(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        values = list(outputs.values())
        head_at, proto_at = split_outputs([v.shape for v in values])
        heads, protos = values[head_at], values[proto_at]
        results = []
        for pred, proto, box, hw in zip(heads, protos, letterboxes, sizes):
            columns, xyxy, score, cls = nms_yolov8(pred, self.classes, self.score_threshold, self.iou_threshold,
                                                   self.max_detections)
            coefficients = pred[4 + self.classes:4 + self.classes + self.coefficients, columns].T
            masks = [self.object_mask(c, proto, b) for c, b in zip(coefficients, xyxy)]
            results.append(self._result(xyxy, score, cls, masks, box, hw))
        return results

    def object_mask(self, coefficients: np.ndarray, proto: np.ndarray, xyxy) -> tuple[np.ndarray, int, int]:
        """The object's mask over its box in network pixels: (binary [h, w], x0, y0 of its corner)."""
        height, width = self.input_hw
        x0, y0 = max(0, math.floor(xyxy[0])), max(0, math.floor(xyxy[1]))
        x1, y1 = min(width, math.ceil(xyxy[2])), min(height, math.ceil(xyxy[3]))
        if x1 <= x0 or y1 <= y0:
            return np.zeros((0, 0), bool), x0, y0
        logits = np.tensordot(coefficients.astype(np.float32), proto.astype(np.float32), axes=1)
        scale_y, scale_x = proto.shape[1] / height, proto.shape[2] / width
        # the network pixels' centres in prototype coordinates: cv2.resize's own mapping, box region only
        xs = ((np.arange(x0, x1, dtype=np.float32) + 0.5) * scale_x - 0.5)[None, :].repeat(y1 - y0, 0)
        ys = ((np.arange(y0, y1, dtype=np.float32) + 0.5) * scale_y - 0.5)[:, None].repeat(x1 - x0, 1)
        sampled = cv2.remap(logits, xs, ys, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        return (sampled > 0.0) & _box_inside(xyxy, x0, y0, x1, y1), x0, y0

    def _result(self, xyxy, score, cls, masks, box, hw) -> dict:
        polygons, areas = [], []
        for mask, x0, y0 in masks:
            outline = largest_outline(mask)
            polygons.append(np.round(box.to_source(outline + [x0, y0]), 1).tolist() if len(outline) else [])
            areas.append(round(float(mask.sum()) / (box.scale_x * box.scale_y), 1))
        return with_labels({"boxes": np.round(boxes_to_source(xyxy, box, *hw), 1).tolist(),
                            "scores": np.round(score, 4).tolist(), "classes": np.asarray(cls).tolist(),
                            "polygons": polygons, "mask_areas": areas}, self.labels)

    def reduction(self, required: bool = False):
        return None


def _box_inside(xyxy, x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
    """Pixels of the region [y0:y1, x0:x1] inside the box, by their index as Ultralytics' crop_mask has it."""
    xs = np.arange(x0, x1)
    ys = np.arange(y0, y1)
    return ((ys >= xyxy[1]) & (ys < xyxy[3]))[:, None] & ((xs >= xyxy[0]) & (xs < xyxy[2]))[None, :]


def largest_outline(mask: np.ndarray) -> np.ndarray:
    """The largest outer contour of a binary mask as [K, 2] pixel coordinates (x, y); [0, 2] where empty."""
    if not mask.size or not mask.any():
        return np.zeros((0, 2))
    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    largest = max(contours, key=lambda c: (cv2.contourArea(c), len(c)))
    return largest.reshape(-1, 2).astype(np.float64)


def polygon_mask(polygon, hw: tuple[int, int]) -> np.ndarray:
    """A polygon (network pixels) rasterized: what the mask metric compares."""
    mask = np.zeros(hw, np.uint8)
    if len(polygon):
        cv2.fillPoly(mask, [np.round(np.asarray(polygon)).astype(np.int32)], 1)
    return mask.astype(bool)


def mask_agreement(reference: list[dict], candidate: list[dict], input_hw, iou: float = 0.5) -> float:
    """Mean IoU of the masks (outlines rasterized) of boxes matched one-to-one (same class, box IoU >= iou).
    No reference objects: 1.0; none matched: 0.0."""
    pairs, objects = matched_objects(reference, candidate, iou)
    ious = []
    for ref, cand, j, i in pairs:
        a, b = polygon_mask(ref["polygons"][j], input_hw), polygon_mask(cand["polygons"][i], input_hw)
        union = np.logical_or(a, b).sum()
        ious.append(float(np.logical_and(a, b).sum() / union) if union else 1.0)
    if not ious:
        return 1.0 if objects == 0 else 0.0
    return float(np.mean(ious))


class SegmentationYoloTask(DetectorTask):
    name = "segmentation-yolo"
    summary = "YOLOv8/11-seg heads + prototypes -> boxes, classes, mask outlines (polygons) and areas"
    metrics = {**DetectorTask.metrics, "mask_iou": ">="}
    check_bounds = {**DetectorTask.check_bounds, "mask_iou": 0.9}

    def mismatch(self, facts: ModelFacts) -> str | None:
        said = ultralytics_misfit(facts, "segment", "a segmentation model")
        if said:
            return said
        expected = "[N, 4 + C + M, A] (boxes with M mask coefficients) and [N, M, H/4, W/4] (prototypes)"
        shapes = [shape for _, shape in facts.outputs]
        split = split_outputs(shapes) if len(shapes) == 2 else None
        if split is None:
            return f"expects two outputs, {expected}, found {facts.shapes()}"
        (_, rows, anchors), (_, coefficients, ph, pw) = shapes[split[0]], shapes[split[1]]
        height, width = facts.input_hw
        if known(anchors) and anchors != anchor_points(facts.input_hw):
            return f"expects {anchor_points(facts.input_hw)} anchor columns at {height}x{width}, found {facts.shapes()}"
        if known(ph) and known(pw) and (ph, pw) != (height // PROTO_STRIDE, width // PROTO_STRIDE):
            return (f"expects prototypes of {height // PROTO_STRIDE}x{width // PROTO_STRIDE} (a quarter of the "
                    f"input), found {facts.shapes()}")
        if known(rows) and known(coefficients) and rows - 4 - coefficients < 1:
            return f"expects {expected}: 4 + C + {coefficients} rows with C >= 1, found {facts.shapes()}"
        if known(rows) and known(coefficients):
            return labels_misfit(facts, rows - 4 - coefficients)
        return None

    def recognizes(self, facts: ModelFacts) -> bool:
        """A head and prototypes of those shapes are distinctive: picked without the export's metadata too."""
        return self.mismatch(facts) is None and all(known(d) for _, shape in facts.outputs for d in shape[1:])

    def postprocessor(self, options: TaskOptions) -> YoloSegmentation:
        shapes = [shape for _, shape in options.outputs]
        split = split_outputs(shapes) if len(shapes) == 2 else None
        layout = {}
        if split is not None and known(shapes[split[0]][1]) and known(shapes[split[1]][1]):
            coefficients = shapes[split[1]][1]
            layout = {"classes": shapes[split[0]][1] - 4 - coefficients, "coefficients": coefficients}
        return YoloSegmentation(**layout, input_hw=tuple(options.input_hw), labels=options.labels)

    def object_metrics(self, reference: list[dict], candidate: list[dict], options: TaskOptions) -> dict:
        return {"mask_iou": mask_agreement(reference, candidate, tuple(options.input_hw))}
