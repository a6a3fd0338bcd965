"""segmentation-yolo: YOLOv8/11-seg heads, [N, 4 + C + M, A] boxes with M mask coefficients, and the
prototypes [N, M, H/4, W/4].

Decoding as detection-yolo's YOLOv8 layout (best class, score threshold, class-aware NMS); each kept object's
mask is coefficients x prototypes, sampled up to network pixels bilinearly (half-pixel centres, edges
replicated: Ultralytics' upsampling, F.interpolate without align_corners), cut to its box and taken where the
logit is above 0 (sigmoid above 0.5), as Ultralytics' process_mask does. Records: detection-yolo's "boxes",
"scores", "classes", "labels", and per object its outline, "polygons" (the largest outer contour of its mask,
[x, y] points in source pixels; [] where the mask is empty), and "mask_areas" (its mask's area in source
pixels); never a full-resolution mask. Sinks fill the outlines translucent. Metric against FP32: box F1,
score MAE and mAP as detectors, and "mask_iou": the mean IoU of matched objects' masks. GPU: the "yolo-seg"
reduction: NMS, every kept box's mask (one bit a network pixel of its region, laid out by mask_region /
region_words) and its outline on the device, traced and simplified as OpenCV does it here (runtime/outline.cuh,
Douglas-Peucker by the installed OpenCV's distance: segment_distance()); only the boxes and the outlines' points
cross the bus, and a mask whose outline did not fit the device's room comes back as bits, traced here.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field

import numpy as np

from jetpipe.lazy import lazy_import
from jetpipe.runtime.api import Reduction
from jetpipe.tasks.agreement_metrics import matched_objects
from jetpipe.tasks.base import (
    DetectorTask,
    JoinedRows,
    ModelFacts,
    TaskOptions,
    known,
    labels_misfit,
    split_by_counts,
    ultralytics_misfit,
    with_labels,
)
from jetpipe.tasks.detection_yolo import anchor_points, kept_detections, nms_yolov8

cv2 = lazy_import("cv2")
log = logging.getLogger(__name__)

PROTO_STRIDE = 4  # prototypes are a quarter of the input's size (Ultralytics' Proto module)
OUTLINE_TOLERANCE = 0.5  # outlines simplified to within this many network pixels


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
    truncated: bool = field(default=False, init=False)  # a frame's masks overflowed the GPU's words (said once)

    def __call__(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        values = list(outputs.values())
        head_at, proto_at = split_outputs([v.shape for v in values])
        heads, protos = values[head_at], values[proto_at]
        found = []
        for pred, proto, _ in zip(heads, protos, letterboxes):
            columns, xyxy, score, cls = nms_yolov8(pred, self.classes, self.score_threshold, self.iou_threshold,
                                                   self.max_detections)
            coefficients = pred[4 + self.classes:4 + self.classes + self.coefficients, columns].T
            outlines, pixels = trace_outlines([self.object_mask(c, proto, b) for c, b in zip(coefficients, xyxy)],
                                              OUTLINE_TOLERANCE)
            found.append((xyxy, score, cls, _joined(outlines), pixels))
        if not found:
            return []
        rows, (xyxy, score, cls) = JoinedRows.joined([f[:3] for f in found])
        return self._results(rows, xyxy, score, cls, [f[3:] for f in found], letterboxes, sizes)

    def object_mask(self, coefficients: np.ndarray, proto: np.ndarray, xyxy) -> tuple[np.ndarray, int, int]:
        """The object's mask over its box region in network pixels: (binary [h, w], x0, y0 of its corner).
        In float32, in the order the GPU's seg_masks kernel computes it."""
        x0, y0, x1, y1 = mask_region(xyxy, self.input_hw)
        if x1 <= x0 or y1 <= y0:
            return np.zeros((0, 0), bool), x0, y0
        ix0, ix1, ax = _sample_points(x0, x1, proto.shape[2] / self.input_hw[1], proto.shape[2])
        iy0, iy1, ay = _sample_points(y0, y1, proto.shape[1] / self.input_hw[0], proto.shape[1])
        # the prototype pixels the box samples only: a box's logits, not the whole map's, for each object
        (px, qx), (py, qy) = (ix0[0], ix1[-1] + 1), (iy0[0], iy1[-1] + 1)
        logits = np.tensordot(coefficients.astype(np.float32), proto[:, py:qy, px:qx].astype(np.float32), axes=1)
        ix0, ix1, iy0, iy1 = ix0 - px, ix1 - px, iy0 - py, iy1 - py
        one = np.float32(1)
        top = (one - ax) * logits[iy0][:, ix0] + ax * logits[iy0][:, ix1]
        bottom = (one - ax) * logits[iy1][:, ix0] + ax * logits[iy1][:, ix1]
        sampled = (one - ay)[:, None] * top + ay[:, None] * bottom
        return (sampled > 0.0) & _box_inside(xyxy, x0, y0, x1, y1), x0, y0

    def _results(self, rows: JoinedRows, xyxy, score, cls, shapes: list, letterboxes, sizes) -> list[dict]:
        """Records of a batch from its kept boxes (joined frame after frame) and each frame's (outlines in
        network pixels as _joined gives them, pixels)."""
        results = []
        for record, (outlines, pixels), box in zip(rows.box_records(xyxy, score, cls, letterboxes, sizes), shapes,
                                                   letterboxes):
            areas = [round(a, 1) for a in (pixels / (box.scale_x * box.scale_y)).tolist()]  # Python's rounding
            results.append(with_labels({**record, "polygons": _to_source_lists(outlines, box), "mask_areas": areas},
                                       self.labels))
        return results

    def reduction(self, required: bool = False) -> Reduction:
        return Reduction("yolo-seg", {"score_threshold": self.score_threshold, "iou_threshold": self.iou_threshold,
                                      "limit": self.max_detections, "input_hw": tuple(self.input_hw),
                                      "coefficients": self.coefficients, "outline_tolerance": OUTLINE_TOLERANCE,
                                      "segment_distance": segment_distance()}, required)

    def reduced(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        """Finish from the GPU's kept boxes (counts [B], detections [B, limit, 6]) and their outlines (outlines
        [B, limit, 3]: first point, points, pixels; points [B, room, 2] int16). An outline the device had no room
        for (points -1) is traced here from its mask's words (masks [B, capacity] uint32, box after box as
        mask_region / region_words lay them out)."""
        rows, xyxy, score, cls = kept_detections(outputs, len(letterboxes))
        shapes = [self.gathered(kept[:count, :4],  # the kernel's float32 corners: its regions
                                outputs["outlines"][frame, :count], outputs["points"][frame], outputs["masks"][frame])
                  for frame, (count, kept) in enumerate(zip(rows.counts, outputs["detections"]))]
        return self._results(rows, xyxy, score, cls, shapes, letterboxes, sizes)

    def gathered(self, xyxy: np.ndarray, table: np.ndarray, points: np.ndarray, words: np.ndarray):
        """The frame's outlines (_joined: network pixels, float64) and pixel counts from the GPU's table and
        points, gathered with one index for all boxes; the boxes it handed back as words traced here."""
        counts, pixels = table[:, 1], table[:, 2].astype(np.float64)
        if (counts == -2).any():
            self._say_truncated(len(words), len(xyxy))
        spilled = np.flatnonzero(counts == -1)
        if len(spilled):  # rare: box by box, with the host's traces in their places
            outlines = [points[first:first + n].astype(np.float64) if n > 0 else _EMPTY
                        for first, n, _ in table.tolist()]
            traced, _ = trace_outlines(self.unpack(xyxy, words, spilled), OUTLINE_TOLERANCE)
            for i, outline in zip(spilled.tolist(), traced):
                outlines[i] = outline
            return _joined(outlines), pixels
        sizes = np.maximum(counts, 0).astype(np.int64)
        before = np.cumsum(sizes) - sizes  # where each box's points go in the joined array
        index = np.arange(int(sizes.sum())) + np.repeat(table[:, 0] - before, sizes)
        return (points[index].astype(np.float64), sizes.tolist()), pixels

    def _say_truncated(self, words: int, boxes: int) -> None:
        if not self.truncated:
            log.warning("masks of more than %d network pixels a frame (%d boxes' regions): the boxes past them have "
                        "no outline", 32 * words, boxes)
            self.truncated = True

    def unpack(self, xyxy: np.ndarray, words: np.ndarray, which=None) -> list[tuple[np.ndarray, int, int]]:
        """Each box's mask (or the boxes `which` lists) from its words (bit i of a word: the word's i-th pixel
        from the left) as 0 / 1 bytes (views: findContours reads rows at a stride); boxes past the words'
        capacity have none (an empty mask: no outline, area 0), said once."""
        regions = mask_regions(xyxy, self.input_hw)
        counts = region_words(regions)
        ends = np.cumsum(counts)
        fits = ends <= len(words)
        if not fits.all() and counts[~fits].any():
            self._say_truncated(len(words), len(xyxy))
        which = range(len(regions)) if which is None else which
        masks = []
        for i in which:
            (x0, y0, x1, y1), count, end = regions[i].tolist(), int(counts[i]), int(ends[i])
            if count == 0 or not fits[i]:
                masks.append((np.zeros((0, 0), np.uint8), x0, y0))
                continue
            bits = np.unpackbits(words[end - count:end].view(np.uint8), bitorder="little")
            masks.append((bits.reshape(y1 - y0, -1)[:, :x1 - x0], x0, y0))
        return masks


_EMPTY = np.zeros((0, 2))


@functools.cache
def segment_distance() -> bool:
    """Whether the installed OpenCV's approxPolyDP measures a point's distance to the chord's segment (OpenCV
    4.13 on) rather than to its line (4.12 and before): the GPU's outlines follow the same rule. On these four
    points the two rules keep 4 and 3 points."""
    probe = np.array([[5, 5], [7, 2], [1, 6], [6, 4]], np.int32).reshape(-1, 1, 2)
    return len(cv2.approxPolyDP(probe, 1.0, True)) == 4


def _joined(outlines: list[np.ndarray]) -> tuple[np.ndarray, list[int]]:
    """A frame's outlines as one [P, 2] array of their points and each one's count."""
    return (np.concatenate(outlines) if outlines else _EMPTY), [len(o) for o in outlines]


def _to_source_lists(joined: tuple[np.ndarray, list[int]], box) -> list[list]:
    """Each outline (network pixels, _joined) in source pixels to 0.1 as lists: one transform, rounding and
    tolist for the frame's outlines together (per outline, those calls were a third of the host's time per
    object)."""
    points, counts = joined
    return split_by_counts(np.round(box.to_source(points), 1).tolist(), counts)


def mask_regions(xyxy, input_hw) -> np.ndarray:
    """Boxes' regions in network pixels, [n, 4] ints x0 y0 x1 y1: their corners (float32) floored / ceiled
    inside the input, as the seg_masks kernel takes them (NaN taken as 0)."""
    height, width = input_hw
    corners = np.asarray(xyxy, np.float32).reshape(-1, 4)
    inside = np.fmin(np.fmax(corners, np.float32(0)), np.array([width, height, width, height], np.float32))
    return np.concatenate([np.floor(inside[:, :2]), np.ceil(inside[:, 2:])], axis=1).astype(np.int64)


def mask_region(xyxy, input_hw) -> tuple[int, int, int, int]:
    """One box's region (mask_regions)."""
    return tuple(mask_regions(xyxy[:4], input_hw)[0].tolist())


def region_words(regions: np.ndarray) -> np.ndarray:
    """32-bit words of each region's mask: one bit a pixel, each row padded to whole words (0 if empty)."""
    w, h = regions[:, 2] - regions[:, 0], regions[:, 3] - regions[:, 1]
    return np.where((w > 0) & (h > 0), h * ((w + 31) // 32), 0)


def _sample_points(start: int, stop: int, scale: float, size: int):
    """Bilinear sampling along one axis: for network pixels start..stop-1, the prototype pixels either side of
    each one's centre (edges replicated) and the weight of the second, in float32."""
    at = (np.arange(start, stop, dtype=np.float32) + np.float32(0.5)) * np.float32(scale) - np.float32(0.5)
    floor = np.floor(at)
    first = floor.astype(np.int64)
    return np.clip(first, 0, size - 1), np.clip(first + 1, 0, size - 1), (at - floor).astype(np.float32)


def _box_inside(xyxy, x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
    """Pixels of the region [y0:y1, x0:x1] inside the box, by their index as Ultralytics' crop_mask has it."""
    xs = np.arange(x0, x1)
    ys = np.arange(y0, y1)
    return ((ys >= xyxy[1]) & (ys < xyxy[3]))[:, None] & ((xs >= xyxy[0]) & (xs < xyxy[2]))[None, :]


def trace_outlines(masks: list[tuple[np.ndarray, int, int]], tolerance: float = 0.0):
    """Each mask's largest outer contour (by area, then points; RETR_EXTERNAL and CHAIN_APPROX_SIMPLE:
    Ultralytics' masks.xy), simplified to within `tolerance` pixels (Douglas-Peucker; 0: as traced) and moved
    to its corner, and its pixel count. masks: (binary [h, w] bool or 0 / 1 bytes, a view is fine; x0, y0).
    Returns ([K, 2] float64 network pixels per mask, [0, 2] where it is empty; [n] float64 pixels).
    OpenCV's names are bound once: per mask, looking them up through the lazy module was a tenth of the time.
    (Tracing a batch's masks together on one atlas image, one findContours call for all, was tried and was
    slower in the serving pipeline on an H100: 236 against 291 frames/s.)"""
    find, simplify, area = cv2.findContours, cv2.approxPolyDP, cv2.contourArea
    external, simple = cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE
    outlines, pixels = [np.zeros((0, 2))] * len(masks), np.zeros(len(masks))
    for i, (mask, x0, y0) in enumerate(masks):
        if not mask.size:
            continue
        image = mask.view(np.uint8) if mask.dtype == bool else mask
        pixels[i] = np.count_nonzero(image)
        contours = find(image, external, simple)[0] if pixels[i] else ()
        if not contours:
            continue
        largest = contours[0] if len(contours) == 1 else max(contours, key=lambda c: (area(c), len(c)))
        if tolerance > 0:
            largest = simplify(largest, tolerance, True)
        outlines[i] = largest.reshape(-1, 2) + np.array([x0, y0], np.float64)
    return outlines, pixels


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
