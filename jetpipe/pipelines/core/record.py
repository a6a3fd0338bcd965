"""One frame's record: what the stages hand every sink, and the JSON line users read.

    {"stream": ID, "source": URI, "frame": N, "pts": seconds in the stream or null,
     "t_capture": wall time, "t_result": wall time, "latency_ms": {"queue", "gpu", "post", "total"},
     "task": the bundle's task, "results": what the task says of the frame (tasks/: one module a task)}

The frame's results travel as the task made them, a typed record of arrays (tasks.detections.Detections): the
per-frame steps and the drawing read its arrays; its JSON is made once, by the first sink that wants it (json()),
however many sinks write it, and with its batch's (BatchJson: the daemon's records of a batch share one).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import ClassVar

from jetpipe.tasks.detections import NO_TRACK, Detections, results_json_many

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
    # its batch's results JSON, made together at the first record's json() (BatchJson), and its place in it
    batch_json: tuple[BatchJson, int] | None = field(default=None, init=False, repr=False)

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
            results = self.detections.results_json() if self.batch_json is None else \
                self.batch_json[0].text(self.batch_json[1])
            self._json = f'{head[:-1]},"results":{results}}}'
        return self._json


class BatchJson:
    """The results JSON of a batch's frames, made for all of them at the first one's json() (results_json_many:
    each key's numbers of every frame in one pass; frame by frame, the calls cost as much as the numbers) and
    only then: no sink that writes JSON, none made. Under a lock: two sinks' threads may ask at once."""

    __slots__ = ("found", "texts", "lock")

    def __init__(self, found: list[Detections]):
        self.found, self.texts, self.lock = found, None, threading.Lock()

    def text(self, k: int) -> str:
        with self.lock:
            if self.texts is None:
                self.texts, self.found = results_json_many(self.found), None
        return self.texts[k]
