"""A moving camera's motion between frames, from the pictures: BoT-SORT's global motion compensation.

Corners of the last frame's luma (OpenCV's `goodFeaturesToTrack`), found again in this frame by pyramidal
Lucas-Kanade optical flow, and the motion most of them agree on: a translation, or a similarity (rotation,
zoom; RANSAC, `estimateAffinePartial2D`) where clearly more corners agree with it. Objects that move on their
own are the outliers. On a small copy of the luma
(`width` pixels wide): the motion of a pan is what the background does as a whole, and a quarter of a 1080p
picture holds it; the affine is returned in the frame's own pixels.

The tracker moves its tracks by it (botsort.BotSortTable: `motion` of a frame), so a panning, shaking or PTZ
camera neither breaks tracks nor drifts their predictions.
"""

from __future__ import annotations

import numpy as np

from jetpipe.frames import native_planes
from jetpipe.lazy import lazy_import

cv2 = lazy_import("cv2")

WIDTH = 480            # the luma is looked at this wide (1080p: a quarter)
MAX_CORNERS = 400
QUALITY = 0.001         # of the strongest corner: a plain wall still gives the few it has
MIN_AGREEING = 12      # fewer corners agreeing: no motion measured (a blank or a wholly new picture)
AGREE_PX = 1.0         # a corner agrees with a motion within this many small pixels
ZOOM_EVIDENCE = 2.0    # a similarity wins where this many times the corners agree with it as with a translation


def luma(frame: np.ndarray, fmt: str, height: int, width: int) -> np.ndarray:
    """A host frame's luma (h, w) uint8: its Y plane where it has one (no conversion), else its grey."""
    if fmt in ("bgr", "rgb"):
        return cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY if fmt == "bgr" else cv2.COLOR_RGB2GRAY)
    return np.ascontiguousarray(native_planes(frame, fmt, height, width)[0])


class CameraMotion:
    """One stream's camera: estimate() each frame's luma, in order."""

    def __init__(self, width: int = WIDTH):
        self.width = width
        self.last: np.ndarray | None = None   # the last frame's small luma
        self.corners: np.ndarray | None = None
        self.scale = 1.0                      # frame pixels per small pixel

    def estimate(self, luma: np.ndarray, boxes: np.ndarray | None = None) -> np.ndarray | None:
        """The 2 x 3 affine from the last frame's pixels to this one's (None: the first frame, or not measured);
        luma: the frame's Y plane (h, w) uint8; boxes: the frame's detections (x0 y0 x1 y1, frame pixels),
        whose corners are left out (BoT-SORT's mask): in a busy scene most corners are on moving objects."""
        small, scale = self._small(luma)
        last, corners = self.last, self.corners
        self.last, self.scale = small, scale
        self.corners = cv2.goodFeaturesToTrack(small, MAX_CORNERS, QUALITY, 6, blockSize=3,
                                               mask=_background(small.shape, boxes, scale))
        if last is None or corners is None or len(corners) < MIN_AGREEING or last.shape != small.shape:
            return None
        found, status, _ = cv2.calcOpticalFlowPyrLK(last, small, corners, None, winSize=(21, 21), maxLevel=3)
        ok = status.reshape(-1) == 1
        if ok.sum() < MIN_AGREEING:
            return None
        affine = _motion(corners[ok].reshape(-1, 2), found[ok].reshape(-1, 2))
        if affine is not None:
            affine[:, 2] *= scale  # the translation in the frame's pixels (the linear part is scale-free)
        return affine

    def _small(self, luma: np.ndarray) -> tuple[np.ndarray, float]:
        height, width = luma.shape[:2]
        if width <= self.width:
            return np.ascontiguousarray(luma), 1.0
        h = max(2, round(height * self.width / width))
        return cv2.resize(luma, (self.width, h), interpolation=cv2.INTER_AREA), width / self.width


def _motion(before: np.ndarray, after: np.ndarray) -> np.ndarray | None:
    """The camera's motion from matched corners (small pixels): a translation (the flows' median, refined over
    those that agree with it) unless a similarity (rotation, zoom) has clearly more corners agreeing with it:
    with few corners, a similarity's scale wanders (a 0.5 % zoom is 10 pixels at a 1080p frame's edge)."""
    flow = after - before
    shift = np.median(flow, axis=0)
    near = np.hypot(*(flow - shift).T) < AGREE_PX
    if near.sum() >= MIN_AGREEING:
        shift = flow[near].mean(axis=0)
    affine, inliers = cv2.estimateAffinePartial2D(before, after, method=cv2.RANSAC, ransacReprojThreshold=AGREE_PX)
    turned = affine is not None and inliers is not None and inliers.sum() > ZOOM_EVIDENCE * max(near.sum(), 1)
    if turned:
        return affine.astype(np.float64)
    if near.sum() < MIN_AGREEING:
        return None
    return np.array([[1.0, 0.0, shift[0]], [0.0, 1.0, shift[1]]])


def _background(shape: tuple[int, int], boxes, scale: float) -> np.ndarray | None:
    """A mask of the picture outside the boxes (None: no boxes)."""
    if boxes is None or not len(boxes):
        return None
    mask = np.full(shape, 255, np.uint8)
    height, width = shape
    cells = np.asarray(boxes, np.float64).reshape(-1, 4) / scale
    x0, y0 = np.clip(np.floor(cells[:, :2]), 0, [width, height]).astype(int).T
    x1, y1 = np.clip(np.ceil(cells[:, 2:]), 0, [width, height]).astype(int).T
    for a, b, c, d in zip(x0.tolist(), y0.tolist(), x1.tolist(), y1.tolist()):
        mask[b:d, a:c] = 0
    return mask
