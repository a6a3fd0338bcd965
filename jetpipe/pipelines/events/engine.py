"""What happens in the scene, decided from each stream's tracked boxes, frame after frame, on the frames' clock.

Only confirmed tracks count (a box without a track ID decides nothing). Time is the frame's own: its pts for
files and streams that carry one, its capture time otherwise, never the processing time, so a file gives the
same events however fast it is processed.

Lines: an object's anchor point is on the line's right-hand or left-hand side (rules.py says which is "in");
within a band around the line it is on neither. A crossing is `frames_each_side` frames in a row on one side,
then as many on the other: a box flickering on the line is no crossing, and an object that turns back before
the other side's frames are in is none either. A segment counts only where the anchor's path crossed between
its two points (an `extended` line anywhere). A track counts once per direction per line, and not again within
the cooldown.

Zones: an object is in after `enter_frames` frames inside in a row (its visit starts at the first of them) and
out once it has not been seen inside for `exit_grace_s` (a tracker losing it for a moment does not split the
visit); its dwell is from its first to its last frame inside. A visit lasting `loiter_s` gives one loiter event.
Occupancy (the objects in a zone, per stream) gives an event when it has been at least `occupancy_at_least` for
`occupancy_for_s`, and another when it has been below for as long (hysteresis: no event per flicker).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jetpipe.pipelines.events.rules import Line, Zone, segments_cross

LINE_BAND = 0.005   # of the frame's diagonal: an anchor this close to a line is on neither side
MAX_TRACKS = 4096   # per rule and stream: the states of the tracks seen longest ago go first
FORGET_S = 60.0     # a track unseen this long (frame time) is forgotten by a line


@dataclass
class Seen:
    """One confirmed track's box in one frame."""
    track_id: int
    box: tuple[float, float, float, float]
    score: float
    class_id: int
    label: str | None


@dataclass
class Happened:
    """An event before it becomes a record: what, which rule, which track, and the rule's own fields."""
    type: str
    rule: str
    seen: Seen | None  # None: an event of the zone, not of one object (occupancy)
    t: float
    fields: dict = field(default_factory=dict)


def anchor_point(box, anchor: str) -> tuple[float, float]:
    x1, y1, x2, y2 = box
    xs = {"left": x1, "center": (x1 + x2) / 2, "right": x2}
    ys = {"top": y1, "center": (y1 + y2) / 2, "bottom": y2}
    if anchor == "center":
        return xs["center"], ys["center"]
    vertical, horizontal = anchor.split("-")
    return xs[horizontal], ys[vertical]


def in_pixels(points, units: str, frame_hw) -> list[tuple[float, float]]:
    height, width = frame_hw
    return [(x * width, y * height) if units == "normalized" else (x, y) for x, y in points]


def inside_polygon(point, polygon) -> bool:
    """Ray casting; a point on an edge counts as inside on some edges only (as every such test)."""
    x, y = point
    inside = False
    for (x1, y1), (x2, y2) in zip(polygon, polygon[1:] + polygon[:1]):
        if (y1 > y) != (y2 > y) and x < x1 + (y - y1) * (x2 - x1) / (y2 - y1):
            inside = not inside
    return inside


class _Rule:
    """What every rule keeps: which streams and classes it takes, its geometry in each frame size."""

    def __init__(self, rule, class_ids: set[int] | None):
        self.rule, self.class_ids = rule, class_ids
        self.streams = set(rule.streams)
        self._geometry: dict[tuple[int, int], list] = {}

    def takes(self, stream: int) -> bool:
        return not self.streams or stream in self.streams

    def wants(self, seen: Seen) -> bool:
        return seen.score >= self.rule.min_score and (self.class_ids is None or seen.class_id in self.class_ids)

    def points(self, frame_hw) -> list[tuple[float, float]]:
        points = self._geometry.get(frame_hw)
        if points is None:
            points = self._geometry[frame_hw] = in_pixels(self.rule.points, self.rule.units, frame_hw)
        return points


@dataclass
class _Side:
    side: int = 0            # -1 right-hand, +1 left-hand, 0 none yet
    run: int = 0             # frames in a row on `side`
    settled: int = 0         # the side it held for frames_each_side frames (0: none yet)
    last_point: tuple | None = None   # its anchor at its last frame on the settled side
    blocked_until: float = -1e18      # cooldown
    counted: set = field(default_factory=set)  # directions counted for this track
    last_t: float = 0.0


class LineRule(_Rule):
    def __init__(self, rule: Line, class_ids):
        super().__init__(rule, class_ids)
        self.tracks: dict[tuple[int, int], _Side] = {}
        self.updates = 0

    def update(self, stream: int, t: float, frame_hw, seen: list[Seen]) -> list[Happened]:
        line, (a, b) = self.rule, self.points(frame_hw)
        band = LINE_BAND * float(np.hypot(*frame_hw))
        length = float(np.hypot(b[0] - a[0], b[1] - a[1]))
        happened = []
        for obj in seen:
            if not self.wants(obj):
                continue
            point = anchor_point(obj.box, line.anchor)
            distance = ((b[0] - a[0]) * (point[1] - a[1]) - (b[1] - a[1]) * (point[0] - a[0])) / length
            side = 0 if abs(distance) < band else (1 if distance < 0 else -1)  # y grows downwards
            state = self.tracks.setdefault((stream, obj.track_id), _Side())
            state.last_t = t
            if side == 0:
                continue  # on the line: decides nothing, interrupts nothing
            state.run = state.run + 1 if side == state.side else 1
            state.side = side
            if state.run < line.frames_each_side:
                continue
            if state.settled == 0 or state.settled == side:
                state.settled, state.last_point = side, point
                continue
            direction = "in" if side == 1 else "out"  # from the right-hand side to the left-hand side: in
            crossed = line.extended or segments_cross(a, b, state.last_point, point)
            state.settled, state.last_point = side, point
            if crossed and t >= state.blocked_until and direction not in state.counted:
                state.counted.add(direction)
                state.blocked_until = t + line.cooldown_s
                happened.append(Happened("line_cross", line.name, obj, t, {"direction": direction}))
        self._forget(t)
        return happened

    def _forget(self, t: float) -> None:
        """Bounded: tracks unseen for FORGET_S of frame time go, and beyond MAX_TRACKS the longest unseen."""
        self.updates += 1
        if self.updates % 256 == 0:
            for key in [k for k, s in self.tracks.items() if abs(t - s.last_t) > FORGET_S]:
                del self.tracks[key]
        while len(self.tracks) > MAX_TRACKS:
            del self.tracks[min(self.tracks, key=lambda k: self.tracks[k].last_t)]

    def reset(self, stream: int) -> None:
        for key in [k for k in self.tracks if k[0] == stream]:
            del self.tracks[key]


@dataclass
class _Visit:
    run: int = 0                 # frames inside in a row while not in
    run_start: float = 0.0
    entered: float | None = None  # the visit's start (its first frame inside); None: not in
    last_inside: float = 0.0
    last_seen: Seen | None = None
    loitered: bool = False


@dataclass
class _Crowd:
    above: bool = False           # the state last reported
    since: float | None = None    # when the count last crossed the threshold against that state


class ZoneRule(_Rule):
    def __init__(self, rule: Zone, class_ids):
        super().__init__(rule, class_ids)
        self.visits: dict[tuple[int, int], _Visit] = {}
        self.crowds: dict[int, _Crowd] = {}

    def update(self, stream: int, t: float, frame_hw, seen: list[Seen]) -> list[Happened]:
        zone, polygon = self.rule, self.points(frame_hw)
        happened = []
        for obj in seen:
            if not self.wants(obj):
                continue
            visit = self.visits.setdefault((stream, obj.track_id), _Visit())
            visit.last_seen = obj
            if inside_polygon(anchor_point(obj.box, zone.anchor), polygon):
                visit.last_inside = t
                if visit.entered is None:
                    visit.run_start = t if visit.run == 0 else visit.run_start
                    visit.run += 1
                    if visit.run >= zone.enter_frames:
                        visit.entered = visit.run_start
                        happened.append(Happened("zone_enter", zone.name, obj, t))
            elif visit.entered is None:
                visit.run = 0
        for key, visit in list(self.visits.items()):
            if key[0] != stream:
                continue
            if visit.entered is not None and visit.last_inside < t and t - visit.last_inside >= zone.exit_grace_s:
                dwell = visit.last_inside - visit.entered
                happened.append(Happened("zone_exit", zone.name, visit.last_seen, t, {"dwell_s": round(dwell, 6)}))
                del self.visits[key]
            elif visit.entered is None and visit.run == 0 and t - visit.last_inside > FORGET_S:
                del self.visits[key]
            elif visit.entered is not None and zone.loiter_s and not visit.loitered and \
                    visit.last_inside - visit.entered >= zone.loiter_s:
                visit.loitered = True
                happened.append(Happened("loiter", zone.name, visit.last_seen, t,
                                         {"dwell_s": round(visit.last_inside - visit.entered, 6)}))
        if zone.occupancy_at_least:
            happened += self._crowd(stream, t)
        return happened

    def _crowd(self, stream: int, t: float) -> list[Happened]:
        """An occupancy event when the count has stood on the other side of the threshold for occupancy_for_s."""
        crowd = self.crowds.setdefault(stream, _Crowd())
        count = self.occupancy(stream)
        if (count >= self.rule.occupancy_at_least) == crowd.above:
            crowd.since = None  # as last reported
            return []
        crowd.since = t if crowd.since is None else crowd.since
        if t - crowd.since < self.rule.occupancy_for_s:
            return []
        crowd.above, crowd.since = not crowd.above, None
        return [Happened("occupancy", self.rule.name, None, t,
                         {"state": "above" if crowd.above else "below", "occupancy": count})]

    def occupancy(self, stream: int | None = None) -> int:
        return sum(v.entered is not None for k, v in self.visits.items() if stream is None or k[0] == stream)

    def reset(self, stream: int) -> None:
        for key in [k for k in self.visits if k[0] == stream]:
            del self.visits[key]
        self.crowds.pop(stream, None)
