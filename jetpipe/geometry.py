"""Letterbox geometry and the normalization affine: pure numpy, the definition that the CPU
reference (jetpipe.preprocess), the fused GPU kernel and postprocessing all follow."""

from __future__ import annotations

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


def affine(spec: PreprocessSpec) -> tuple[np.ndarray, np.ndarray]:
    """Per output channel (mul, add) with normalized = pixel * mul + add, in the network's order."""
    mul = np.float32(spec.scale) / np.asarray(spec.std, np.float32)
    add = -np.asarray(spec.mean, np.float32) / np.asarray(spec.std, np.float32)
    return mul.astype(np.float32), add.astype(np.float32)


Quad = tuple[tuple[float, float], ...]  # four (x, y) corners in source pixels: top-left, top-right, bottom-right,
#                                         bottom-left along the text (a detector's rotated line)


def quad_size(quad: Quad) -> tuple[int, int]:
    """(height, width) of a quadrilateral's crop: its longer opposite sides, as OCR pipelines cut it."""
    q = np.asarray(quad, np.float64)
    width = max(np.linalg.norm(q[1] - q[0]), np.linalg.norm(q[2] - q[3]))
    height = max(np.linalg.norm(q[3] - q[0]), np.linalg.norm(q[2] - q[1]))
    return max(1, round(height)), max(1, round(width))


def quad_homography(quad: Quad, content_hw: tuple[int, int], origin: tuple[int, int]) -> np.ndarray:
    """3x3 map from the resized content's coordinates (pixel edges: [0, w] x [0, h]) to the
    quadrilateral, in the coordinates of the region read (its top-left at `origin` of the frame).
    A pixel (u, v) of the content samples H(u + 0.5, v + 0.5) - 0.5 in pixel indices; for an upright
    quad that is cv2.resize's INTER_LINEAR sampling of the rectangle."""
    h, w = content_hw
    src = np.array([[0, 0], [w, 0], [w, h], [0, h]], np.float64)
    dst = np.asarray(quad, np.float64) - np.asarray(origin, np.float64)
    # the 8 unknowns of the projective map (h22 = 1) from the four corner pairs
    rows, rhs = [], []
    for (u, v), (x, y) in zip(src, dst):
        rows += [[u, v, 1, 0, 0, 0, -u * x, -v * x], [0, 0, 0, u, v, 1, -u * y, -v * y]]
        rhs += [x, y]
    return np.append(np.linalg.solve(np.array(rows), np.array(rhs)), 1.0).reshape(3, 3)


def quad_region(quad: Quad, height: int, width: int):
    """The integer rectangle (x0, y0, x1, y1) of the frame that holds a quadrilateral's pixels (what is
    read; samples outside it repeat its border), or None where it lies outside the frame."""
    q = np.asarray(quad, np.float64)
    x0, y0 = max(0, int(np.floor(q[:, 0].min()))), max(0, int(np.floor(q[:, 1].min())))
    x1, y1 = min(width, int(np.ceil(q[:, 0].max()))), min(height, int(np.ceil(q[:, 1].max())))
    return (x0, y0, x1, y1) if x1 > x0 and y1 > y0 else None
