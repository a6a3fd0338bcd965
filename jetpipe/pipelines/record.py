"""One frame's record: what the stages hand every sink, and the JSON line users read.

    {"stream": ID, "source": URI, "frame": N, "pts": seconds in the stream or null,
     "t_capture": wall time, "t_result": wall time, "latency_ms": {"queue", "gpu", "post", "total"},
     "task": the bundle's task, "results": what the task says of the frame (tasks/: one module a task)}

The results stay as the task wrote them (lists, ready for JSON); the per-frame steps that need numbers (a
zone counter, a line counter) read them as arrays through boxes(), scores(), classes() and track_ids(). A
record is serialized once, however many sinks write it (json()).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

NO_TRACK = -1  # track_ids(): a box that is not (yet) part of a confirmed track


@dataclass(slots=True, eq=False)
class FrameRecord:
    # the records that travel with it name their kind (an event's "line_cross", "clip_ready", ...); a frame's none
    type: ClassVar[str | None] = None
    stream: int                  # the stream's ID (never reused)
    source: str                  # its URI as the user wrote it
    frame: int                   # the frame's number in its stream
    pts: float | None            # its time in the stream, seconds (None: the source gives none)
    t_capture: float             # wall clock when it was captured
    t_result: float              # wall clock when its results were ready
    latency_ms: dict[str, float]  # per stage
    task: str
    results: dict
    # what the frame sinks draw beside the results (the events' zones, lines and counts: EventStep.scene),
    # set when the frame is offered to them; not in the JSON
    scene: list | None = field(default=None, repr=False)
    _json: str | None = field(default=None, init=False, repr=False)

    def as_dict(self) -> dict:
        """The record as JSON keys, in the order every sink has always written them."""
        return {"stream": self.stream, "source": self.source, "frame": self.frame, "pts": self.pts,
                "t_capture": self.t_capture, "t_result": self.t_result, "latency_ms": self.latency_ms,
                "task": self.task, "results": self.results}

    def json(self) -> str:
        """The compact JSON text (no newline), made at the first call and kept."""
        if self._json is None:
            self._json = json.dumps(self.as_dict(), separators=(",", ":"))
        return self._json

    def boxes(self) -> np.ndarray:
        """(N, 4) float32 x1, y1, x2, y2 in source pixels; (0, 4) for a task without boxes."""
        return np.asarray(self.results.get("boxes", ()), np.float32).reshape(-1, 4)

    def scores(self) -> np.ndarray:
        return np.asarray(self.results.get("scores", ()), np.float32).reshape(-1)

    def classes(self) -> np.ndarray:
        """(N,) int64 class numbers; zeros for a task whose boxes have no class (text lines)."""
        classes = self.results.get("classes")
        if classes is None:
            return np.zeros(len(self.results.get("boxes", ())), np.int64)
        return np.asarray(classes, np.int64).reshape(-1)

    def track_ids(self) -> np.ndarray:
        """(N,) int64 track IDs, NO_TRACK where a box has none (no tracker, or not yet a confirmed track)."""
        ids = self.results.get("track_ids")
        if ids is None:
            return np.full(len(self.results.get("boxes", ())), NO_TRACK, np.int64)
        return np.array([NO_TRACK if i is None else i for i in ids], np.int64)
