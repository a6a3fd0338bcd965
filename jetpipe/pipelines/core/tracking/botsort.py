"""botsort: a tracker in the BoT-SORT / OC-SORT line, built to keep an object's ID through occlusion.

Per frame, on the frames' clock (pts, seconds):
1. Every track's box is predicted (kalman.py: x, y, w, h and their velocities, the step the frames' own).
2. Confident detections are assigned to the confirmed tracks by an optimal assignment (SciPy's
   `linear_sum_assignment`, not greedy) on IoU with the prediction; a track lost for a while is matched with
   both boxes grown by `buffer` a side (C-BIoU: a prediction drifts while nothing corrects it), and the cost
   adds OC-SORT's direction consistency (`inertia`): a detection in the direction the track was observed to
   move is preferred over one behind it, which is what keeps two crossing objects apart.
3. ByteTrack's second round: weak detections (occluded, blurred) continue tracks seen in the last frame.
4. OC-SORT's recovery round: what is left is matched by IoU with each track's *last observation*, not its
   prediction: an object that stopped behind an occluder is found where it was last seen.
5. A track found again after frames without a detection starts its filter over at the new box, moving at the
   speed it was observed to move before the gap (OC-SORT's point), not what the filter drifted to while the
   object was hidden.
6. New tracks start from detections at or above `new_track` and are confirmed (given an ID) by a match in the
   next frame; the stream's first frame confirms at once. IDs count up per stream, never reused. A track
   unseen for `max_lost_s` seconds of the frames' clock is dropped: a 10 fps and a 30 fps camera keep a track
   for the same time.

The tracks are a table of arrays (no object a track): a frame's work is a few array operations over all its
tracks and detections, the same at 5 boxes and at 100.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jetpipe.pipelines.core.tracking import kalman
from jetpipe.tasks.agreement_metrics import intersection_matrix, iou_matrix
from jetpipe.tasks.detections import NO_TRACK

HISTORY = 32         # observations kept a track: its direction, its edges' speed and its full size
INFEASIBLE = 1e6
LOST_WEIGHT = 0.5    # a lost track's similarity counts this much beside a track seen in the last frame
EDGE_NEAR, EDGE_FAR, CENTRE = 0, 1, 2  # what a track's motion along an axis is measured on
MOVING = 0.2         # along an axis, a box whose centre moves less than this share of its size a second stands


@dataclass(frozen=True)
class BotSortParams:
    high: float = 0.5          # detections at or above: the first round, and new tracks
    low: float = 0.1           # below: ignored; between: the second round only
    new_track: float = 0.6     # a detection starts a track at or above this score
    match_iou: float = 0.2     # first round: IoU with the prediction at least this
    lost_iou: float = 0.1      # a lost track: IoU of its grown expectation and the grown detection at least this
    low_iou: float = 0.5       # second round (weak detections): stricter
    recover_iou: float = 0.3   # recovery round: IoU with the last observation
    confirm_iou: float = 0.3   # a new track's second detection
    max_lost_s: float = 3.0    # seconds of the frames' clock a track survives unseen
    buffer: float = 0.3        # a lost track's and the detections' boxes grown by this much of their size a side
    inertia: float = 0.2       # weight of the direction consistency (OC-SORT's)
    delta_s: float = 0.1       # the direction is measured between observations at least this far apart
    motion_s: float = 0.5      # a lost track goes on at the speed its boxes' edges moved over this span, at
    #                            the largest size it was seen at in it
    cover: float = 0.6         # a lost track takes a detection lying this much inside where it should be

    def __post_init__(self):
        for name in ("high", "low", "new_track", "match_iou", "lost_iou", "low_iou", "recover_iou", "confirm_iou",
                     "buffer", "inertia"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"botsort {name} {getattr(self, name)}: from 0 to 1")
        if not 0.0 < self.max_lost_s <= 60.0 or not 0.0 < self.delta_s <= 5.0 or not 0.0 < self.motion_s <= 5.0:
            raise ValueError(f"botsort max_lost_s {self.max_lost_s} (0-60 s), delta_s {self.delta_s} and motion_s "
                             f"{self.motion_s} (0-5 s)")
        if not 0.0 <= self.cover <= 1.0:
            raise ValueError(f"botsort cover {self.cover}: from 0 to 1")


class BotSort:
    """One stream's tracker; update() once per frame, in frame order."""

    def __init__(self, params: BotSortParams | None = None, next_id: int = 1):
        self.params = params or BotSortParams()
        self.next_id = next_id
        self.frames = 0
        self.t: float | None = None      # the last frame's time
        self.dt = kalman.REFERENCE_S     # the last step between frames (where the clock jumps back: this)
        self.mean, self.cov = np.zeros((0, 8)), np.zeros((0, 8, 8))
        self.obs = np.zeros((0, 4))       # the last observed box
        self.obs_t = np.zeros(0)          # when
        self.hist = np.zeros((0, HISTORY, 4))                 # the last observations' boxes, oldest first
        self.hist_t = np.full((0, HISTORY), -np.inf)          # and times
        self.ids = np.zeros(0, np.int64)  # 0: not confirmed yet
        self.hits = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.ids)

    def update(self, boxes, scores, t: float) -> np.ndarray:
        """Track IDs (int64, NO_TRACK: no confirmed track) for this frame's detections at time t (seconds)."""
        boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
        scores = np.asarray(scores, np.float64).reshape(-1)
        dt = self._step(float(t))
        self.mean, self.cov = kalman.predict(self.mean, self.cov, dt)
        out = np.full(len(boxes), NO_TRACK, np.int64)
        p = self.params
        high, low = scores >= p.high, (scores >= p.low) & (scores < p.high)
        lost = self.obs_t < self.t - 1.5 * dt  # not seen in the last frame
        confirmed = self.ids > 0
        predicted = kalman.xyxy(self.mean)
        track_free, det_free = np.ones(len(self.ids), bool), np.ones(len(boxes), bool)
        rows, cols = [], []

        def take(r, c) -> None:
            track_free[r], det_free[c] = False, False
            rows.append(r), cols.append(c)

        take(*self._first_round(np.flatnonzero(confirmed), np.flatnonzero(high), boxes, scores, lost, predicted))
        for tracks, dets, against, threshold in (
                (confirmed & ~lost, low, predicted, p.low_iou),      # ByteTrack's weak detections
                (confirmed, high, self.obs, p.recover_iou),          # OC-SORT's recovery by the last observation
                (~confirmed, high, predicted, p.confirm_iou)):       # new tracks' second detection
            t_idx, d_idx = np.flatnonzero(tracks & track_free), np.flatnonzero(dets & det_free)
            r, c = _assign_iou(against[t_idx], boxes[d_idx], threshold)
            take(t_idx[r], d_idx[c])
        high_left = np.flatnonzero(high & det_free)

        rows, cols = np.concatenate(rows).astype(np.int64), np.concatenate(cols).astype(np.int64)
        self._observe(rows, boxes[cols], lost[rows])
        out[cols] = np.where(self.ids[rows] > 0, self.ids[rows], NO_TRACK)
        matched = np.zeros(len(self.ids), bool)
        matched[rows] = True
        # an unconfirmed track had one chance (the next frame); a confirmed one lives max_lost_s unseen
        keep = (matched | (self.ids > 0)) & (self.t - self.obs_t <= p.max_lost_s)
        self._keep(keep)
        starts = high_left[scores[high_left] >= p.new_track]
        self._start(boxes[starts])
        if self.frames == 0:  # the stream's first frame: nothing to confirm against
            out[starts] = self._confirm(np.arange(len(self.ids) - len(starts), len(self.ids)))
        self.frames += 1
        return out

    # -- the rounds -----------------------------------------------------------------------------------------------
    def _first_round(self, tracks, dets, boxes, scores, lost, predicted) -> tuple[np.ndarray, np.ndarray]:
        """Confirmed tracks against confident detections: IoU (grown boxes for lost tracks) plus direction."""
        if not len(tracks) or not len(dets):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        p = self.params
        predicted, found = predicted[tracks], boxes[dets]
        iou = iou_matrix(predicted, found)
        allowed = iou >= p.match_iou
        was_lost = lost[tracks]
        if was_lost.any():  # where it should be now, by its observed motion, its boxes grown: a prediction drifts
            expected = self._expected(tracks[was_lost])
            grown = iou_matrix(_grown(expected, p.buffer), _grown(found, p.buffer))
            inside = _inside(expected, found)  # a detection of the part of it coming out from behind something
            iou[was_lost] = LOST_WEIGHT * np.maximum(grown, inside)
            allowed[was_lost] = (grown >= p.lost_iou) | (inside >= p.cover)
        similarity = iou + self._direction_agreement(tracks, found, scores[dets])
        r, c = _assign(similarity, allowed)
        return tracks[r], dets[c]

    def _motion(self, rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each track's observed motion over the last motion_s, per axis: velocity (px/s), what it is measured
        on (EDGE_NEAR: left / top, EDGE_FAR: right / bottom, CENTRE) and its largest size seen (width,
        height). Along an axis it moves on, its motion is the faster edge's: where one edge stopped and the
        other moved on, the object is going behind (or coming out from behind) something, and the moving edge
        is the one still on it. Along an axis it does not move on (less than MOVING of its size a second),
        the centre's: a detector's box edges wobble apart as an object is cut, and either edge alone would
        carry the box off."""
        hist_t, hist = self.hist_t[rows], self.hist[rows]
        last_t, n = hist_t[:, -1], np.arange(len(rows))
        pick = _earlier_observation(hist_t, self.params.motion_s)
        span = np.maximum(last_t - hist_t[n, pick], 1e-9)
        edges = (hist[:, -1] - hist[n, pick]) / span[:, None]            # x0 y0 x1 y1 speeds
        edges[pick == HISTORY - 1] = 0.0                                  # one observation: standing
        near, far = edges[:, :2], edges[:, 2:]
        window = np.isfinite(hist_t) & (hist_t >= (last_t - self.params.motion_s)[:, None])
        sizes = np.where(window[..., None], hist[..., 2:] - hist[..., :2], 0.0).max(axis=1)
        centre = (near + far) / 2
        moving = np.abs(centre) > MOVING * sizes
        anchor = np.where(moving, np.where(np.abs(far) > np.abs(near), EDGE_FAR, EDGE_NEAR), CENTRE)
        velocity = np.where(anchor == EDGE_FAR, far, np.where(anchor == EDGE_NEAR, near, centre))
        return velocity, anchor, sizes

    def _expected(self, rows) -> np.ndarray:
        """Where lost tracks' objects should be now, whole: what they were seen moving on (an edge, or the
        centre) carried on at its speed since the last observation, the box at its largest size seen."""
        velocity, anchor, sizes = self._motion(rows)
        last = self.obs[rows]
        moved = velocity * (self.t - self.obs_t[rows])[:, None]
        centre = (last[:, :2] + last[:, 2:]) / 2 + moved - sizes / 2
        start = np.where(anchor == EDGE_FAR, last[:, 2:] + moved - sizes,
                         np.where(anchor == EDGE_NEAR, last[:, :2] + moved, centre))
        return np.concatenate([start, start + sizes], axis=1)

    def _direction_agreement(self, tracks, found, scores) -> np.ndarray:
        """OC-SORT's inertia term, (tracks, detections): + where a detection lies in the direction the track was
        observed moving, - behind it (at most inertia / 2 either way, weighted by the detection's score); 0 for
        tracks with one observation."""
        p = self.params
        if p.inertia == 0:
            return 0.0
        hist_t, hist = self.hist_t[tracks], self.hist[tracks]
        pick = _earlier_observation(hist_t, p.delta_s)
        has = np.isfinite(hist_t[np.arange(len(tracks)), pick]) & (pick < HISTORY - 1)
        start = _centres(hist[np.arange(len(tracks)), pick])
        end = _centres(hist[:, -1])
        direction = _unit(end - start)
        towards = _unit(_centres(found)[None, :, :] - end[:, None, :])
        cos = np.clip(np.sum(direction[:, None, :] * towards, axis=2), -1.0, 1.0)
        agreement = (np.pi / 2 - np.arccos(cos)) / np.pi * p.inertia * scores[None, :]
        agreement[~has] = 0.0
        return agreement

    # -- the table ------------------------------------------------------------------------------------------------
    def _step(self, t: float) -> float:
        """Seconds since the last frame; a clock that stood still or went back (a looped file) counts one step."""
        if self.t is not None and t > self.t:
            self.dt = t - self.t
        step = self.dt if self.t is not None else 0.0
        if self.t is not None and t <= self.t:
            t = self.t + self.dt
        self.t = t
        return step

    def _observe(self, rows, boxes, was_lost) -> None:
        """The matched tracks' filters corrected by their detections (found again after a gap: started over,
        _restart), their observations and hits recorded, and those with a second hit confirmed."""
        if not len(rows):
            return
        steady = ~was_lost
        self.mean[rows[steady]], self.cov[rows[steady]] = kalman.update(self.mean[rows[steady]],
                                                                        self.cov[rows[steady]], boxes[steady])
        if was_lost.any():
            self._restart(rows[was_lost], boxes[was_lost])
        self.obs[rows], self.obs_t[rows] = boxes, self.t
        self.hist[rows] = np.concatenate([self.hist[rows, 1:], boxes[:, None, :]], axis=1)
        self.hist_t[rows] = np.concatenate([self.hist_t[rows, 1:], np.full((len(rows), 1), self.t)], axis=1)
        self.hits[rows] += 1
        new = rows[(self.ids[rows] == 0) & (self.hits[rows] >= 2)]
        self._confirm(new)

    def _restart(self, rows, boxes) -> None:
        """Tracks found again after a gap: their filters start over at the new boxes, moving at the speed their
        edges were observed to move before the gap (OC-SORT's point: what was observed, not what the filter
        drifted to while the object was hidden)."""
        velocity, _, _ = self._motion(rows)
        mean, cov = kalman.initiate(boxes)
        mean[:, 4:6] = velocity * kalman.REFERENCE_S
        self.mean[rows], self.cov[rows] = mean, cov

    def _confirm(self, rows) -> np.ndarray:
        """The stream's next IDs for these tracks (IDs are never reused)."""
        ids = np.arange(self.next_id, self.next_id + len(rows), dtype=np.int64)
        self.ids[rows] = ids
        self.next_id += len(rows)
        return ids

    def _start(self, boxes) -> None:
        n = len(boxes)
        if not n:
            return
        mean, cov = kalman.initiate(boxes)
        hist_t = np.full((n, HISTORY), -np.inf)
        hist_t[:, -1] = self.t
        hist = np.zeros((n, HISTORY, 4))
        hist[:, -1] = boxes
        for name, value in (("mean", mean), ("cov", cov), ("obs", boxes),
                            ("obs_t", np.full(n, self.t)), ("hist", hist), ("hist_t", hist_t),
                            ("ids", np.zeros(n, np.int64)), ("hits", np.ones(n, np.int64))):
            setattr(self, name, np.concatenate([getattr(self, name), value]))

    def _keep(self, keep) -> None:
        for name in ("mean", "cov", "obs", "obs_t", "hist", "hist_t", "ids", "hits"):
            setattr(self, name, getattr(self, name)[keep])


def _earlier_observation(hist_t: np.ndarray, span: float) -> np.ndarray:
    """Per track (rows of observation times, oldest first), the column of the newest observation at least
    `span` seconds before its last; else of the oldest there is (the last itself where it is the only one)."""
    earlier = hist_t[:, :-1] <= (hist_t[:, -1] - span)[:, None]
    return np.where(earlier.any(axis=1), HISTORY - 2 - np.argmax(earlier[:, ::-1], axis=1),
                    np.argmax(np.isfinite(hist_t), axis=1))


def _assign(similarity: np.ndarray, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The assignment that maximises the summed similarity over the allowed pairs (rows, columns)."""
    from scipy.optimize import linear_sum_assignment  # SciPy loads once, with the first tracked frame

    if not similarity.size or not allowed.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    rows, cols = linear_sum_assignment(np.where(allowed, -similarity, INFEASIBLE))
    ok = allowed[rows, cols]
    return rows[ok], cols[ok]


def _assign_iou(a: np.ndarray, b: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    if not len(a) or not len(b):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    iou = iou_matrix(a, b)
    return _assign(iou, iou >= threshold)


def _grown(boxes: np.ndarray, buffer: float) -> np.ndarray:
    wh = boxes[:, 2:] - boxes[:, :2]
    return np.concatenate([boxes[:, :2] - buffer * wh, boxes[:, 2:] + buffer * wh], axis=1)


def _inside(expected: np.ndarray, found: np.ndarray) -> np.ndarray:
    """(expected, found): the share of each found box's area inside each expected box."""
    area = np.prod(found[:, 2:] - found[:, :2], axis=1)
    return intersection_matrix(expected, found) / np.maximum(area, 1e-9)[None, :]


def _centres(boxes: np.ndarray) -> np.ndarray:
    return (boxes[..., :2] + boxes[..., 2:]) / 2


def _unit(v: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(v, axis=-1, keepdims=True)
    return np.where(norm > 1e-9, v / np.maximum(norm, 1e-9), 0.0)
