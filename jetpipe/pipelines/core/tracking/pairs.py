"""The (track, detection) pairs that could match, of many streams' frames at once, and the assignment.

A batch holds frames of several streams; a track may only take a detection of its own stream's frame, and only
one its reach overlaps (every round's test needs the boxes to overlap: IoU with the prediction or the last
observation, the grown expectation of a lost track). The candidates are found by a sweep (detections sorted
by frame and left or top edge, a range of them a track), not by forming every pair: a frame of 100 objects has a few
hundred candidates, not 10,000. A pairwise measure is then one array operation over every candidate of every
frame.

The assignment maximises each frame's summed similarity over its allowed pairs (SciPy's
`linear_sum_assignment`). A pair whose track and detection have no other allowed pair is its own part of the
problem and is taken as is; only the pairs in contention go to the solver, frame by frame.
"""

from __future__ import annotations

import numpy as np

INFEASIBLE = 1e6
_FRAME_STRIDE = 1e7   # frame k's keys are k * stride + x (x within +-4e6: 65,536-pixel frames, boxes grown)
_OFFSET = 4e6


class Candidates:
    """Every same-frame (track, detection) pair whose reaches overlap, ordered by frame, track, detection."""

    def __init__(self, track_reach: np.ndarray, track_frame: np.ndarray, det_reach: np.ndarray,
                 det_frame: np.ndarray, axis: int | None = None):
        """*_reach: (N, 4) x0 y0 x1 y1 boxes a pair's two must overlap; *_frame: each one's frame (0, 1, ...);
        axis: sweep along it (0: x, 1: y), or None: along both, the one with fewer pairs kept (self.axis: the
        axis swept). The pairs are the same either way; only the work differs."""
        empty = np.zeros(0, np.int64)
        self.track, self.det, self.axis = empty, empty, axis
        if not len(track_reach) or not len(det_reach):
            return
        # along x or along y, whichever gives fewer: a frame's widest (or tallest) detection sets every track's
        # range, and rows of wide, low boxes (text lines, a queue seen from the side) cover half a frame's width
        axis, order, low, counts = min(((axis, *_sweep(track_reach, track_frame, det_reach, det_frame, axis))
                                        for axis in ((0, 1) if axis is None else (axis,))),
                                       key=lambda swept: swept[3].sum())
        self.axis = axis
        track = np.repeat(np.arange(len(track_reach)), counts)
        det = order[np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts - low, counts)]
        # the sweep bounds one axis from one side (and the frame: the keys keep frames apart); the rest here,
        # column by column
        other = 1 - axis
        keep = det_reach[det, axis + 2] >= track_reach[track, axis]
        keep &= det_reach[det, other] <= track_reach[track, other + 2]
        keep &= det_reach[det, other + 2] >= track_reach[track, other]
        # track-major, detections in their order: the solver's tie-breaks as a matrix's (already track-major:
        # a stable sort, merging runs, is the quicker)
        ordered = np.sort(track[keep] * len(det_reach) + det[keep], kind="stable")
        self.track, self.det = np.divmod(ordered, len(det_reach))


def _sweep(track_reach, track_frame, det_reach, det_frame, axis: int):
    """The detections sorted by frame and low edge along `axis` (0: x, 1: y), and each track's range of them
    that may overlap it along that axis: (order, first, count)."""
    low_edge, high_edge = det_reach[:, axis], det_reach[:, axis + 2]
    key = det_frame * _FRAME_STRIDE + np.clip(low_edge, -_OFFSET, _OFFSET)
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    widest = np.zeros(int(det_frame.max()) + 1)
    np.maximum.at(widest, det_frame, high_edge - low_edge)
    frames = np.minimum(track_frame, len(widest) - 1)
    base = track_frame * _FRAME_STRIDE
    first = np.searchsorted(sorted_key, base + np.clip(track_reach[:, axis] - widest[frames], -_OFFSET, _OFFSET),
                            "left")
    end = np.searchsorted(sorted_key, base + np.clip(track_reach[:, axis + 2], -_OFFSET, _OFFSET), "right")
    return order, first, np.maximum(end - first, 0)


def load_solver() -> None:
    """SciPy's solver loaded now (the tracker's constructor calls it): its import takes the GIL for about half a
    second, which at the first tracked frame of 16 live cameras dropped frames."""
    import scipy.optimize  # noqa: F401


def assign(track: np.ndarray, det: np.ndarray, similarity: np.ndarray, allowed: np.ndarray,
           track_frame: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The matched (tracks, detections) of allowed pairs that maximise each frame's summed similarity, in
    track order."""
    track, det, similarity = track[allowed], det[allowed], similarity[allowed]
    if not len(track):
        return track, det
    contended = in_contention(track, det)
    alone = ~contended
    rows, cols = [track[alone]], [det[alone]]
    if contended.any():
        found = _solve(track[contended], det[contended], similarity[contended], track_frame)
        rows.append(found[0]), cols.append(found[1])
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    order = np.argsort(rows, kind="stable")
    return rows[order], cols[order]


def in_contention(track: np.ndarray, det: np.ndarray) -> np.ndarray:
    """Which pairs share their track or their detection with another pair. The others are each their own part of
    the problem: matched whatever their similarity."""
    return (np.bincount(track)[track] > 1) | (np.bincount(det)[det] > 1)


def _solve(track, det, similarity, track_frame) -> tuple[np.ndarray, np.ndarray]:
    """The contended pairs' optimum, a solver call a frame: each frame's tracks and detections numbered in
    their order (a frame's matrix), every frame's matrix laid out in one buffer, filled at once."""
    from scipy.optimize import linear_sum_assignment  # loaded by load_solver(), with the tracker

    frame = track_frame[track]
    t_ids, t_at, t_frame = _numbered(track, frame, len(track_frame))
    d_ids, d_at, d_frame = _numbered(det, frame, int(det.max()) + 1)
    frames = t_frame[np.concatenate([[True], t_frame[1:] != t_frame[:-1]])]
    t_first, d_first = np.searchsorted(t_frame, frames), np.searchsorted(d_frame, frames)
    t_n = np.searchsorted(t_frame, frames, "right") - t_first
    d_n = np.searchsorted(d_frame, frames, "right") - d_first
    size = t_n * d_n
    offset = np.cumsum(size) - size
    k = np.searchsorted(frames, frame)  # each pair's frame's place
    cost = np.full(int(size.sum()), INFEASIBLE)
    cost[offset[k] + (t_at - t_first[k]) * d_n[k] + d_at - d_first[k]] = -similarity
    picked = []
    for start, tn, dn in zip(offset.tolist(), t_n.tolist(), d_n.tolist()):
        r, c = linear_sum_assignment(cost[start:start + tn * dn].reshape(tn, dn))
        picked.append(r * dn + c + start)  # the matches as places in the buffer
    picked = np.concatenate(picked)
    picked = picked[cost[picked] < INFEASIBLE]
    k = np.searchsorted(offset, picked, "right") - 1
    r, c = np.divmod(picked - offset[k], d_n[k])
    return t_ids[t_first[k] + r], d_ids[d_first[k] + c]


def _numbered(index: np.ndarray, frame: np.ndarray, span: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct values of `index` (pairs' track rows or detections, below span) ordered by their frame,
    then by value; each pair's place among them; and their frames (ascending)."""
    ids = np.flatnonzero(np.bincount(index, minlength=span))
    frame_of = np.empty(span, np.int64)
    frame_of[index] = frame
    ids = ids[np.argsort(frame_of[ids], kind="stable")]
    place = np.empty(span, np.int64)
    place[ids] = np.arange(len(ids))
    return ids, place[index], frame_of[ids]


def intersection(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row by row: the intersection area of box a[i] and box b[i] (xyxy)."""
    w = np.minimum(a[:, 2], b[:, 2]) - np.maximum(a[:, 0], b[:, 0])
    h = np.minimum(a[:, 3], b[:, 3]) - np.maximum(a[:, 1], b[:, 1])
    return np.maximum(w, 0.0) * np.maximum(h, 0.0)


def area(boxes: np.ndarray) -> np.ndarray:
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row by row IoU of a[i] and b[i]."""
    inter = intersection(a, b)
    return inter / np.maximum(area(a) + area(b) - inter, 1e-12)


def inside(expected: np.ndarray, found: np.ndarray) -> np.ndarray:
    """Row by row: the share of found[i]'s area inside expected[i]."""
    return intersection(expected, found) / np.maximum(area(found), 1e-9)
