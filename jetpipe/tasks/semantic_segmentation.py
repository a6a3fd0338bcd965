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

from jetpipe.geometry import map_content, sampling_step
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
    map_hw: tuple[int, int] | None = None  # the class map's size where it is not the input's

    def __call__(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        logits = next(iter(outputs.values()))
        results = []
        for frame, box in zip(logits, letterboxes):
            best = frame.argmax(axis=0)
            x0, y0, x1, y1 = map_content(box, self.input_hw, best.shape)
            content = best[y0:y1, x0:x1]
            step = sampling_step(*content.shape, OUTLINE_SIDE)
            results.append(self._result(class_counts(content), content.size, content[step // 2::step, step // 2::step],
                                        step, best.shape[1] / self.input_hw[1], box))
        return results

    def reduced(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        """Finish from the GPU's class counts over each frame's content (counts [B, C]), where the content is
        on the map (content [B, 5]: x0, y0, x1, y1 and the sampling step) and the content's classes read every
        step pixels (sampled [B, S, S], its top-left corner used)."""
        scale = (self.map_hw or self.input_hw)[1] / self.input_hw[1]
        results = []
        for counts, (x0, y0, x1, y1, step), sampled, box in zip(outputs["counts"], outputs["content"].tolist(),
                                                                outputs["sampled"], letterboxes):
            rows, columns = len(range(step // 2, y1 - y0, step)), len(range(step // 2, x1 - x0, step))
            results.append(self._result(counts, (y1 - y0) * (x1 - x0), sampled[:rows, :columns], step, scale, box))
        return results

    def reduction(self, required: bool = False) -> Reduction:
        return Reduction("argmax", {"input_hw": tuple(self.input_hw), "side": OUTLINE_SIDE,
                                    "map_hw": tuple(self.map_hw or self.input_hw)}, required)

    def _result(self, counts: np.ndarray, size: int, sampled: np.ndarray, step: int, scale: float, box) -> dict:
        """A frame's record from its classes' pixel counts over the content (`size` pixels), the content's map
        read every `step` pixels, and map pixels per network pixel."""
        classes = np.flatnonzero(counts)
        order = classes[np.argsort(-counts[classes], kind="stable")]
        shares = {self._name(int(c)): round(float(counts[c]) / size, 5) for c in order}
        corner = np.array([box.pad_x * scale, box.pad_y * scale])
        found = [(int(cls), outline, pixels) for cls in (order if sampled.size else ())
                 for outline, pixels in self._outlines(sampled == cls)]
        found.sort(key=lambda f: -f[2])  # largest first (stable: by class, then as traced)
        found = found[:MAX_REGIONS]
        if not found:
            return {"class_shares": shares, "regions": []}
        at = np.concatenate([outline for _, outline, _ in found]) * step + step // 2  # sampled -> map pixels
        network = (at + corner + 0.5) / scale - 0.5  # a map pixel's centre -> network pixels
        points = np.round(box.to_source(network), 1).tolist()  # once a frame: per region it was most of the time
        regions, start = [], 0
        for cls, outline, pixels in found:
            regions.append({"class": cls, "label": self._name(cls), "polygon": points[start:start + len(outline)],
                            "area": round(pixels * step * step / (scale * scale * box.scale_x * box.scale_y), 1)})
            start += len(outline)
        return {"class_shares": shares, "regions": regions}

    def _outlines(self, mask: np.ndarray):
        """(outline [K, 2] in map pixels, pixel count) of each connected region (8-connected) above the minimum
        share, in the order of their labels. The regions' outer contours are traced together (the top level of
        RETR_CCOMP: every region's outer border, also of one inside another's hole), each the contour tracing
        the region alone gives; a contour's region is the label at its first point."""
        smallest = self.min_region_share * mask.size
        image = mask.view(np.uint8)
        _, parts, stats, _ = cv2.connectedComponentsWithStats(image, connectivity=8)
        areas = stats[:, cv2.CC_STAT_AREA]
        if not (areas[1:] >= smallest).any():
            return
        contours, hierarchy = cv2.findContours(image, cv2.RETR_CCOMP, cv2.CHAIN_APPROX_SIMPLE)
        outer = [(int(parts[c[0, 0, 1], c[0, 0, 0]]), c) for c, h in zip(contours, hierarchy[0]) if h[3] < 0]
        for label, contour in sorted(outer, key=lambda o: o[0]):
            if areas[label] >= smallest:
                outline = cv2.approxPolyDP(contour, 1.0, True)
                yield outline.reshape(-1, 2).astype(np.float64), int(areas[label])

    def _name(self, cls: int) -> str:
        return self.labels[cls] if self.labels and 0 <= cls < len(self.labels) else str(cls)



def class_counts(best: np.ndarray) -> np.ndarray:
    """Pixels of each class in a map of class numbers (a view of a larger map is fine): the CPU path's counts
    (argmax's int64 classes; on the GPU the reduction counts them)."""
    return np.bincount(best.ravel())


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
        shape = options.outputs[0][1] if len(options.outputs) == 1 else ()
        map_hw = tuple(shape[2:]) if len(shape) == 4 and all(known(d) for d in shape[2:]) else None
        return SemanticSegmentation(input_hw=tuple(options.input_hw), labels=options.labels, map_hw=map_hw)

    def metric(self, reference: list, candidate: list, options: TaskOptions) -> dict:
        return map_agreement(reference[0], candidate[0])


def _map_scale(input_hw, map_hw) -> int | None:
    for scale in MAP_SCALES:
        if (input_hw[0] // scale, input_hw[1] // scale) == tuple(map_hw) and input_hw[0] % scale == 0:
            return scale
    return None

