"""A straight-line fit (least squares) of each track's positions over the last seconds of the frames' clock, kept
as running sums: a frame adds its sample and takes away those that left the window, so a fit costs a few
array operations over the frame's tracks, not a pass over every sample of every window (12 us an object-frame
that way; see scripts/bench_speed.py cost).

Times and positions are summed relative to a per-track origin (its first sample), set anew from the samples
kept every REORIGIN_S: the sums stay small, and what adding and taking away loses to rounding does not pile up.
"""

from __future__ import annotations

import numpy as np

RING = 96            # samples kept a track: the window at up to 60 fps (a longer one: the last RING)
REORIGIN_S = 600.0   # a track's sums are made anew from its kept samples this often
MIN_SAMPLES = 3
MIN_FIT = 20          # positions a fit keeps however old (a 10 fps camera: 2 s), so few frames do not make it jumpy
EDGE_S = 1e-6        # a sample window_s before the newest is in the window (pts in floating point)


class WindowFits:
    """Rows of running sums (one a track), grown with the table they belong to."""

    def __init__(self):
        self.capacity = 0
        self.ring_t = np.zeros((0, RING))
        self.ring_xy = np.zeros((0, RING, 2))
        self.head = np.zeros(0, np.int64)       # samples written (the next slot: head % RING)
        self.tail = np.zeros(0, np.int64)       # the oldest sample still in the sums
        self.origin_t = np.zeros(0)
        self.origin_xy = np.zeros((0, 2))
        self.s0, self.st, self.stt = np.zeros(0), np.zeros(0), np.zeros(0)
        self.sx, self.stx = np.zeros((0, 2)), np.zeros((0, 2))

    _ROWS = ("ring_t", "ring_xy", "head", "tail", "origin_t", "origin_xy", "s0", "st", "stt", "sx", "stx")

    def grow(self, capacity: int) -> None:
        if capacity <= self.capacity:
            return
        for name in self._ROWS:
            old = getattr(self, name)
            setattr(self, name, np.concatenate([old, np.zeros((capacity - self.capacity, *old.shape[1:]), old.dtype)]))
        self.capacity = capacity

    def clear(self, rows) -> None:
        for name in self._ROWS:
            getattr(self, name)[rows] = 0

    def add(self, rows: np.ndarray, t: np.ndarray, xy: np.ndarray, window: np.ndarray):
        """One sample a row (rows unique): the velocity (N, 2) per second of the row's samples within `window`
        seconds before t (the fit's slope), and whether there are enough for one (MIN_SAMPLES; how much of the
        window they span: span())."""
        kept = self.head[rows] > self.tail[rows]
        newest = self.ring_t[rows, (self.head[rows] - 1) % RING]
        restart = ~kept | (t < newest) | (t - self.origin_t[rows] > REORIGIN_S)
        if restart.any():
            self._restart(rows[restart], t[restart], xy[restart], keep=kept[restart] & (t[restart] >= newest[restart]))
        full = self.head[rows] - self.tail[rows] >= RING
        if full.any():
            self._take_oldest(rows[full])
        slot = self.head[rows] % RING
        self.ring_t[rows, slot], self.ring_xy[rows, slot] = t, xy
        self._sum(rows, t, xy, 1.0)
        self.head[rows] += 1
        while True:  # the samples that left the window: mostly one a frame, more after a gap
            has = self.head[rows] - self.tail[rows] > MIN_FIT
            live = rows[has]
            leaving = live[self.ring_t[live, self.tail[live] % RING] < (t - window)[has] - EDGE_S]
            if not len(leaving):
                return self._velocity(rows)
            self._take_oldest(leaving)

    def span(self, rows: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Seconds from each row's oldest sample in its window to t."""
        return t - self.ring_t[rows, self.tail[rows] % RING]

    def _velocity(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = self.s0[rows]
        safe_n = np.maximum(n, 1.0)
        st = self.st[rows]
        spread = self.stt[rows] - st * st / safe_n
        covariance = self.stx[rows] - st[:, None] * self.sx[rows] / safe_n[:, None]
        enough = (n >= MIN_SAMPLES) & (spread > 1e-12)
        velocity = covariance / np.where(enough, spread, 1.0)[:, None]
        return velocity, enough

    def _sum(self, rows: np.ndarray, t: np.ndarray, xy: np.ndarray, sign: float) -> None:
        tau = t - self.origin_t[rows]
        at = xy - self.origin_xy[rows]
        self.s0[rows] += sign
        self.st[rows] += sign * tau
        self.stt[rows] += sign * tau * tau
        self.sx[rows] += sign * at
        self.stx[rows] += sign * tau[:, None] * at

    def _take_oldest(self, rows: np.ndarray) -> None:
        slot = self.tail[rows] % RING
        self._sum(rows, self.ring_t[rows, slot], self.ring_xy[rows, slot], -1.0)
        self.tail[rows] += 1

    def _restart(self, rows: np.ndarray, t: np.ndarray, xy: np.ndarray, keep: np.ndarray) -> None:
        """Sums from nothing at a new origin (the sample coming): the kept samples summed again where `keep`
        (the origin moved on), dropped where the clock went back or nothing was kept."""
        for name in ("s0", "st", "stt", "sx", "stx"):
            getattr(self, name)[rows] = 0.0
        self.origin_t[rows], self.origin_xy[rows] = t, xy
        for row in rows[~keep].tolist():
            self.head[row] = self.tail[row] = 0
        for row in rows[keep].tolist():  # every REORIGIN_S a track: rare
            slots = np.arange(self.tail[row], self.head[row]) % RING
            one = np.full(len(slots), row)
            self._sum_each(one, self.ring_t[row, slots], self.ring_xy[row, slots])

    def _sum_each(self, rows: np.ndarray, t: np.ndarray, xy: np.ndarray) -> None:
        """_sum for samples of one row (repeated rows: fancy-index += would add once)."""
        row = int(rows[0])
        tau = t - self.origin_t[row]
        at = xy - self.origin_xy[row]
        self.s0[row] += len(t)
        self.st[row] += tau.sum()
        self.stt[row] += (tau * tau).sum()
        self.sx[row] += at.sum(axis=0)
        self.stx[row] += (tau[:, None] * at).sum(axis=0)


def heading_degrees(velocity: np.ndarray) -> np.ndarray:
    return np.degrees(np.arctan2(velocity[:, 1], velocity[:, 0])) % 360.0
