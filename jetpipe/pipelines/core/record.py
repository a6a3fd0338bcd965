"""One frame's record: what the stages hand every sink, and the JSON line users read.

    {"stream": ID, "source": URI, "frame": N, "pts": seconds in the stream or null,
     "t_capture": wall time, "t_result": wall time, "latency_ms": {"queue", "gpu", "post", "total"},
     "task": the bundle's task, "results": what the task says of the frame (tasks/: one module a task)}

The frame's results travel as the task made them, a typed record of arrays (tasks.detections.Detections): the
per-frame steps and the drawing read its arrays; its JSON is made once, by the first sink that wants it (json()),
however many sinks write it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar

from jetpipe.tasks.detections import NO_TRACK, Detections

__all__ = ["NO_TRACK", "FrameRecord"]


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
    detections: Detections       # what the task made of the frame (a results dict is taken too, and wrapped)
    # what the frame sinks draw beside the results (the events' zones, lines and counts: EventStep.scene),
    # set when the frame is offered to them; not in the JSON
    scene: list | None = field(default=None, repr=False)
    _json: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if not isinstance(self.detections, Detections):
            self.detections = Detections.from_results(self.detections)

    @property
    def results(self) -> dict:
        """The JSON's "results" (lists), made anew at each call: the sinks that write JSON call json() instead."""
        return self.detections.to_results()

    def as_dict(self) -> dict:
        """The record as JSON keys, in the order every sink has always written them."""
        return {**self._head(), "results": self.detections.to_results()}

    def _head(self) -> dict:
        """The keys before "results"."""
        return {"stream": self.stream, "source": self.source, "frame": self.frame, "pts": self.pts,
                "t_capture": self.t_capture, "t_result": self.t_result, "latency_ms": self.latency_ms,
                "task": self.task}

    def json(self) -> str:
        """The compact JSON text (no newline), made at the first call and kept: the head's, then the results'
        (Detections.results_json: their coordinates written by numpy)."""
        if self._json is None:
            head = json.dumps(self._head(), separators=(",", ":"))
            self._json = f'{head[:-1]},"results":{self.detections.results_json()}}}'
        return self._json
