"""A finished batch's tracked boxes as columns, and the table of tracks the rules keep their states in.

The rules decide a whole batch at once, as array operations over every box of every frame in it (a batch of
16 frames of 20 boxes is one operation, not 320 times a few lines of Python): the step's CPU is per batch,
nearly independent of how many boxes a frame has. Python runs per box only where something changes (a box
arriving on the other side of a line, a visit starting).

A stream's frames must be decided in their order: where a batch holds two frames of one stream (a stream that
runs ahead of the others), its second frame is in the batch's second *generation*, decided after the first.
"""

from __future__ import annotations

import math
from itertools import repeat

import numpy as np

from jetpipe.geometry import boxes_through
from jetpipe.tasks.detections import NO_TRACK

MAX_ROWS = 1 << 16   # tracks kept at once over all streams: beyond it the one seen longest ago goes
FORGET_S = 60.0      # a track unseen this long (its stream's frame time) is forgotten, unless a zone holds it
SWEEP_EVERY = 256    # batches between two looks for forgotten tracks


class TrackBatch:
    """The confirmed tracks' boxes of a batch's frames (a box without a track decides nothing), one row a box,
    in frame order; and each frame's stream, time and size."""

    def __init__(self, frames):
        """frames: (stream, t, (height, width), detections) of each frame, in the order they were finished."""
        self.streams = [f[0] for f in frames]
        self.times = [f[1] for f in frames]
        self.sizes = [f[2] for f in frames]
        self.generation_of = _generations(self.streams)
        self.generations = 1 + max(self.generation_of, default=-1)
        found = [f[3] for f in frames]
        counts = [len(d) if d.tracker_id is not None else 0 for d in found]
        tracked = [d for d, n in zip(found, counts) if n]
        if tracked:
            track = np.concatenate([d.tracker_id for d in tracked])
            box = np.concatenate([d.xyxy for d in tracked]).astype(np.float64)
            score = np.concatenate([d.confidence for d in tracked]).astype(np.float64)
            class_id = np.concatenate([d.class_ids for d in tracked])
        else:
            track, box, score, class_id = np.zeros(0, np.int64), np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64)
        frame = np.repeat(np.arange(len(frames)), counts)
        speed = _speeds(tracked, sum(counts))
        keep = track != NO_TRACK  # a box without a confirmed track decides nothing
        if not keep.all():
            frame, track, box, score, class_id = frame[keep], track[keep], box[keep], score[keep], class_id[keep]
            speed = None if speed is None else speed[keep]
        self.frame, self.track, self.box, self.score, self.class_id = frame, track, box, score, class_id
        self.speed = speed  # km/h, NaN where none (pipelines.core.ground); None: no frame is of a calibrated stream
        # where the rules look: a moving camera's boxes in its first frame's view (what stands still stays put)
        self.placed = _placed(self.box, frame, [d.view for d in found]) if any(
            d.view is not None for d in found) else self.box
        self.stream = np.array(self.streams, np.int64)[frame]
        self.t = np.array(self.times, np.float64)[frame]
        # one frame size (most batches): the rules' geometry in scalars; several: per box
        self.size = self.sizes[0] if len(set(self.sizes)) == 1 else None
        if self.size is None:
            sizes = np.array(self.sizes, np.float64).reshape(-1, 2)[frame]
            self.height, self.width = sizes[:, 0], sizes[:, 1]
        self.generation = np.array(self.generation_of, np.int64)[frame] if self.generations > 1 else None
        self._anchors: dict[tuple[float, float], tuple] = {}
        self._described: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.track)

    def anchors(self, fractions) -> tuple[np.ndarray, np.ndarray]:
        """Each box's anchor point in pixels ((0, 0) of fractions: its top-left corner), once a batch per
        anchor."""
        found = self._anchors.get(fractions)
        if found is None:
            fx, fy = fractions
            x1, y1, x2, y2 = self.placed.T
            found = self._anchors[fractions] = (x1 + fx * (x2 - x1), y1 + fy * (y2 - y1))
        return found

    def described(self) -> np.ndarray:
        """(N, 7) x1, y1, x2, y2, score, class, speed (NaN: none): a box as a zone keeps it (one copy, not four)."""
        if self._described is None:
            speed = np.full(len(self), np.nan) if self.speed is None else self.speed
            self._described = np.column_stack((self.box, self.score, self.class_id, speed))
        return self._described

    def parts(self, boxes: np.ndarray | None) -> list[np.ndarray | None]:
        """Positions in `boxes` (indices; None: every box) split by generation, in order; [None]: one
        generation (most batches), all of them."""
        if self.generations == 1:
            return [None]
        generation = self.generation if boxes is None else self.generation[boxes]
        return [np.flatnonzero(generation == g) for g in range(self.generations)]

    def frames_of(self, generation: int) -> list[int]:
        return [k for k, g in enumerate(self.generation_of) if g == generation]


def _placed(box: np.ndarray, frame: np.ndarray, views: list) -> np.ndarray:
    """Boxes of frames with a view (a moving camera's: 2 x 3, the frame's pixels -> its first frame's) moved into
    it: the centre through the affine, the size scaled; the others as they are."""
    placed = box.copy()
    for k, view in enumerate(views):
        if view is None:
            continue
        rows = frame == k
        if not rows.any():
            continue
        linear = view[:, :2]
        placed[rows] = boxes_through(box[rows], linear, view[:, 2], np.sqrt(abs(np.linalg.det(linear))))
    return placed


def _speeds(tracked: list, boxes: int) -> np.ndarray | None:
    """The tracked frames' speeds (km/h) a box, NaN where a frame has none; None where none has any."""
    if not any(d.ground is not None for d in tracked):
        return None
    return np.concatenate([d.ground.speed_kmh if d.ground is not None else np.full(len(d), np.nan)
                           for d in tracked]) if boxes else np.zeros(0)


def _generations(streams: list[int]) -> list[int]:
    """Each frame's generation: how many frames of its stream came before it in the batch."""
    seen: dict[int, int] = {}
    generations = []
    for stream in streams:
        generations.append(seen.get(stream, 0))
        seen[stream] = generations[-1] + 1
    return generations


class TrackTable:
    """A row for each (stream, track) seen lately; every rule keeps its states in columns of these rows.

    Bounded: a track unseen for FORGET_S of its stream's frame time goes (where no zone holds a visit of it),
    and beyond max_rows the row seen longest ago goes. The rules clear a row's columns when it goes
    (`dropped`): a row given is a clean one."""

    def __init__(self, capacity: int = 1024, max_rows: int = MAX_ROWS):
        self.max_rows = max_rows
        self.index: dict[int, int] = {}  # stream << 32 | track -> row
        self.capacity = 0
        self.key = self.stream = self.track = self.last_batch = np.zeros(0, np.int64)
        self.last_t = np.zeros(0)
        self.free: list[int] = []
        self.dropped: list[int] = []  # rows given up since the rules last cleared theirs
        self.high = 0           # rows below it may be in use: what the rules' scans look at
        self.batches = 0
        self.latest_t: dict[int, float] = {}  # stream -> its newest frame time
        self._grow(min(capacity, max_rows))

    def _grow(self, capacity: int) -> None:
        old = self.capacity
        for name in ("key", "stream", "track", "last_batch"):
            setattr(self, name, np.concatenate([getattr(self, name), np.full(capacity - old, -1, np.int64)]))
        self.last_t = np.concatenate([self.last_t, np.full(capacity - old, math.nan)])
        self.free += range(capacity - 1, old - 1, -1)  # popped from the end: the lowest row first
        self.capacity = capacity

    def rows(self, batch: TrackBatch) -> np.ndarray:
        """Each box's row, a new one for a track not seen before."""
        self.batches += 1
        keys = (batch.stream << 32) | (batch.track & 0xFFFFFFFF)
        get = self.index.get
        rows = np.fromiter(map(get, keys.tolist(), repeat(-1)), np.int64, len(keys))
        missing = np.flatnonzero(rows < 0).tolist()
        if missing:  # the rows found are this batch's: not to be given up to make room for the others
            self.last_batch[rows[rows >= 0]] = self.batches
        for i in missing:
            key = int(keys[i])
            row = self.index.get(key)
            rows[i] = self._give(key, int(batch.stream[i]), int(batch.track[i])) if row is None else row
        self.last_t[rows] = batch.t
        self.last_batch[rows] = self.batches
        for stream, t in zip(batch.streams, batch.times):
            self.latest_t[stream] = t
        return rows

    def _give(self, key: int, stream: int, track: int) -> int:
        if not self.free:
            if self.capacity < self.max_rows:
                self._grow(min(self.max_rows, 2 * self.capacity))
            else:
                used = np.flatnonzero(self.key[:self.high] >= 0)
                self.drop(used[np.argmin(self.last_batch[used])])
        row = self.free.pop()
        self.index[key] = row
        self.key[row], self.stream[row], self.track[row] = key, stream, track
        self.high = max(self.high, row + 1)
        return row

    def drop(self, row: int) -> None:
        del self.index[int(self.key[row])]
        self.key[row] = self.stream[row] = self.track[row] = -1
        self.free.append(int(row))
        self.dropped.append(int(row))

    def in_use(self) -> np.ndarray:
        return self.key[:self.high] >= 0

    def unseen(self) -> np.ndarray:
        """Rows (a mask below `high`) whose track has not been seen for FORGET_S of its stream's time."""
        streams = self.stream[:self.high]
        latest = np.array([self.latest_t.get(s, math.nan) for s in streams.tolist()], np.float64)
        return self.in_use() & (np.abs(latest - self.last_t[:self.high]) > FORGET_S)

    def drop_stream(self, stream: int) -> None:
        for row in np.flatnonzero(self.stream[:self.high] == stream).tolist():
            self.drop(row)
        self.latest_t.pop(stream, None)


def column(capacity: int, fill, dtype, width: int = 0) -> np.ndarray:
    return np.full((capacity, width) if width else capacity, fill, dtype)


def grown(array: np.ndarray, capacity: int, fill) -> np.ndarray:
    """`array` with rows up to `capacity` (the table grew), the new ones `fill`."""
    if len(array) >= capacity:
        return array
    more = np.full((capacity - len(array), *array.shape[1:]), fill, array.dtype)
    return np.concatenate([array, more])
