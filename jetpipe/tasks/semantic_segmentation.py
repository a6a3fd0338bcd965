"""semantic-segmentation: one class per pixel from [N, C, h, w] logits (DeepLab, LRASPP, SegFormer-style
heads), h x w the input's size or a fraction of it (1/2, 1/4, 1/8).

Per frame: the best class of each pixel (argmax over C), inside the letterboxed content only. Records:
"class_shares" (class -> its share of the frame's pixels, largest first; class names where the bundle has
them) and "regions": each connected region of one class covering at least MIN_REGION_SHARE of the frame, its
outline as [x, y] points in source pixels, its class and label and its area in source pixels; never the
full-resolution map. Regions are traced on the map sampled every `step` pixels (step: the smallest that
leaves at most OUTLINE_SIDE pixels a side; 1 for maps up to that), outlines simplified to within a sampled
pixel. Sinks fill the regions with their class's colour, translucent. Metric against FP32: pixel agreement
(the share of pixels given the same class) and mIoU over the classes either map has. GPU: the "argmax"
reduction: the best class of each pixel on the device, one byte a pixel back instead of C floats, finished
by the same code as the CPU path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jetpipe.lazy import lazy_import
from jetpipe.runtime.api import Reduction
from jetpipe.tasks.base import ModelFacts, Task, TaskOptions, known, labels_misfit, single_output

cv2 = lazy_import("cv2")

MIN_REGION_SHARE = 0.002  # regions smaller than this share of the frame's content are counted, not outlined
MAX_REGIONS = 256         # outlines per frame, largest first
MAX_CLASSES = 1024
RECOGNIZED_CLASSES = 200  # picked unasked up to this many classes (VOC 21, Cityscapes 19, ADE20K 150)
MAP_SCALES = (1, 2, 4, 8)  # the map's size: the input's divided by one of these
OUTLINE_SIDE = 160        # regions are traced on the map sampled down to at most this many pixels a side


@dataclass
class SemanticSegmentation:
    input_hw: tuple[int, int] = (512, 512)
    labels: tuple[str, ...] | None = None
    min_region_share: float = MIN_REGION_SHARE

    def class_map(self, best: np.ndarray, letterbox) -> tuple[np.ndarray, float]:
        """The best class of each map pixel (argmax of the logits) inside the letterboxed content, and map
        pixels per network pixel."""
        scale = best.shape[1] / self.input_hw[1]
        height, width = self.input_hw
        pad_x, pad_y = letterbox.pad_x * scale, letterbox.pad_y * scale
        content_w, content_h = (width - 2 * letterbox.pad_x) * scale, (height - 2 * letterbox.pad_y) * scale
        x0, y0 = int(round(pad_x)), int(round(pad_y))
        x1, y1 = max(x0 + 1, int(round(pad_x + content_w))), max(y0 + 1, int(round(pad_y + content_h)))
        return best[y0:y1, x0:x1], scale

    def __call__(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        logits = next(iter(outputs.values()))
        return [self._result(*self.class_map(frame.argmax(axis=0), box), box)
                for frame, box in zip(logits, letterboxes)]

    def reduced(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        """Finish from the GPU's best class of each pixel (best [B, h, w])."""
        return [self._result(*self.class_map(best, box), box) for best, box in zip(outputs["best"], letterboxes)]

    def reduction(self, required: bool = False) -> Reduction:
        return Reduction("argmax", {}, required)

    def _result(self, best: np.ndarray, scale: float, box) -> dict:
        counts = np.bincount(best.ravel())
        classes = np.flatnonzero(counts)
        order = classes[np.argsort(-counts[classes], kind="stable")]
        shares = {self._name(int(c)): round(float(counts[c]) / best.size, 5) for c in order}
        step = -(-max(best.shape) // OUTLINE_SIDE)
        sampled = best[step // 2::step, step // 2::step]
        corner = np.array([box.pad_x * scale, box.pad_y * scale])
        regions = []
        for cls in order:
            for outline, pixels in self._outlines(sampled == cls):
                at = outline * step + step // 2  # a sampled pixel -> the map pixel it was read from
                network = (at + corner + 0.5) / scale - 0.5  # a map pixel's centre -> network pixels
                regions.append({"class": int(cls), "label": self._name(int(cls)),
                                "polygon": np.round(box.to_source(network), 1).tolist(),
                                "area": round(pixels * step * step / (scale * scale * box.scale_x * box.scale_y), 1)})
        regions.sort(key=lambda r: -r["area"])
        return {"class_shares": shares, "regions": regions[:MAX_REGIONS]}

    def _outlines(self, mask: np.ndarray):
        """(outline [K, 2] in map pixels, pixel count) of each connected region above the minimum share."""
        smallest = self.min_region_share * mask.size
        count, parts, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
        for label in range(1, count):
            pixels = int(stats[label, cv2.CC_STAT_AREA])
            if pixels < smallest:
                continue
            contours, _ = cv2.findContours((parts == label).astype(np.uint8), cv2.RETR_EXTERNAL,
                                           cv2.CHAIN_APPROX_SIMPLE)
            outline = cv2.approxPolyDP(max(contours, key=cv2.contourArea), 1.0, True)
            yield outline.reshape(-1, 2).astype(np.float64), pixels

    def _name(self, cls: int) -> str:
        return self.labels[cls] if self.labels and 0 <= cls < len(self.labels) else str(cls)



def map_agreement(reference: np.ndarray, candidate: np.ndarray) -> dict:
    """Pixel agreement and mIoU of two batches of logits' class maps (classes either map has)."""
    ref, cand = reference.argmax(axis=1), candidate.argmax(axis=1)
    ious = []
    for cls in np.union1d(np.unique(ref), np.unique(cand)):
        a, b = ref == cls, cand == cls
        ious.append(np.logical_and(a, b).sum() / np.logical_or(a, b).sum())
    return {"pixel_agreement": float(np.mean(ref == cand)), "miou": float(np.mean(ious))}


class SemanticSegmentationTask(Task):
    name = "semantic-segmentation"
    summary = "[N, C, h, w] class logits -> class shares and region outlines per class"
    metrics = {"pixel_agreement": ">=", "miou": ">="}
    check_bounds = {"pixel_agreement": 0.98}

    def mismatch(self, facts: ModelFacts) -> str | None:
        shape = single_output(facts, 4, "[N, C, h, w] (class logits per pixel)")
        if isinstance(shape, str):
            return shape
        _, classes, height, width = shape
        if known(classes) and not 2 <= classes <= MAX_CLASSES:
            return f"expects 2 to {MAX_CLASSES} classes, found {facts.shapes()}"
        if known(height) and known(width) and _map_scale(facts.input_hw, (height, width)) is None:
            return (f"expects a map of the input's size ({facts.input_hw[0]}x{facts.input_hw[1]}) or 1/2, 1/4, 1/8 "
                    f"of it, found {facts.shapes()}")
        return labels_misfit(facts, classes)

    def recognizes(self, facts: ModelFacts) -> bool:
        """Stricter than fitting, where no labels name the classes: every size known, 2 to RECOGNIZED_CLASSES
        classes but not 3 or 4 (an image-to-image model's RGB / RGBA output), the map at 1, 1/2 or 1/4 of the
        input (a backbone's features at 1/8 are not picked unasked)."""
        shape = facts.outputs[0][1] if len(facts.outputs) == 1 else ()
        if self.mismatch(facts) is not None or len(shape) != 4 or not all(known(d) for d in shape[1:]):
            return False
        if facts.labels:
            return True
        return (2 <= shape[1] <= RECOGNIZED_CLASSES and shape[1] not in (3, 4)
                and _map_scale(facts.input_hw, shape[2:]) in (1, 2, 4))

    def labels(self, facts: ModelFacts) -> tuple[str, ...] | None:
        return facts.labels

    def postprocessor(self, options: TaskOptions) -> SemanticSegmentation:
        return SemanticSegmentation(input_hw=tuple(options.input_hw), labels=options.labels)

    def metric(self, reference: list, candidate: list, options: TaskOptions) -> dict:
        return map_agreement(reference[0], candidate[0])


def _map_scale(input_hw, map_hw) -> int | None:
    for scale in MAP_SCALES:
        if (input_hw[0] // scale, input_hw[1] // scale) == tuple(map_hw) and input_hw[0] % scale == 0:
            return scale
    return None

