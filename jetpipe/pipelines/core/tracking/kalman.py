"""A constant-velocity Kalman filter of boxes on the frames' clock, for a whole table of tracks at once.

State (cx, cy, w, h, and their velocities), BoT-SORT's parametrisation: width and height filtered apart (a
box that changes shape, a person turning, is followed), the noise in proportion to the box's size (small and
large objects alike). Time is in seconds of the frames' clock; the noise is ByteTrack's per 1/30 s, scaled by
the step, so a 10 fps and a 30 fps camera behave alike (the motion between two frames of the 10 fps camera is
three steps of the 30 fps one).
"""

from __future__ import annotations

import numpy as np

REFERENCE_S = 1 / 30   # the time step the noise weights are tuned at (ByteTrack's, BoT-SORT's: 30 fps)
POSITION, VELOCITY = 1 / 20, 1 / 160
_H = np.eye(4, 8)
# a covariance whose coordinates do not mix (each of x, y, w, h only with its own velocity: the filter keeps it so
# from a new track on, unless a camera's rotation is applied to it) is four 2 x 2 blocks: these 16 entries, in the
# order pp (x y w h), pv, vp, vv
BLOCK_ROWS = np.array([0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7])
BLOCK_COLS = np.array([0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7])


def blocks_of(cov: np.ndarray) -> np.ndarray:
    """(n, 8, 8) covariances -> their blocks' 16 entries (n, 16), in BLOCK_ROWS, BLOCK_COLS order."""
    return cov[:, BLOCK_ROWS, BLOCK_COLS]


def from_blocks(blocks: np.ndarray) -> np.ndarray:
    """blocks_of's inverse for covariances whose coordinates do not mix (the other 48 entries 0)."""
    cov = np.zeros((len(blocks), 8, 8))
    cov[:, BLOCK_ROWS, BLOCK_COLS] = blocks
    return cov


def _by_size(weight: float, w: np.ndarray, h: np.ndarray) -> np.ndarray:
    """A noise's standard deviations for x, y, w, h: `weight` of the box's width or height (ByteTrack's)."""
    return np.stack([weight * w, weight * h, weight * w, weight * h], axis=1)


def xywh(boxes: np.ndarray) -> np.ndarray:
    """x0 y0 x1 y1 rows -> centre x, centre y, width, height rows."""
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    return np.stack([boxes[:, 0] + w / 2, boxes[:, 1] + h / 2, w, h], axis=1)


def xyxy(states: np.ndarray) -> np.ndarray:
    """Filter states (or cx cy w h rows) -> x0 y0 x1 y1 rows."""
    cx, cy, w, h = states[:, 0], states[:, 1], np.maximum(states[:, 2], 1e-3), np.maximum(states[:, 3], 1e-3)
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)


def initiate(boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Means and covariances of new tracks at these boxes, standing still."""
    z = xywh(boxes)
    mean = np.concatenate([z, np.zeros_like(z)], axis=1)
    w, h = z[:, 2], z[:, 3]
    std = np.concatenate([_by_size(2 * POSITION, w, h), _by_size(10 * VELOCITY, w, h)], axis=1)
    cov = np.zeros((len(boxes), 8, 8))
    cov[:, np.arange(8), np.arange(8)] = std ** 2
    return mean, cov


def predict(mean: np.ndarray, cov: np.ndarray, dt) -> tuple[np.ndarray, np.ndarray]:
    """Every row `dt` seconds on (a number, or one a row: tracks of streams at other rates; velocities in
    pixels per REFERENCE_S). The transition F = [[I, s I], [0, I]] (s: steps of REFERENCE_S) applied by blocks:
    F P F' = [[A + s (B + C) + s^2 D, B + s D], [C + s D, D]] for P = [[A, B], [C, D]]."""
    if not len(mean):
        return mean, cov
    steps = np.broadcast_to(np.asarray(dt, np.float64) / REFERENCE_S, (len(mean),))
    s = steps[:, None, None]
    w, h = mean[:, 2], mean[:, 3]
    std = np.concatenate([_by_size(POSITION, w, h), _by_size(VELOCITY, w, h)], axis=1)
    mean = mean.copy()
    mean[:, :4] += steps[:, None] * mean[:, 4:]
    a, b, c, d = cov[:, :4, :4], cov[:, :4, 4:], cov[:, 4:, :4], cov[:, 4:, 4:]
    out = np.empty_like(cov)
    out[:, :4, :4] = a + s * (b + c) + s * s * d
    out[:, :4, 4:] = b + s * d
    out[:, 4:, :4] = c + s * d
    out[:, 4:, 4:] = d
    out[:, np.arange(8), np.arange(8)] += steps[:, None] * std ** 2
    return mean, out


def update(mean: np.ndarray, cov: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows corrected by their measured boxes (one box a row)."""
    if not len(mean):
        return mean, cov
    z = xywh(boxes)
    w, h = mean[:, 2], mean[:, 3]
    r = _by_size(POSITION, w, h)
    s = cov[:, :4, :4].copy()
    s[:, np.arange(4), np.arange(4)] += r ** 2
    gain = cov[:, :, :4] @ inverse4(s)
    mean = mean + (gain @ (z - mean[:, :4])[..., None])[..., 0]
    cov = cov - gain @ cov[:, :4, :]
    return mean, cov


def inverse4(m: np.ndarray) -> np.ndarray:
    """Inverses of (n, 4, 4) matrices by cofactors, each entry computed for all n at once: LAPACK's batched
    inverse pays a call a matrix, and a busy batch holds a thousand tracks (the innovation covariances here
    are well conditioned: box sizes, squared)."""
    (m00, m01, m02, m03, m10, m11, m12, m13,
     m20, m21, m22, m23, m30, m31, m32, m33) = m.reshape(len(m), 16).T.copy()  # rows: contiguous arrays
    s0, s1, s2 = m00 * m11 - m10 * m01, m00 * m12 - m10 * m02, m00 * m13 - m10 * m03
    s3, s4, s5 = m01 * m12 - m11 * m02, m01 * m13 - m11 * m03, m02 * m13 - m12 * m03
    c5, c4, c3 = m22 * m33 - m32 * m23, m21 * m33 - m31 * m23, m21 * m32 - m31 * m22
    c2, c1, c0 = m20 * m33 - m30 * m23, m20 * m32 - m30 * m22, m20 * m31 - m30 * m21
    r = 1.0 / (s0 * c5 - s1 * c4 + s2 * c3 + s3 * c2 - s4 * c1 + s5 * c0)
    entries = (m11 * c5 - m12 * c4 + m13 * c3, -m01 * c5 + m02 * c4 - m03 * c3,
               m31 * s5 - m32 * s4 + m33 * s3, -m21 * s5 + m22 * s4 - m23 * s3,
               -m10 * c5 + m12 * c2 - m13 * c1, m00 * c5 - m02 * c2 + m03 * c1,
               -m30 * s5 + m32 * s2 - m33 * s1, m20 * s5 - m22 * s2 + m23 * s1,
               m10 * c4 - m11 * c2 + m13 * c0, -m00 * c4 + m01 * c2 - m03 * c0,
               m30 * s4 - m31 * s2 + m33 * s0, -m20 * s4 + m21 * s2 - m23 * s0,
               -m10 * c3 + m11 * c1 - m12 * c0, m00 * c3 - m01 * c1 + m02 * c0,
               -m30 * s3 + m31 * s1 - m32 * s0, m20 * s3 - m21 * s1 + m22 * s0)
    return (np.stack(entries) * r).T.reshape(len(m), 4, 4)


def predict_blocks(mean: np.ndarray, blocks: np.ndarray, dt) -> tuple[np.ndarray, np.ndarray]:
    """predict() of rows whose covariance is four 2 x 2 blocks (BLOCK_ROWS, BLOCK_COLS: (n, 16)), on those 16
    entries alone: every operation predict() makes on them, in its order (the same numbers to the bit; the
    other 48 stay 0)."""
    if not len(mean):
        return mean, blocks
    steps = np.broadcast_to(np.asarray(dt, np.float64) / REFERENCE_S, (len(mean),))
    s = steps[:, None]
    w, h = mean[:, 2], mean[:, 3]
    std_p, std_v = _by_size(POSITION, w, h), _by_size(VELOCITY, w, h)
    mean = mean.copy()
    mean[:, :4] += s * mean[:, 4:]
    pp, pv, vp, vv = blocks[:, 0:4], blocks[:, 4:8], blocks[:, 8:12], blocks[:, 12:16]
    out = np.empty_like(blocks)
    out[:, 0:4] = pp + s * (pv + vp) + s * s * vv + s * std_p ** 2
    out[:, 4:8] = pv + s * vv
    out[:, 8:12] = vp + s * vv
    out[:, 12:16] = vv + s * std_v ** 2
    return mean, out


def update_blocks(mean: np.ndarray, blocks: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """update() of rows whose covariance is four 2 x 2 blocks, on their 16 entries: the innovation covariance
    is diagonal, its inverse4() the four products below, the gain two entries a coordinate (the same numbers
    to the bit)."""
    if not len(mean):
        return mean, blocks
    z = xywh(boxes)
    w, h = mean[:, 2], mean[:, 3]
    r = _by_size(POSITION, w, h)
    pp, pv, vp, vv = blocks[:, 0:4], blocks[:, 4:8], blocks[:, 8:12], blocks[:, 12:16]
    m = pp + r ** 2
    s0, c5 = m[:, 0] * m[:, 1], m[:, 2] * m[:, 3]  # inverse4's, its other cofactors 0
    scale = 1.0 / (s0 * c5)
    inverse = np.stack([m[:, 1] * c5, m[:, 0] * c5, m[:, 3] * s0, m[:, 2] * s0], axis=1) * scale[:, None]
    gain_p, gain_v = pp * inverse, vp * inverse
    innovation = z - mean[:, :4]
    mean = mean + np.concatenate([gain_p * innovation, gain_v * innovation], axis=1)
    out = np.empty_like(blocks)
    out[:, 0:4], out[:, 4:8] = pp - gain_p * pp, pv - gain_p * pv
    out[:, 8:12], out[:, 12:16] = vp - gain_v * pp, vv - gain_v * pv
    return mean, out
