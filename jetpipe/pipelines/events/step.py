"""The per-frame step that turns each frame's tracked boxes into events (steps.py runs it after the tracker).

Its rules change while it runs (the control API's /rules): each change makes a new list, which the frames'
threads read whole (a frame sees the rules before or after a change, never half of one). A rule changed or
removed keeps its counts in the summary; a changed rule starts its states anew (visits, sides).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import asdict
from itertools import repeat

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from jetpipe.pipelines.events.engine import LineRule, Seen, ZoneRule, anchor_points
from jetpipe.pipelines.events.record import EventRecord

log = logging.getLogger(__name__)


class EventStep:
    name = "events"

    def __init__(self, rules: list, labels, stream_id, deliver):
        """rules: Zone and Line; labels: the model's class names (rules name classes by them); stream_id(slot):
        the ID of the stream in a slot now; deliver(record): to the sinks."""
        self.labels = tuple(labels or ())
        self.rules = [self._engine(r) for r in rules]
        self.stream_id, self.deliver = stream_id, deliver
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for rule in rules:
            self.counts[rule.name]  # every rule in the summary, those that saw nothing too
        self.by_label: dict[tuple[str, str, str], int] = defaultdict(int)  # (rule, what, label) -> N
        self.by_stream: dict[tuple[str, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))  # drawn
        self._slot_ids: dict[int, int] = {}
        self.lock = threading.Lock()
        self.cpu_s = 0.0  # the thread CPU time the rules took (the summary's events.cpu_s: what they cost)

    def _engine(self, rule):
        return (ZoneRule if rule.kind == "zone" else LineRule)(rule, self._class_ids(rule))

    # -- the rules while serving (control API) -----------------------------------------------------------------
    def tables(self) -> list[dict]:
        """Each rule as its [[zone]] / [[line]] table, with its kind and its counts so far."""
        with self.lock:
            return [{"kind": r.rule.kind, **asdict(r.rule), "counts": dict(self.counts[r.rule.name])}
                    for r in self.rules]

    def named(self, name: str) -> dict | None:
        return next((t for t in self.tables() if t["name"] == name), None)

    def add(self, rule) -> None:
        """A checked rule (rules.check, check_against) whose name no rule has."""
        engine = self._engine(rule)
        with self.lock:
            self.rules = [*self.rules, engine]
            self.counts[rule.name]

    def change(self, rule) -> None:
        """The rule of the same name, replaced: its states start anew, its counts go on."""
        engine = self._engine(rule)
        with self.lock:
            self.rules = [engine if r.rule.name == rule.name else r for r in self.rules]

    def remove(self, name: str) -> None:
        with self.lock:
            self.rules = [r for r in self.rules if r.rule.name != name]

    def _class_ids(self, rule) -> set[int] | None:
        if not rule.classes:
            return None
        return {c if isinstance(c, int) else self.labels.index(c) for c in rule.classes}

    def __call__(self, slot: int, packet, results: dict) -> None:
        started = time.thread_time()
        self._decide(slot, packet, results)
        self.cpu_s += time.thread_time() - started  # one thread (the post stage's) calls it

    def _decide(self, slot: int, packet, results: dict) -> None:
        stream = self.stream_id(slot)
        self._slot_ids[slot] = stream
        seen = self._seen(results)
        t = packet.pts if packet.pts is not None else packet.t_capture  # the frame's clock, never ours
        frame_hw = packet.frame.size()
        points: dict[tuple[float, float], list] = {}  # anchor -> the boxes' anchor points: once a frame
        for rule in self.rules:  # the list of now: a change makes a new one
            if rule.takes(stream):
                at = points.get(rule.anchor)
                if at is None:
                    at = points[rule.anchor] = anchor_points(seen, rule.anchor)
                for happened in rule.update(stream, t, frame_hw, seen, at):
                    self._deliver(happened, stream, packet)

    def _seen(self, results: dict) -> list[Seen]:
        ids = results.get("track_ids")
        if not ids:
            return []
        boxes, scores = results["boxes"], results["scores"]
        classes = results.get("classes") or [0] * len(boxes)
        labels = [self._label(c) for c in classes] if self.labels else repeat(None)
        return Seen.tracked(zip(ids, boxes, scores, classes, labels))

    def _label(self, class_id: int) -> str | None:
        return self.labels[class_id] if 0 <= class_id < len(self.labels) else None

    def _deliver(self, happened, stream: int, packet) -> None:
        fields, seen = happened.fields, happened.seen
        what = fields.get("direction") or fields.get("state") or happened.type.removeprefix("zone_")
        label = None if seen is None else seen.label or str(seen.class_id)
        with self.lock:  # read by the metrics server's thread
            counts = self.counts[happened.rule]
            counts[what] += 1
            self.by_label[(happened.rule, what, label or "")] += 1
            self.by_stream[(happened.rule, stream)][what] += 1
            counts = dict(counts)
        pts = None if packet.pts is None else round(packet.pts, 6)
        about = (None, None, None, None, None) if seen is None else \
            (seen.track_id, seen.label, seen.class_id, round(seen.score, 4), [round(v, 1) for v in seen.box])
        self.deliver(EventRecord(happened.type, happened.rule, stream, packet.frame_no, pts,
                                 round(packet.t_capture, 6), *about, fields, counts))

    def scene(self, stream: int, frame_hw) -> list[tuple]:
        """What the frame sinks and the preview draw on a frame of `stream`: (kind, name, points in the frame's
        pixels, its counts in this stream as text) for each rule that takes the stream."""
        drawn = []
        for rule in self.rules:
            if rule.takes(stream):
                counts = self.by_stream.get((rule.rule.name, stream), {})
                if isinstance(rule, ZoneRule):
                    text = f"{rule.rule.name}: {rule.occupancy(stream)} in, {counts.get('enter', 0)} entered"
                else:
                    text = f"{rule.rule.name}: in {counts.get('in', 0)}, out {counts.get('out', 0)}"
                drawn.append((rule.rule.kind, rule.points(frame_hw), text))
        return drawn

    def reset(self, slot: int) -> None:
        """A new stream takes `slot`: the states of the stream it held go (its counts stay in the summary)."""
        old = self._slot_ids.pop(slot, None)
        if old is not None:
            for rule in self.rules:
                rule.reset(old)

    def summary(self) -> dict:
        with self.lock:
            counts = {name: dict(c) for name, c in self.counts.items()}
            zones = [r for r in self.rules if isinstance(r, ZoneRule)]
        return {"counts": counts, "occupancy": {r.rule.name: r.occupancy() for r in zones},
                "cpu_s": round(self.cpu_s, 3)}

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
                for stream in sorted(set(list(rule.visits)) | set(self._slot_ids.values())):
                    if rule.takes(stream):
                        occupancy.add_metric([rule.rule.name, str(stream)], rule.occupancy(stream))
        yield occupancy
