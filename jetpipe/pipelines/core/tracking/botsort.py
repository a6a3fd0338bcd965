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

The tracks of every stream are one table of arrays (no object a track), a column naming each one's stream: a
batch's frames of all streams are one pass of array operations over all their tracks and detections (pairs.py:
the same-frame pairs flat, each frame's block assigned apart), the same at 5 boxes a frame and at 100, at 1
stream and at 16. A stream with two frames in a batch has them in two passes, in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jetpipe.geometry import boxes_through
from jetpipe.pipelines.core.tracking import kalman, looks, pairs
from jetpipe.pipelines.core.tracking.columns import TrackColumns
from jetpipe.pipelines.core.tracking.looks import PassLooks
from jetpipe.tasks.detections import NO_TRACK

HISTORY = 32         # observations kept a track: its direction, its edges' speed and its full size (a ring: the
#                      k-th observation in column k % HISTORY, read by their times, which rise)
SWEEP_CHECK = 32     # passes between looks at which axis the candidates' sweep is cheaper along (a scene's layout
#                      changes slowly; the pairs are the same along either)
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
    # with looks (update's embed: appearance.py; how they are used: looks.py)
    look_weight: float = 1.0   # first round: the looks' evidence (looks.py) adds up to this to a pair's similarity
    look_veto: float = 8.0     # ... and evidence below minus this (two objects) forbids the pair
    look_min: float = 2.0      # appearance round: a lost track takes a detection with at least this evidence
    look_reach: float = 1.5    # ... along its way from where it was last seen, within this many of its largest side
    look_every_s: float = 1.0  # a track's look is refreshed when older than this
    look_lost_s: float = 10.0  # a lost track with a look is remembered this long (past max_lost_s: by its look only)
    look_alpha: float = 0.9    # of a track's look, the old kept at a refresh (BoT-SORT's)

    def __post_init__(self):
        for name in ("high", "low", "new_track", "match_iou", "lost_iou", "low_iou", "recover_iou", "confirm_iou",
                     "buffer", "inertia", "look_alpha"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"botsort {name} {getattr(self, name)}: from 0 to 1")
        if not 0.0 < self.max_lost_s <= 60.0 or not 0.0 < self.delta_s <= 5.0 or not 0.0 < self.motion_s <= 5.0:
            raise ValueError(f"botsort max_lost_s {self.max_lost_s} (0-60 s), delta_s {self.delta_s} and motion_s "
                             f"{self.motion_s} (0-5 s)")
        if not 0.0 <= self.cover <= 1.0:
            raise ValueError(f"botsort cover {self.cover}: from 0 to 1")
        if not 0.0 <= self.look_reach <= 10.0 or not 0.0 < self.look_every_s <= 60.0 or \
                not self.max_lost_s <= self.look_lost_s <= 600.0:
            raise ValueError(f"botsort look_reach {self.look_reach} (0-10 sizes), look_every_s {self.look_every_s} "
                             f"(0-60 s), look_lost_s {self.look_lost_s} (max_lost_s to 600 s)")
        if not 0.0 <= self.look_weight <= 5.0 or not 0.0 <= self.look_min <= 50.0 or not 0.0 <= self.look_veto <= 50.0:
            raise ValueError(f"botsort look_weight {self.look_weight} (0-5), look_min {self.look_min} and look_veto "
                             f"{self.look_veto} (0-50: log-likelihood ratios)")


class BotSortTable(TrackColumns):
    """Every stream's tracks; update() once per batch, a stream's frames in their order."""

    def __init__(self, params: BotSortParams | None = None, first_ids: list[int] | None = None):
        """first_ids: each stream slot's first track ID (a restarted worker's go on; default 1)."""
        self.params = params or BotSortParams()
        pairs.load_solver()
        super().__init__(HISTORY)
        self.look_stats = looks.LookStats()  # what a look's cosine says in this scene
        self.sweep_axis, self.passes = None, 0
        # per slot: the last frame's time (NaN: none yet), the last step, frames seen, the next ID
        self.clock_t, self.clock_dt = np.zeros(0), np.zeros(0)
        self.frames, self.next_id = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self._slots(max(len(first_ids or ()), 1))
        if first_ids:
            self.next_id[:len(first_ids)] = first_ids

    def _slots(self, count: int) -> None:
        more = count - len(self.frames)
        if more > 0:
            self.clock_t = np.concatenate([self.clock_t, np.full(more, np.nan)])
            self.clock_dt = np.concatenate([self.clock_dt, np.full(more, kalman.REFERENCE_S)])
            self.frames = np.concatenate([self.frames, np.zeros(more, np.int64)])
            self.next_id = np.concatenate([self.next_id, np.ones(more, np.int64)])

    def reset(self, slot: int, next_id: int = 1) -> None:
        """A new stream takes `slot`: the old one's tracks go, its clock and IDs start over."""
        self._slots(slot + 1)
        self._keep(self.slot != slot)
        self.clock_t[slot], self.clock_dt[slot] = np.nan, kalman.REFERENCE_S
        self.frames[slot], self.next_id[slot] = 0, next_id

    def update(self, frames: list, embed=None) -> list[np.ndarray]:
        """frames: (slot, boxes (N, 4), scores (N,), t seconds[, motion]) of a batch, a slot's in their order;
        motion: the camera's, a 2 x 3 affine from the slot's last frame's pixels to this one's (None or left
        out: a fixed camera); embed([(frame index, boxes (m, 4))]) -> the boxes' looks, unit rows (looks.py;
        None: by motion only). Each frame's track IDs (int64, NO_TRACK: no confirmed track), one a box."""
        out: list = [None] * len(frames)
        waves: dict[int, list[int]] = {}
        seen: dict[int, int] = {}
        for k, (slot, *_rest) in enumerate(frames):  # a slot's second frame goes in the second pass
            seen[slot] = seen.get(slot, -1) + 1
            waves.setdefault(seen[slot], []).append(k)
        self._slots(max(slot for slot, *_ in frames) + 1 if frames else 0)
        for wave in waves.values():
            for k, ids in zip(wave, self._pass([frames[k] for k in wave], wave, embed)):
                out[k] = ids
        return out

    def _pass(self, frames: list, keys: list[int], embed) -> list[np.ndarray]:
        """One frame of each of some slots (keys: their indices in update's frames, for embed)."""
        p = self.params
        slots = np.array([f[0] for f in frames], np.int64)
        boxes = [np.asarray(f[1], np.float64).reshape(-1, 4) for f in frames]
        counts = np.array([len(b) for b in boxes])
        boxes = np.concatenate(boxes) if boxes else np.zeros((0, 4))
        scores = np.concatenate([np.asarray(f[2], np.float64).reshape(-1) for f in frames])
        det_frame = np.repeat(np.arange(len(frames)), counts)
        now, dt = self._step(slots, np.array([float(f[3]) for f in frames]))
        frame_of_slot = np.full(len(self.frames) + 1, -1)  # the last entry: DEAD (-1) rows', never a frame
        frame_of_slot[slots] = np.arange(len(frames))
        track_frame = frame_of_slot[self.slot]
        active = track_frame >= 0
        rows = np.flatnonzero(active)
        self._follow_camera(frames, rows, track_frame)
        self._predict(rows, dt[track_frame[rows]])
        track_t = np.where(active, now[np.maximum(track_frame, 0)], np.nan)
        high, low = scores >= p.high, (scores >= p.low) & (scores < p.high)
        lost = active & (self.obs_t < track_t - 1.5 * dt[np.maximum(track_frame, 0)])  # not seen last frame
        confirmed = self.ids > 0
        predicted = kalman.xyxy(self.mean)
        expected = predicted.copy()  # lost tracks: where their observed motion carries them
        lost_rows = np.flatnonzero(lost & confirmed)
        expected[lost_rows] = self._expected(lost_rows, track_t[lost_rows])
        recent = rows[track_t[rows] - self.obs_t[rows] <= p.max_lost_s]  # older: found again by their look only
        pt, pd = _candidates(self, recent, lost[recent], predicted, expected, boxes, track_frame, det_frame)
        seen = PassLooks.none(len(boxes)) if embed is None else looks.fetch(
            self, embed, keys, counts, boxes, looks.wanted(self, pt, pd, boxes, predicted, lost, high, track_t))
        track_free, det_free = np.ones(len(self.ids), bool), np.ones(len(boxes), bool)
        matched_rows, matched_cols = [], []

        def take(r, c) -> None:
            track_free[r], det_free[c] = False, False
            matched_rows.append(r), matched_cols.append(c)

        first = confirmed[pt] & high[pd]
        take(*self._first_round(pt[first], pd[first], boxes, scores, lost, (predicted, expected), track_frame,
                                seen))
        for tracks, dets, against, threshold in (
                (confirmed & ~lost, low, predicted, p.low_iou),  # ByteTrack's weak detections
                (confirmed, high, self.obs, p.recover_iou),      # OC-SORT's recovery by the last observation
                (~confirmed, high, predicted, p.confirm_iou)):   # new tracks' second detection
            use = (tracks & track_free)[pt] & (dets & det_free)[pd]
            rt, rd = pt[use], pd[use]
            similarity = pairs.iou(against[rt], boxes[rd])
            _, unlike = looks.round_looks(self, seen, rt, rd)  # looks that say two objects forbid it here too
            take(*pairs.assign(rt, rd, similarity, (similarity >= threshold) & ~unlike, track_frame))
        if seen.look.shape[1]:  # lost tracks known again by their look
            take(*looks.appearance_round(self, seen, np.flatnonzero(lost & confirmed & track_free), np.flatnonzero(
                high & det_free), boxes, expected, track_frame, det_frame))
        return self._settle(frames, slots, boxes, scores, det_frame, now, (matched_rows, matched_cols), lost,
                            det_free & high, active, seen)

    def _settle(self, frames, slots, boxes, scores, det_frame, now, matched, lost, high_left, active, seen):
        """The matches observed, the tracks that are done dropped, new ones started: each frame's IDs."""
        p = self.params
        rows, cols = (np.concatenate(m).astype(np.int64) for m in matched)
        self._observe(rows, boxes[cols], lost[rows])
        looks.remember(self, rows, cols, seen)
        out = np.full(len(boxes), NO_TRACK, np.int64)
        out[cols] = np.where(self.ids[rows] > 0, self.ids[rows], NO_TRACK)
        matched_mask = np.zeros(len(self.ids), bool)
        matched_mask[rows] = True
        # an unconfirmed track had one chance (the next frame); a confirmed one lives max_lost_s unseen, or
        # look_lost_s with a look
        unseen = self.clock_t[self.slot] - self.obs_t
        remembered = (unseen <= p.max_lost_s) | (np.isfinite(self.look_t) & (unseen <= p.look_lost_s))
        done = active & ~((matched_mask | (self.ids > 0)) & remembered)
        self._keep(~done)
        starts = np.flatnonzero(high_left & (scores >= p.new_track))
        first_frame = self.frames[slots][det_frame[starts]] == 0  # a stream's first frame confirms at once
        new_rows = self._start(boxes[starts], slots[det_frame[starts]], now[det_frame[starts]])
        looks.remember(self, new_rows, starts, seen)
        out[starts[first_frame]] = self._confirm(new_rows[first_frame])
        self.frames[slots] += 1
        ends = np.cumsum([len(f[1]) for f in frames]).tolist()
        return [out[end - len(f[1]):end] for f, end in zip(frames, ends)]

    # -- the rounds -----------------------------------------------------------------------------------------------
    def _first_round(self, track, det, boxes, scores, lost, predicted_expected, track_frame, seen):
        """Confirmed tracks against confident detections (pairs: track rows, detection indices): IoU with the
        prediction (grown boxes of the expectation for lost tracks) plus direction and look. The matches."""
        p = self.params
        predicted, expected = predicted_expected
        found = boxes[det]
        similarity = pairs.iou(predicted[track], found)
        allowed = similarity >= p.match_iou
        was_lost = lost[track]
        if was_lost.any():  # where it should be now, by its observed motion, its boxes grown: a prediction drifts
            at, hidden = expected[track[was_lost]], found[was_lost]
            grown = pairs.iou(_grown(at, p.buffer), _grown(hidden, p.buffer))
            inside = pairs.inside(at, hidden)  # a detection of the part of it coming out from behind something
            similarity[was_lost] = LOST_WEIGHT * np.maximum(grown, inside)
            allowed[was_lost] = (grown >= p.lost_iou) | (inside >= p.cover)
        # the rest only for the pairs the boxes allow (about one in four of the candidates in a crowd)
        keep = np.flatnonzero(allowed)
        track, det, similarity = track[keep], det[keep], similarity[keep]
        by_look, unlike = looks.round_looks(self, seen, track, det)
        allowed = ~unlike  # looks that say two objects: not them
        # the direction only where it can change the matches: a pair alone (its track and its detection in no
        # other allowed pair) is matched whatever its similarity
        weigh = np.flatnonzero(allowed)[pairs.in_contention(track[allowed], det[allowed])]
        direction = np.zeros(len(track))
        direction[weigh] = _direction_agreement(self, track[weigh], found[keep[weigh]], scores[det[weigh]])
        return pairs.assign(track, det, similarity + direction + by_look, allowed, track_frame)

    def _motion(self, rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each track's observed motion over the last motion_s, per axis: velocity (px/s), what it is measured
        on (EDGE_NEAR: left / top, EDGE_FAR: right / bottom, CENTRE) and its largest size seen (width,
        height). Along an axis it moves on, its motion is the faster edge's: where one edge stopped and the
        other moved on, the object is going behind (or coming out from behind) something, and the moving edge
        is the one still on it. Along an axis it does not move on (less than MOVING of its size a second),
        the centre's: a detector's box edges wobble apart as an object is cut, and either edge alone would
        carry the box off."""
        hist_t, hist = self.hist_t[rows], self.hist[rows]
        last_t, n = self.obs_t[rows], np.arange(len(rows))
        pick = _earlier_observation(hist_t, last_t, self.hits[rows] % HISTORY, self.params.motion_s)
        span = np.maximum(last_t - hist_t[n, pick], 1e-9)  # infinite where none is earlier: standing
        edges = (self.obs[rows] - hist[n, pick]) / span[:, None]          # x0 y0 x1 y1 speeds
        near, far = edges[:, :2], edges[:, 2:]
        window = np.isfinite(hist_t) & (hist_t >= (last_t - self.params.motion_s)[:, None])
        sizes = np.where(window[..., None], hist[..., 2:] - hist[..., :2], 0.0).max(axis=1)
        centre = (near + far) / 2
        moving = np.abs(centre) > MOVING * sizes
        anchor = np.where(moving, np.where(np.abs(far) > np.abs(near), EDGE_FAR, EDGE_NEAR), CENTRE)
        velocity = np.where(anchor == EDGE_FAR, far, np.where(anchor == EDGE_NEAR, near, centre))
        return velocity, anchor, sizes

    def _known_motion(self, rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """_motion(rows), computed only for the rows whose history changed since it was last asked."""
        stale = rows[~self.moved_known[rows]]
        if len(stale):
            self.moved[stale] = np.concatenate(self._motion(stale), axis=1)
            self.moved_known[stale] = True
        known = self.moved[rows]
        return known[:, 0:2], known[:, 2:4], known[:, 4:6]

    def _expected(self, rows, t) -> np.ndarray:
        """Where lost tracks' objects should be at time t, whole: what they were seen moving on (an edge, or the
        centre) carried on at its speed since the last observation, the box at its largest size seen."""
        velocity, anchor, sizes = self._known_motion(rows)
        last = self.obs[rows]
        moved = velocity * (t - self.obs_t[rows])[:, None]
        centre = (last[:, :2] + last[:, 2:]) / 2 + moved - sizes / 2
        start = np.where(anchor == EDGE_FAR, last[:, 2:] + moved - sizes,
                         np.where(anchor == EDGE_NEAR, last[:, :2] + moved, centre))
        return np.concatenate([start, start + sizes], axis=1)

    # -- the table ------------------------------------------------------------------------------------------------
    def _follow_camera(self, frames, rows, track_frame) -> None:
        """Tracks of slots whose camera moved (a frame's motion) carried into this frame's pixels: their filters,
        last observations and history (BoT-SORT's camera-motion compensation): a pan moves the picture, not the
        objects in it."""
        moving = [(k, np.asarray(f[4], np.float64).reshape(2, 3)) for k, f in enumerate(frames)
                  if len(f) > 4 and f[4] is not None]
        if not moving or not len(rows):
            return
        affine = np.zeros((len(frames), 2, 3))
        affine[:, 0, 0] = affine[:, 1, 1] = 1.0
        for k, motion in moving:
            affine[k] = motion
        rows = rows[np.isin(track_frame[rows], [k for k, _ in moving])]
        _move_tracks(self, rows, affine[track_frame[rows]])

    def _step(self, slots: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each frame's time and the seconds since its slot's last frame; a clock that stood still or went back
        (a looped file) counts one step of the last."""
        last = self.clock_t[slots]
        started = ~np.isnan(last)
        ahead = started & (t > last)
        self.clock_dt[slots[ahead]] = (t - last)[ahead]
        step = np.where(started, self.clock_dt[slots], 0.0)
        now = np.where(started & (t <= last), last + self.clock_dt[slots], t)
        self.clock_t[slots] = now
        return now, step

    def _predict(self, rows, dt) -> None:
        self._filter(rows, kalman.predict_blocks, kalman.predict, dt)

    def _correct(self, rows, boxes) -> None:
        self._filter(rows, kalman.update_blocks, kalman.update, boxes)

    def _filter(self, rows, by_blocks, by_matrices, per_row) -> None:
        """A Kalman step of these rows (per_row: each one's step or box): by their covariance's blocks where
        their coordinates do not mix, else by matrices."""
        mixed = self.mixed[rows]
        if not mixed.any():  # no camera turned: every row by its blocks
            self.mean[rows], self.blocks[rows] = by_blocks(self.mean[rows], self.blocks[rows], per_row)
            return
        plain, whole = rows[~mixed], rows[mixed]
        self.mean[plain], self.blocks[plain] = by_blocks(self.mean[plain], self.blocks[plain], per_row[~mixed])
        self.mean[whole], self.cov[whole] = by_matrices(self.mean[whole], self.cov[whole], per_row[mixed])

    def _observe(self, rows, boxes, was_lost) -> None:
        """The matched tracks' filters corrected by their detections (found again after a gap: started over,
        _restart), their observations and hits recorded, and those with a second hit confirmed."""
        if not len(rows):
            return
        steady = ~was_lost
        self._correct(rows[steady], boxes[steady])
        if was_lost.any():
            self._restart(rows[was_lost], boxes[was_lost])
        t = self.clock_t[self.slot[rows]]
        self.obs[rows], self.obs_t[rows] = boxes, t
        column = self.hits[rows] % HISTORY  # the ring's next (hits: the observations so far)
        self.hist[rows, column], self.hist_t[rows, column] = boxes, t
        self.hits[rows] += 1
        self.moved_known[rows] = False
        self._confirm(rows[(self.ids[rows] == 0) & (self.hits[rows] >= 2)])

    def _restart(self, rows, boxes) -> None:
        """Tracks found again after a gap: their filters start over at the new boxes, moving at the speed their
        edges were observed to move before the gap (OC-SORT's point: what was observed, not what the filter
        drifted to while the object was hidden)."""
        velocity, _, _ = self._known_motion(rows)
        mean, cov = kalman.initiate(boxes)
        mean[:, 4:6] = velocity * kalman.REFERENCE_S
        self.mean[rows], self.blocks[rows], self.mixed[rows] = mean, kalman.blocks_of(cov), False

    def _confirm(self, rows) -> np.ndarray:
        """Each slot's next IDs for these tracks, in their order (IDs are never reused)."""
        slots = self.slot[rows]
        order = np.argsort(slots, kind="stable")
        sorted_slots = slots[order]
        first = np.searchsorted(sorted_slots, sorted_slots)  # where each one's slot's run begins
        ids = np.empty(len(rows), np.int64)
        ids[order] = self.next_id[sorted_slots] + np.arange(len(rows)) - first
        self.ids[rows] = ids
        np.add.at(self.next_id, slots, 1)
        return ids

    def _start(self, boxes, slots, t) -> np.ndarray:
        """New tracks (unconfirmed) at these boxes of these slots: their rows, after every other (the table's
        order is the tracks' age: the solver's tie-breaks and the order IDs are given in)."""
        n = len(boxes)
        if not n:
            return np.zeros(0, np.int64)
        mean, cov = kalman.initiate(boxes)
        hist_t = np.full((n, HISTORY), -np.inf)
        hist_t[:, 0] = t  # the first observation: the ring's first column
        hist = np.zeros((n, HISTORY, 4))
        hist[:, 0] = boxes
        return self._append(n, {"mean": mean, "blocks": kalman.blocks_of(cov), "obs": boxes, "obs_t": t,
                                "hist": hist, "hist_t": hist_t, "ids": 0, "hits": 1, "slot": slots, "look": 0.0,
                                "look_t": -np.inf, "moved_known": False, "mixed": False})


class BotSort:
    """One stream's tracker (a table of one slot); update() once per frame, in frame order."""

    def __init__(self, params: BotSortParams | None = None, next_id: int = 1):
        self.table = BotSortTable(params, [next_id])
        self.params = self.table.params

    def __len__(self) -> int:
        return len(self.table)

    @property
    def t(self) -> float | None:
        t = float(self.table.clock_t[0])
        return None if t != t else t

    def update(self, boxes, scores, t: float) -> np.ndarray:
        """Track IDs (int64, NO_TRACK: no confirmed track) for this frame's detections at time t (seconds)."""
        return self.table.update([(0, boxes, scores, t)])[0]


def _candidates(table: BotSortTable, recent, hidden, predicted, expected, boxes, track_frame, det_frame):
    """The pass's (track row, detection) pairs that some round could match, track-major. A track seen in the
    last frame is matched by IoU with its prediction or its last observation (every threshold above 0: the
    boxes overlap); a lost one (hidden) by its grown expectation against grown detections (buffer). Swept
    apart, the seen tracks' pairs are a third of what growing every box gave (busy text: 2,370 a pass, then
    790 + 370)."""
    p = table.params
    seen, lost = recent[~hidden], recent[hidden]
    grow = 0.0 if min(p.match_iou, p.low_iou, p.recover_iou, p.confirm_iou) > 0 else p.buffer  # 0: IoU 0 counts
    near = _union(predicted[seen], table.obs[seen])
    axis = None if table.passes % SWEEP_CHECK == 0 else table.sweep_axis
    first = pairs.Candidates(_grown(near, grow), track_frame[seen], _grown(boxes, grow), det_frame, axis)
    far = _union(_union(predicted[lost], table.obs[lost]), expected[lost])
    second = pairs.Candidates(_grown(far, p.buffer), track_frame[lost], _grown(boxes, p.buffer), det_frame,
                              first.axis)
    table.sweep_axis, table.passes = second.axis, table.passes + 1
    both = np.concatenate([seen[first.track], lost[second.track]]) * len(boxes)
    both += np.concatenate([first.det, second.det])
    return np.divmod(np.sort(both, kind="stable"), len(boxes))  # two sorted runs: merged


def _direction_agreement(table: BotSortTable, track, found, scores) -> np.ndarray:
    """OC-SORT's inertia term, a pair each: + where the detection lies in the direction the track was
    observed moving, - behind it (at most inertia / 2 either way, weighted by the detection's score); 0 for
    tracks with one observation."""
    p = table.params
    if p.inertia == 0 or not len(track):
        return 0.0
    tracks, at = _distinct(track)
    hist_t, last_t = table.hist_t[tracks], table.obs_t[tracks]
    pick = _earlier_observation(hist_t, last_t, table.hits[tracks] % HISTORY, p.delta_s)
    n = np.arange(len(tracks))
    has = np.isfinite(hist_t[n, pick])  # else none yet as early as delta_s
    end = _centres(table.obs[tracks])  # the last observation (also in the history), and the picked one
    direction = _unit(end - _centres(table.hist[tracks, pick]))
    towards = _unit(_centres(found) - end[at])
    cos = np.clip(np.einsum("ij,ij->i", direction[at], towards), -1.0, 1.0)
    agreement = (np.pi / 2 - np.arccos(cos)) / np.pi * p.inertia * scores
    return np.where(has[at], agreement, 0.0)


def _distinct(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(rows, return_inverse=True) without its sort where the rows come sorted (the candidates' pairs
    are track-major)."""
    step = np.diff(rows)
    if (step < 0).any():
        return np.unique(rows, return_inverse=True)
    new = np.concatenate([[True], step > 0])
    return rows[new], np.cumsum(new) - 1


def _earlier_observation(hist_t: np.ndarray, last_t: np.ndarray, next_column: np.ndarray,
                         span: float) -> np.ndarray:
    """Per track (rings of observation times, -inf: none yet; its last time; its ring's next column), the
    column of the newest observation at least `span` seconds before its last; else the ring's next column:
    while the ring is not full an empty one (-inf: no direction, no speed yet), then its oldest observation."""
    older = np.where(hist_t <= (last_t - span)[:, None], hist_t, -np.inf)
    newest = np.argmax(older, axis=1)
    return np.where(older[np.arange(len(older)), newest] > -np.inf, newest, next_column)


def _union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row by row, the box around both."""
    return np.concatenate([np.minimum(a[:, :2], b[:, :2]), np.maximum(a[:, 2:], b[:, 2:])], axis=1)


def _grown(boxes: np.ndarray, buffer: float) -> np.ndarray:
    if not buffer:
        return boxes
    wh = boxes[:, 2:] - boxes[:, :2]
    return np.concatenate([boxes[:, :2] - buffer * wh, boxes[:, 2:] + buffer * wh], axis=1)


def _move_tracks(table: BotSortTable, rows: np.ndarray, affine: np.ndarray) -> None:
    """The table's rows carried through their affines (n, 2, 3), a similarity each: the filter's state and
    covariance, the last observation and the history's boxes."""
    linear, shift = affine[:, :, :2], affine[:, :, 2]
    scale = np.sqrt(np.abs(np.linalg.det(linear)))
    mean = table.mean[rows]
    mean[:, :2] = np.einsum("nij,nj->ni", linear, mean[:, :2]) + shift
    mean[:, 4:6] = np.einsum("nij,nj->ni", linear, mean[:, 4:6])
    mean[:, 2:4] *= scale[:, None]
    mean[:, 6:8] *= scale[:, None]
    transform = np.zeros((len(rows), 8, 8))
    transform[:, 0:2, 0:2] = transform[:, 4:6, 4:6] = linear
    for i in (2, 3, 6, 7):
        transform[:, i, i] = scale
    table.mean[rows] = mean
    cov = table.cov[rows]
    plain = ~table.mixed[rows]
    cov[plain] = kalman.from_blocks(table.blocks[rows[plain]])
    cov = transform @ cov @ transform.transpose(0, 2, 1)
    table.cov[rows], table.blocks[rows] = cov, kalman.blocks_of(cov)  # blocks: those that stay unmixed go on by them
    table.obs[rows] = boxes_through(table.obs[rows], linear, shift, scale)
    hist = table.hist[rows].reshape(len(rows), -1, 4)
    table.hist[rows] = boxes_through(hist, linear[:, None], shift[:, None], scale[:, None]).reshape(hist.shape)
    table.moved_known[rows] = False
    table.mixed[rows] |= (linear[:, 0, 1] != 0) | (linear[:, 1, 0] != 0)  # a rotation: x and y mix


def _centres(boxes: np.ndarray) -> np.ndarray:
    return (boxes[..., :2] + boxes[..., 2:]) / 2


def _unit(v: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(v, axis=-1, keepdims=True)
    return np.where(norm > 1e-9, v / np.maximum(norm, 1e-9), 0.0)
