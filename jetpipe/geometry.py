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
