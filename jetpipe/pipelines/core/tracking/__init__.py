"""Per-stream multi-object tracking: a track ID for every detected box that belongs to one.

- `iou`, `bytetrack` (bytetrack.py): ByteTrack's two rounds, greedy IoU matching, memory counted in frames.
- `botsort` (botsort.py): the BoT-SORT / OC-SORT line: optimal assignment, recovery after occlusion, memory in
  seconds of the frames' clock. The default where rules count tracks. `BotSortTable` tracks every stream of
  a batch in one pass (the post stage's); `BotSort` is one stream's.

`make_tracker(kind, next_id)` gives one stream's tracker; `update(boxes, scores, t)` -> an int64 array of
track IDs (tasks.detections.NO_TRACK: none), one a box, once per frame in frame order (t: the frame's time in
seconds, pts where the source has it).
"""

from __future__ import annotations

import numpy as np

from jetpipe.pipelines.core.tracking.botsort import BotSort, BotSortParams, BotSortTable
from jetpipe.pipelines.core.tracking.bytetrack import KalmanBox, Tracker
from jetpipe.tasks.detections import track_array

TRACKERS = ("none", "iou", "bytetrack", "botsort")


class _FrameCounted:
    """ByteTrack and IoU behind the common update(boxes, scores, t): they count frames, not seconds."""

    def __init__(self, kind: str, next_id: int):
        self.tracker = Tracker(kind, next_id=next_id)

    def update(self, boxes, scores, t: float) -> np.ndarray:
        return track_array(self.tracker.update(boxes, scores))


def make_tracker(kind: str, next_id: int = 1):
    """One stream's tracker of `kind` (TRACKERS but none), numbering its tracks from next_id."""
    if kind == "botsort":
        return BotSort(BotSortParams(), next_id=next_id)
    if kind in ("iou", "bytetrack"):
        return _FrameCounted(kind, next_id)
    raise ValueError(f"tracker {kind!r}: choose one of {', '.join(TRACKERS[1:])}")


__all__ = ["TRACKERS", "BotSort", "BotSortParams", "BotSortTable", "KalmanBox", "Tracker", "make_tracker"]
