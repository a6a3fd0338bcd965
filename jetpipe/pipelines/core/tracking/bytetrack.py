"""ByteTrack and IoU tracking (the frame-counted trackers; botsort.py is the BoT-SORT / OC-SORT line).

- `iou`: each track keeps its last box; a detection continues the track it overlaps most (IoU).
- `bytetrack` (ByteTrack, Zhang et al. 2022, as Ultralytics' `tracker=bytetrack.yaml`): a constant-velocity
  Kalman filter predicts every track's box; high-score detections are matched to the predictions first,
  then low-score ones (occluded or blurred objects) to the tracks still unmatched, so a track survives a
  weak frame instead of being dropped.

Matching is greedy by IoU, best pair first (ByteTrack uses an optimal assignment; with the sparse, well
separated boxes of detection outputs the two agree but in rare ties). A new track is confirmed by a second
detection before it gets an ID (the first frame of the stream excepted); IDs count up per stream and are
never reused. A track unseen for `max_lost` frames is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jetpipe.tasks.agreement_metrics import greedy_match, iou_matrix


class KalmanBox:
    """Constant-velocity Kalman filter on (cx, cy, aspect, height), ByteTrack's parametrisation: noise
    in proportion to the box's height, so small and large objects are tracked alike. predict_all and
    update_all step many filters in one batch of matrix operations (per-track calls cost more in
    Python than the arithmetic)."""

    POSITION, VELOCITY = 1 / 20, 1 / 160
    F = np.eye(8) + np.eye(8, k=4)

    def __init__(self, box: np.ndarray):
        z = _measurements(np.asarray(box, np.float64)[None])[0]
        self.x = np.r_[z, np.zeros(4)]
        h = z[3]
        std = np.array([2 * self.POSITION * h, 2 * self.POSITION * h, 1e-2, 2 * self.POSITION * h,
                        10 * self.VELOCITY * h, 10 * self.VELOCITY * h, 1e-5, 10 * self.VELOCITY * h])
        self.P = np.diag(std ** 2)

    def box(self) -> np.ndarray:
        cx, cy, a, h = self.x[:4]
        w = a * h
        return np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])

    @classmethod
    def predict_all(cls, filters: list[KalmanBox]) -> None:
        if not filters:
            return
        x, p = np.stack([f.x for f in filters]), np.stack([f.P for f in filters])
        h, ones = x[:, 3], np.ones(len(filters))
        std = np.stack([cls.POSITION * h, cls.POSITION * h, 1e-2 * ones, cls.POSITION * h,
                        cls.VELOCITY * h, cls.VELOCITY * h, 1e-5 * ones, cls.VELOCITY * h], axis=1)
        x = x @ cls.F.T
        p = cls.F @ p @ cls.F.T
        p[:, np.arange(8), np.arange(8)] += std ** 2
        for f, xi, pi in zip(filters, x, p):
            f.x, f.P = xi, pi

    @classmethod
    def update_all(cls, filters: list[KalmanBox], boxes: np.ndarray) -> None:
        if not filters:
            return
        x, p = np.stack([f.x for f in filters]), np.stack([f.P for f in filters])
        h = x[:, 3]
        r = np.stack([cls.POSITION * h, cls.POSITION * h, np.full(len(filters), 1e-1), cls.POSITION * h], axis=1)
        s = p[:, :4, :4].copy()
        s[:, np.arange(4), np.arange(4)] += r ** 2
        k = p[:, :, :4] @ np.linalg.inv(s)                      # gain, H = [I 0]
        x = x + (k @ (_measurements(boxes) - x[:, :4])[..., None])[..., 0]
        p = p - k @ p[:, :4, :]
        for f, xi, pi in zip(filters, x, p):
            f.x, f.P = xi, pi


def _measurements(boxes: np.ndarray) -> np.ndarray:
    """x0 y0 x1 y1 rows -> cx, cy, aspect (w / h), h rows."""
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    return np.stack([boxes[:, 0] + w / 2, boxes[:, 1] + h / 2, w / np.maximum(h, 1e-9), h], axis=1)


@dataclass
class _Track:
    box: np.ndarray
    kalman: KalmanBox | None
    hits: int = 1
    lost: int = 0
    track_id: int | None = None   # given when confirmed

    def predicted(self) -> np.ndarray:
        return self.kalman.box() if self.kalman is not None else self.box


@dataclass
class Tracker:
    """One stream's tracker; update() once per frame, in frame order."""

    kind: str = "bytetrack"
    high: float = 0.5          # detections at or above: matched first, may start tracks
    low: float = 0.1           # below: ignored; between low and high: second round only (bytetrack)
    match_iou: float = 0.2     # first round: IoU of prediction and detection at least this
    second_iou: float = 0.5    # low-score round: stricter
    max_lost: int = 30         # frames a track survives unseen
    tracks: list[_Track] = field(default_factory=list)
    next_id: int = 1
    frames: int = 0

    def update(self, boxes, scores) -> list[int | None]:
        """Track IDs for this frame's detections (None: not, or not yet, part of a confirmed track)."""
        boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
        scores = np.asarray(scores, np.float64).reshape(-1)
        ids: list[int | None] = [None] * len(boxes)
        KalmanBox.predict_all([t.kalman for t in self.tracks if t.kalman is not None])
        high = np.flatnonzero(scores >= self.high)
        low = np.flatnonzero((scores >= self.low) & (scores < self.high)) if self.kind == "bytetrack" else []
        used: set[int] = set()  # detections that continued a track
        matched = self._associate(self.tracks, high, boxes, self.match_iou, ids, used)
        if len(low):  # ByteTrack's second round: weak detections keep tracks seen last frame alive
            rest = [t for t in self.tracks if id(t) not in matched and t.lost == 0 and t.track_id is not None]
            matched |= self._associate(rest, low, boxes, self.second_iou, ids, used)
        for track in self.tracks:
            if id(track) not in matched:
                track.lost += 1
        # unconfirmed tracks get one chance: a second detection in the very next frame
        self.tracks = [t for t in self.tracks if t.lost <= self.max_lost and (t.track_id is not None or t.lost == 0)]
        for i in high:
            if i not in used:
                self._start(boxes[i], ids, i)
        self.frames += 1
        return ids

    def _associate(self, tracks, detections, boxes, threshold, ids, used: set[int]) -> set[int]:
        """Match detections to tracks by IoU; updates the matched tracks, returns their id()s."""
        detections = list(detections)
        if not tracks or not detections:
            return set()
        predicted = np.stack([t.predicted() for t in tracks])
        matched, filters, measured = set(), [], []
        for row, col in greedy_match(iou_matrix(predicted, boxes[detections]), threshold):
            track, det = tracks[row], detections[col]
            track.box, track.hits, track.lost = boxes[det], track.hits + 1, 0
            if track.kalman is not None:
                filters.append(track.kalman)
                measured.append(boxes[det])
            if track.track_id is None and track.hits >= 2:
                self._confirm(track)
            ids[det] = track.track_id
            matched.add(id(track))
            used.add(det)
        if filters:
            KalmanBox.update_all(filters, np.stack(measured))
        return matched

    def _start(self, box, ids, det) -> None:
        track = _Track(box, KalmanBox(box) if self.kind == "bytetrack" else None)
        if self.frames == 0:  # the stream's first frame: nothing to confirm against
            ids[det] = self._confirm(track)
        self.tracks.append(track)

    def _confirm(self, track: _Track) -> int:
        """Give a track the stream's next ID (IDs are never reused)."""
        track.track_id, self.next_id = self.next_id, self.next_id + 1
        return track.track_id

    def __post_init__(self):
        if self.kind not in ("iou", "bytetrack"):
            raise ValueError(f"tracker {self.kind!r}: this class tracks iou or bytetrack")
