"""An event's record: `jetpipe.event/1`, written by every sink that takes records, beside the frames' records.

    {"schema": "jetpipe.event/1", "event_id": unique (drop duplicates by it), "type": "line_cross" |
     "zone_enter" | "zone_exit" | "loiter" | "occupancy" | "speed", "rule": NAME, "stream": ID, "frame": N,
     "pts": seconds or null, "time": the frame's capture time (wall clock), "track_id": N, "label": class name
     or null, "class": N, "score": S, "box": [x1, y1, x2, y2] (source pixels; these five null for occupancy),
     "direction": "in" | "out" (line_cross; speed on a line), "dwell_s": S (zone_exit, loiter), "state":
     "above" | "below" and "occupancy": N (occupancy), "speed_kmh": km/h (an object's event on a calibrated
     stream, where its track has a speed), "limit_kmh": the rule's (speed), "embedding": the track's look, a
     unit vector of float16 (little-endian) in base64 (reid_in_events, where the track has one), "counts":
     {the rule's counts so far: in / out, enter / exit / loiter / above / below / speed -> N}}
"""

from __future__ import annotations

import itertools
import json
import secrets
from dataclasses import dataclass, field

SCHEMA = "jetpipe.event/1"
_RUN = secrets.token_hex(8)   # this process's: event IDs of two runs never meet
_NEXT = itertools.count()     # next() of it is atomic (one C call): the threads' IDs never meet either


def event_id() -> str:
    """32 hex digits, as a UUID's, unique: this run's random half, then a counter (a fresh UUID for every
    event was most of what an event's record cost to make)."""
    return f"{_RUN}{next(_NEXT):016x}"


@dataclass(slots=True, eq=False)
class EventRecord:
    type: str
    rule: str
    stream: int
    frame: int
    pts: float | None
    time: float
    track_id: int | None
    label: str | None
    class_id: int | None
    score: float | None
    box: list | None
    fields: dict          # direction (lines), dwell_s (zone exits), speed_kmh and limit_kmh, embedding
    counts: dict
    event_id: str = field(default_factory=event_id)
    _json: str | None = field(default=None, init=False, repr=False)

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, "event_id": self.event_id, "type": self.type, "rule": self.rule,
                "stream": self.stream, "frame": self.frame, "pts": self.pts, "time": self.time,
                "track_id": self.track_id, "label": self.label, "class": self.class_id, "score": self.score,
                "box": self.box, **self.fields, "counts": self.counts}

    def json(self) -> str:
        if self._json is None:
            self._json = json.dumps(self.as_dict(), separators=(",", ":"))
        return self._json
