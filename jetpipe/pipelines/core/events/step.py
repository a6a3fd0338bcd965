"""The per-frame step that turns each frame's tracked boxes into events (steps.py runs it after the tracker).

It gathers the frames of a few batches and decides them at once (engine.py: array operations over every box):
an event reaches the sinks at most DECIDE_S after its frame's record while frames come, and at once when the
post stage is idle or ends (flush()).

Its rules change while it runs (the control API's /rules): each change makes a new list, which the frames'
threads read whole (a frame sees the rules before or after a change, never half of one). A rule changed or
removed keeps its counts in the summary; a changed rule starts its states anew (visits, sides).
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections import defaultdict
from dataclasses import asdict

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from jetpipe.pipelines.core.events.engine import Engine, ZoneRule
from jetpipe.pipelines.core.events.record import EventRecord

log = logging.getLogger(__name__)


DECIDE_FRAMES = 32   # frames decided at once: most of the rules' cost is per decision, not per box
DECIDE_S = 0.1       # and no frame waits longer than this for its events (while frames come)


class _Frame:
    """What an event record tells of its frame; `image`, the frame in its ring slot, only where the rules decide
    the batch it came in (snapshots): gathered frames go back to their rings before the rules run."""
    __slots__ = ("slot", "frame_no", "pts", "t_capture", "gathered", "image")

    def __init__(self, packet, keep_image: bool):
        self.slot, self.frame_no = packet.stream, packet.frame_no
        self.pts, self.t_capture = packet.pts, packet.t_capture
        self.gathered = time.monotonic()
        self.image = packet.frame if keep_image else None


class EventStep:
    name = "events"

    def __init__(self, rules: list, labels, stream_id, publish, keep_frames: bool = False, counts=None,
                 look_of=None):
        """rules: Zone and Line; labels: the model's class names (rules name classes by them); stream_id(slot):
        the ID of the stream in a slot now; publish(record, frame): each event on the record bus (bus.RecordBus),
        with its frame where keep_frames (a subscriber pictures it: the frames are then decided in the batch
        they come in, while they are in their slots); counts: each rule's counts so far (a restarted GPU
        worker's go on from its predecessor's); look_of(slot, track_id): the track's look (reid_in_events: an
        object's event carries it, float16 in base64), or None."""
        self.look_of = look_of
        self.keep_frames = keep_frames
        self.labels = tuple(labels or ())
        self.engine = Engine()
        self.engine.rules = [self._engine(r) for r in rules]
        self._named = {r.rule.name: r for r in self.engine.rules}  # by name: found in time independent of their number
        self.removed: list[dict] = []  # rules removed while serving, with their counts (the summary's)
        self.stream_id, self.publish = stream_id, publish
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for rule in rules:
            self.counts[rule.name]  # every rule in the summary, those that saw nothing too
        for name, counted in (counts or {}).items():
            self.counts[name].update(counted)
        self.by_label: dict[tuple[str, str, str], int] = defaultdict(int)  # (rule, what, label) -> N
        self.by_stream: dict[tuple[str, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))  # drawn
        self._slot_ids: dict[int, int] = {}
        self._left: list[int] = []  # streams whose slot another took: forgotten by the frames' thread
        self._waiting: list[tuple] = []  # frames gathered, not decided yet
        self.lock = threading.Lock()
        self.cpu_s = 0.0  # the thread CPU time the rules took (the summary's events.cpu_s: what they cost)

    @property
    def rules(self) -> list:
        return self.engine.rules

    def _engine(self, rule):
        return self.engine.rule(rule, self._class_ids(rule))

    # -- the rules while serving (control API) -----------------------------------------------------------------
    def tables(self) -> list[dict]:
        """Each rule as its [[zone]] / [[line]] table, with its kind and its counts so far."""
        with self.lock:
            return [self._table(r) for r in self.rules]

    def _table(self, engine) -> dict:
        return {"kind": engine.rule.kind, **asdict(engine.rule), "counts": dict(self.counts[engine.rule.name])}

    def named(self, name: str) -> dict | None:
        with self.lock:
            engine = self._named.get(name)
            return None if engine is None else self._table(engine)

    def rule_tables(self) -> list:
        """The rules as configured (rules.Zone / rules.Line), for the caps on their number."""
        return [r.rule for r in self.rules]

    def add(self, rule) -> None:
        """A checked rule (rules.check, check_against) whose name no rule has: it counts from zero."""
        engine = self._engine(rule)
        with self.lock:
            self.engine.rules = [*self.rules, engine]
            self._named[rule.name] = engine
            self.counts[rule.name]

    def change(self, rule) -> None:
        """The rule of the same name, replaced: its states start anew, its counts go on."""
        engine = self._engine(rule)
        with self.lock:
            self.engine.rules = [engine if r.rule.name == rule.name else r for r in self.rules]
            self._named[rule.name] = engine

    def remove(self, name: str) -> None:
        """The rule goes; its counts are kept apart (the summary's `removed`): a rule added later under its name
        counts from zero."""
        with self.lock:
            self.engine.rules = [r for r in self.rules if r.rule.name != name]
            self._named.pop(name, None)
            self.removed.append({"rule": name, "counts": dict(self.counts.pop(name, {}))})
            for key in [k for k in self.by_stream if k[0] == name]:
                del self.by_stream[key]

    def _class_ids(self, rule) -> set[int] | None:
        if not rule.classes:
            return None
        return {c if isinstance(c, int) else self.labels.index(c) for c in rule.classes}

    def run(self, packets: list, results: list) -> None:
        """A finished batch's frames (packet.stream: the slot), a stream's in their order: gathered, and decided
        DECIDE_FRAMES at a time (or once the first has waited DECIDE_S): the rules' cost is mostly per decision,
        and a live pipeline's batches are a few frames."""
        keep = self.keep_frames
        for packet, found in zip(packets, results):
            stream = self._slot_ids[packet.stream] = self.stream_id(packet.stream)
            t = packet.pts if packet.pts is not None else packet.t_capture  # the frame's clock, never ours
            self._waiting.append(((stream, t, packet.frame.size(), found), _Frame(packet, keep)))
        if self._waiting and (keep or len(self._waiting) >= DECIDE_FRAMES or self._left or
                              time.monotonic() - self._waiting[0][1].gathered >= DECIDE_S):
            self.flush()

    def flush(self) -> None:
        """Decide the frames gathered so far (the post stage calls it when idle and at the end)."""
        started = time.thread_time()
        waiting, self._waiting = self._waiting, []
        if waiting:
            frames = [frame for frame, _ in waiting]
            for index, happened in self.engine.decide(frames):
                self._deliver(happened, frames[index][0], waiting[index][1])
        while self._left:  # after their last frames were decided
            self.engine.reset(self._left.pop())
        self.cpu_s += time.thread_time() - started  # one thread (the post stage's) calls it

    def _label(self, class_id: int) -> str | None:
        return self.labels[class_id] if 0 <= class_id < len(self.labels) else None

    def _deliver(self, happened, stream: int, packet) -> None:
        fields, seen = happened.fields, happened.seen
        what = "speed" if happened.type == "speed" else \
            fields.get("direction") or fields.get("state") or happened.type.removeprefix("zone_")
        if seen is not None and seen.speed_kmh is not None:
            fields = {**fields, "speed_kmh": round(seen.speed_kmh, 1)}
        look = None if seen is None or self.look_of is None else self.look_of(packet.slot, seen.track_id)
        if look is not None:  # a consumer matches the object across cameras by it
            fields = {**fields, "embedding": base64.b64encode(look.astype("<f2").tobytes()).decode("ascii")}
        name = None if seen is None else self._label(seen.class_id)  # the model's name for its class
        label = None if seen is None else name or str(seen.class_id)
        with self.lock:  # read by the metrics server's thread
            counts = self.counts[happened.rule]
            counts[what] += 1
            self.by_label[(happened.rule, what, label or "")] += 1
            self.by_stream[(happened.rule, stream)][what] += 1
            counts = dict(counts)
        pts = None if packet.pts is None else round(packet.pts, 6)
        about = (None, None, None, None, None) if seen is None else \
            (seen.track_id, name, seen.class_id, round(seen.score, 4), [round(v, 1) for v in seen.box])
        record = EventRecord(happened.type, happened.rule, stream, packet.frame_no, pts, round(packet.t_capture, 6),
                             *about, fields, counts)
        self.publish(record, packet.image)

    def scene(self, stream: int, frame_hw, view=None) -> list[tuple]:
        """What the frame sinks and the preview draw on a frame of `stream`: (kind, name, points in the frame's
        pixels, its counts in this stream as text) for each rule that takes the stream. view: a moving camera's
        (Detections.view: this frame's pixels -> its first frame's), whose rules lie in that first view: drawn
        where that view is in this frame."""
        drawn = []
        for rule in self.rules:
            if rule.takes(stream):
                counts = self.by_stream.get((rule.rule.name, stream), {})
                if isinstance(rule, ZoneRule):
                    text = f"{rule.rule.name}: {rule.occupancy(stream)} in, {counts.get('enter', 0)} entered"
                else:
                    text = f"{rule.rule.name}: in {counts.get('in', 0)}, out {counts.get('out', 0)}"
                points = rule.points(frame_hw)
                drawn.append((rule.rule.kind, points if view is None else _into_frame(points, view), text))
        return drawn

    def reset(self, slot: int) -> None:
        """A new stream takes `slot`: the states of the stream it held go (its counts stay in the summary), at
        the frames' thread's next batch (this is the control API's thread)."""
        old = self._slot_ids.pop(slot, None)
        if old is not None:
            self._left.append(old)

    def stats(self) -> dict:
        """Nothing in the stages' part of the summary: the events have their own (summary())."""
        return {}

    def summary(self) -> dict:
        with self.lock:
            counts = {name: dict(c) for name, c in self.counts.items()}
            zones = [r for r in self.rules if isinstance(r, ZoneRule)]
            removed = list(self.removed)
        return {"counts": counts, "occupancy": {r.rule.name: r.occupancy() for r in zones},
                "cpu_s": round(self.cpu_s, 3), **({"removed": removed} if removed else {})}

    def metric_families(self):
        """For /metrics: events by rule, what (direction, enter, exit, loiter, above, below) and class; each
        zone's occupancy now, per stream."""
        events = CounterMetricFamily("jetpipe_events", "Events by rule, what happened and class.",
                                     labels=["rule", "what", "label"])
        with self.lock:
            for (rule, what, label), n in sorted(self.by_label.items()):
                events.add_metric([rule, what, label], n)
        yield events
        occupancy = GaugeMetricFamily("jetpipe_zone_occupancy", "Tracked objects in a zone now.",
                                      labels=["rule", "stream"])
        for rule in list(self.rules):
            if isinstance(rule, ZoneRule):
                for stream in sorted(rule.streams_visiting() | set(self._slot_ids.values())):
                    if rule.takes(stream):
                        occupancy.add_metric([rule.rule.name, str(stream)], rule.occupancy(stream))
        yield occupancy


def _into_frame(points, view: np.ndarray) -> list[tuple[float, float]]:
    """Points of a moving camera's first view carried into this frame's pixels (the view's inverse)."""
    linear, shift = view[:, :2], view[:, 2]
    moved = (np.asarray(points, np.float64) - shift) @ np.linalg.inv(linear).T
    return [(float(x), float(y)) for x, y in moved]
