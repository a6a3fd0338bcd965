"""Letterbox geometry and the normalization affine: pure numpy, the definition that the CPU
reference (jetpipe.preprocess), the fused GPU kernel and postprocessing all follow."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from jetpipe.spec import PreprocessSpec


@dataclass(frozen=True)
class Letterbox:
    """Maps network-input pixels back to source pixels: src = (net - pad) / scale."""

    scale_x: float
    scale_y: float
    pad_x: int
    pad_y: int

    def to_source(self, xy: np.ndarray) -> np.ndarray:
        """Network-input (x, y) coordinates, last axis of size 2 -> source coordinates."""
        pad = np.array([self.pad_x, self.pad_y], dtype=np.float64)
        scale = np.array([self.scale_x, self.scale_y], dtype=np.float64)
        return (np.asarray(xy, dtype=np.float64) - pad) / scale


def fit(src_hw: tuple[int, int], dst_hw: tuple[int, int], mode: str) -> tuple[tuple[int, int], Letterbox]:
    """Resized (h, w) of the content and its placement inside dst for a resize mode."""
    (sh, sw), (dh, dw) = src_hw, dst_hw
    if mode == "stretch":
        return (dh, dw), Letterbox(dw / sw, dh / sh, 0, 0)
    r = min(dh / sh, dw / sw)
    nh, nw = max(1, round(sh * r)), max(1, round(sw * r))
    if mode == "topleft":  # text lines: recognizers read from the left, the pad goes right (and below)
        return (nh, nw), Letterbox(nw / sw, nh / sh, 0, 0)
    return (nh, nw), Letterbox(nw / sw, nh / sh, (dw - nw) // 2, (dh - nh) // 2)


def map_content(letterbox: Letterbox, input_hw: tuple[int, int], map_hw: tuple[int, int]) -> tuple[int, int, int, int]:
    """The letterboxed content's pixels on a map covering the network input at map_hw (a semantic
    segmentation's class map: the input's size or a fraction of it): x0, y0, x1, y1, at least one pixel."""
    scale = map_hw[1] / input_hw[1]
    height, width = input_hw
    pad_x, pad_y = letterbox.pad_x * scale, letterbox.pad_y * scale
    content_w, content_h = (width - 2 * letterbox.pad_x) * scale, (height - 2 * letterbox.pad_y) * scale
    x0, y0 = int(round(pad_x)), int(round(pad_y))
    return x0, y0, max(x0 + 1, int(round(pad_x + content_w))), max(y0 + 1, int(round(pad_y + content_h)))


def sampling_step(height: int, width: int, side: int) -> int:
    """Every how many pixels a height x width map is read so that at most `side` pixels a side are read (from
    pixel step // 2 on)."""
    return -(-max(height, width) // side)


def affine(spec: PreprocessSpec) -> tuple[np.ndarray, np.ndarray]:
    """Per output channel (mul, add) with normalized = pixel * mul + add, in the network's order."""
    mul = np.float32(spec.scale) / np.asarray(spec.std, np.float32)
    add = -np.asarray(spec.mean, np.float32) / np.asarray(spec.std, np.float32)
    return mul.astype(np.float32), add.astype(np.float32)


Quad = tuple[tuple[float, float], ...]  # four (x, y) corners in source pixels: top-left, top-right, bottom-right,
#                                         bottom-left along the text (a detector's rotated line)


def quad_size(quad: Quad) -> tuple[int, int]:
    """(height, width) of a quadrilateral's crop: its longer opposite sides, as OCR pipelines cut it."""
    (x0, y0), (x1, y1), (x2, y2), (x3, y3) = quad  # plain floats: called for every crop of a batch
    width = max(math.hypot(x1 - x0, y1 - y0), math.hypot(x2 - x3, y2 - y3))
    height = max(math.hypot(x3 - x0, y3 - y0), math.hypot(x2 - x1, y2 - y1))
    return max(1, round(height)), max(1, round(width))


def quad_homography(quad: Quad, content_hw: tuple[int, int], origin: tuple[int, int]) -> np.ndarray:
    """3x3 map from the resized content's coordinates (pixel edges: [0, w] x [0, h]) to the
    quadrilateral, in the coordinates of the region read (its top-left at `origin` of the frame).
    A pixel (u, v) of the content samples H(u + 0.5, v + 0.5) - 0.5 in pixel indices; for an upright
    quad that is cv2.resize's INTER_LINEAR sampling of the rectangle.

    The unit square's map to the quad in closed form (Heckbert, "Fundamentals of Texture Mapping", 1989),
    scaled to the content's size: what solving the four corner pairs gives, without a solve per crop."""
    h, w = content_hw
    (x0, y0), (x1, y1), (x2, y2), (x3, y3) = ((x - origin[0], y - origin[1]) for x, y in quad)
    sx, sy = x0 - x1 + x2 - x3, y0 - y1 + y2 - y3
    if sx == 0 and sy == 0:  # a parallelogram: affine
        g = k = 0.0
    else:
        dx1, dx2, dy1, dy2 = x1 - x2, x3 - x2, y1 - y2, y3 - y2
        den = dx1 * dy2 - dx2 * dy1
        if den == 0:
            raise ValueError(f"quadrilateral {quad} is degenerate: three corners on a line")
        g, k = (sx * dy2 - dx2 * sy) / den, (dx1 * sy - sx * dy1) / den
    return np.array([[(x1 - x0 + g * x1) / w, (x3 - x0 + k * x3) / h, x0],
                     [(y1 - y0 + g * y1) / w, (y3 - y0 + k * y3) / h, y0],
                     [g / w, k / h, 1.0]])


def quad_region(quad: Quad, height: int, width: int):
    """The integer rectangle (x0, y0, x1, y1) of the frame that holds a quadrilateral's pixels (what is
    read; samples outside it repeat its border), or None where it lies outside the frame."""
    xs, ys = [x for x, _ in quad], [y for _, y in quad]
    x0, y0 = max(0, math.floor(min(xs))), max(0, math.floor(min(ys)))
    x1, y1 = min(width, math.ceil(max(xs))), min(height, math.ceil(max(ys)))
    return (x0, y0, x1, y1) if x1 > x0 and y1 > y0 else None


def box_region(box, height: int, width: int, min_side: int = 1):
    """A box in source pixels (floats) -> the integer rectangle around it inside the frame, at least min_side
    pixels each way (None: less, or outside)."""
    x0, y0 = max(0, math.floor(box[0])), max(0, math.floor(box[1]))
    x1, y1 = min(width, math.ceil(box[2])), min(height, math.ceil(box[3]))
    return (x0, y0, x1, y1) if x1 - x0 >= min_side and y1 - y0 >= min_side else None


def boxes_through(boxes: np.ndarray, linear, shift, scale) -> np.ndarray:
    """xyxy boxes (..., 4) through a similarity (linear (..., 2, 2), shift (..., 2), scale (...); broadcast):
    the centre moved by the affine, the size scaled (a box stays upright). A camera's motion moving tracks,
    and a frame's boxes placed in a moving camera's first view."""
    centre = np.einsum("...ij,...j->...i", linear, (boxes[..., :2] + boxes[..., 2:]) / 2) + shift
    half = (boxes[..., 2:] - boxes[..., :2]) / 2 * np.asarray(scale)[..., None]
    return np.concatenate([centre - half, centre + half], axis=-1)
