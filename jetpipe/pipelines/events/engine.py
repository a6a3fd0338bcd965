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

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from jetpipe.pipelines.events.rules import Line, Zone, segments_cross
from jetpipe.pipelines.record import NO_TRACK

LINE_BAND = 0.005   # of the frame's diagonal: an anchor this close to a line is on neither side
MAX_TRACKS = 4096   # per rule and stream: the states of the tracks seen longest ago go first
FORGET_S = 60.0     # a track unseen this long (frame time) is forgotten by a line


class Seen(NamedTuple):
    """One confirmed track's box in one frame (a tuple: made for every box of every frame)."""
    track_id: int
    box: list  # [x1, y1, x2, y2], source pixels, as the record's results hold it
    score: float
    class_id: int
    label: str | None

    @classmethod
    def tracked(cls, rows) -> list[Seen]:
        """(track_id, box, score, class_id, label) rows, those with a track, as Seen (_make: the cheapest way
        to build a tuple of them, which runs for every box of every frame)."""
        make = cls._make
        return [make(row) for row in rows if row[0] is not None and row[0] != NO_TRACK]


@dataclass
class Happened:
    """An event before it becomes a record: what, which rule, which track, and the rule's own fields."""
    type: str
    rule: str
    seen: Seen | None  # None: an event of the zone, not of one object (occupancy)
    t: float
    fields: dict = field(default_factory=dict)


def anchor_fractions(anchor: str) -> tuple[float, float]:
    """Where in a box its anchor is: (0, 0) its top-left corner, (0.5, 1) the middle of its bottom edge."""
    if anchor == "center":
        return 0.5, 0.5
    vertical, horizontal = anchor.split("-")
    return {"left": 0.0, "center": 0.5, "right": 1.0}[horizontal], {"top": 0.0, "bottom": 1.0}[vertical]


def anchor_points(seen: list[Seen], fractions) -> list[tuple[float, float]]:
    """Each box's anchor point: once per frame for all the rules of one anchor."""
    fx, fy = fractions
    return [(x1 + fx * (x2 - x1), y1 + fy * (y2 - y1)) for _, (x1, y1, x2, y2), _, _, _ in seen]


def in_pixels(points, units: str, frame_hw) -> list[tuple[float, float]]:
    height, width = frame_hw
    return [(x * width, y * height) if units == "normalized" else (x, y) for x, y in points]


def polygon_edges(polygon) -> list[tuple]:
    """A polygon's edges, its last point joined to its first (what is_inside() reads)."""
    return list(zip(polygon, polygon[1:] + polygon[:1]))


def is_inside(point, edges) -> bool:
    """Ray casting over polygon_edges(); a point on an edge counts as inside on some edges only (as every
    such test)."""
    x, y = point
    inside = False
    for (x1, y1), (x2, y2) in edges:
        if (y1 > y) != (y2 > y) and x < x1 + (y - y1) * (x2 - x1) / (y2 - y1):
            inside = not inside
    return inside


class _Rule:
    """What every rule keeps: which streams and classes it takes, its geometry in each frame size."""

    def __init__(self, rule, class_ids: set[int] | None):
        self.rule, self.class_ids = rule, class_ids
        self.streams = set(rule.streams)
        self.anchor = anchor_fractions(rule.anchor)
        self.takes_all = class_ids is None and rule.min_score <= 0  # wants() needs no look at a box
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


@dataclass(slots=True)
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
        self.tracks: dict[int, dict[int, _Side]] = {}  # stream -> track -> its side
        self._measures: dict[tuple[int, int], tuple] = {}
        self.updates = 0

    def measures(self, frame_hw) -> tuple:
        """The line in a frame of this size: its points, (dx, dy) / its length, the band's half-width."""
        measures = self._measures.get(frame_hw)
        if measures is None:
            (a, b) = self.points(frame_hw)
            length = math.hypot(b[0] - a[0], b[1] - a[1])
            measures = self._measures[frame_hw] = (a, b, (b[0] - a[0]) / length, (b[1] - a[1]) / length,
                                                   LINE_BAND * math.hypot(*frame_hw))
        return measures

    def update(self, stream: int, t: float, frame_hw, seen: list[Seen], points=None) -> list[Happened]:
        """points: each box's anchor point (as anchor_points gives them), where the caller has them already."""
        line = self.rule
        (ax, ay), _, ux, uy, band = self.measures(frame_hw)
        tracks = self.tracks.get(stream)
        if tracks is None:
            tracks = self.tracks[stream] = {}
        takes_all, get = self.takes_all, tracks.get
        happened = []
        for obj, point in zip(seen, points or anchor_points(seen, self.anchor)):
            if not takes_all and not self.wants(obj):
                continue
            distance = ux * (point[1] - ay) - uy * (point[0] - ax)
            side = 0 if -band < distance < band else (1 if distance < 0 else -1)  # y grows downwards
            state = get(obj.track_id)
            if state is None:
                state = tracks[obj.track_id] = _Side()
            state.last_t = t
            if side == 0:
                continue  # on the line: decides nothing, interrupts nothing
            if side == state.settled == state.side:  # on its side still (most boxes, most frames)
                state.run += 1
                state.last_point = point
                continue
            state.run = state.run + 1 if side == state.side else 1
            state.side = side
            if state.run < line.frames_each_side:
                continue
            if state.settled == 0 or state.settled == side:
                state.settled, state.last_point = side, point
                continue
            direction = "in" if side == 1 else "out"  # from the right-hand side to the left-hand side: in
            crossed = line.extended or segments_cross(*self.points(frame_hw), state.last_point, point)
            state.settled, state.last_point = side, point
            if crossed and t >= state.blocked_until and direction not in state.counted:
                state.counted.add(direction)
                state.blocked_until = t + line.cooldown_s
                happened.append(Happened("line_cross", line.name, obj, t, {"direction": direction}))
        self._forget(tracks, t)
        return happened

    def _forget(self, tracks: dict, t: float) -> None:
        """Bounded: tracks unseen for FORGET_S of frame time go, and beyond MAX_TRACKS the longest unseen."""
        self.updates += 1
        if self.updates % 256 == 0:
            for key in [k for k, s in tracks.items() if abs(t - s.last_t) > FORGET_S]:
                del tracks[key]
        while len(tracks) > MAX_TRACKS:
            del tracks[min(tracks, key=lambda k: tracks[k].last_t)]

    def reset(self, stream: int) -> None:
        self.tracks.pop(stream, None)


@dataclass(slots=True)
class _Visit:
    run: int = 0                 # frames inside in a row while not in
    run_start: float = 0.0
    entered: float | None = None  # the visit's start (its first frame inside); None: not in
    last_inside: float = 0.0
    last_seen: Seen | None = None
    loitered: bool = False


@dataclass(slots=True)
class _Crowd:
    above: bool = False           # the state last reported
    since: float | None = None    # when the count last crossed the threshold against that state


class ZoneRule(_Rule):
    def __init__(self, rule: Zone, class_ids):
        super().__init__(rule, class_ids)
        self.visits: dict[int, dict[int, _Visit]] = {}  # stream -> track -> its visit
        self.crowds: dict[int, _Crowd] = {}
        self._shape: dict[tuple[int, int], tuple] = {}  # frame size -> the zone's edges and bounding box

    def update(self, stream: int, t: float, frame_hw, seen: list[Seen], points=None) -> list[Happened]:
        zone = self.rule
        shape = self._shape.get(frame_hw)
        if shape is None:
            polygon = self.points(frame_hw)
            xs, ys = [p[0] for p in polygon], [p[1] for p in polygon]
            shape = self._shape[frame_hw] = (polygon_edges(polygon), min(xs), min(ys), max(xs), max(ys))
        edges, left, top, right, bottom = shape
        visits = self.visits.get(stream)
        if visits is None:
            visits = self.visits[stream] = {}
        takes_all = self.takes_all
        happened = []
        for obj, point in zip(seen, points or anchor_points(seen, self.anchor)):
            if not takes_all and not self.wants(obj):
                continue
            inside = left <= point[0] <= right and top <= point[1] <= bottom and is_inside(point, edges)
            visit = visits.get(obj.track_id)
            if visit is None:
                if not inside:
                    continue  # no visit, none starting: nothing to keep (most boxes, most frames)
                visit = visits[obj.track_id] = _Visit()
            visit.last_seen = obj
            if inside:
                visit.last_inside = t
                if visit.entered is None:
                    visit.run_start = t if visit.run == 0 else visit.run_start
                    visit.run += 1
                    if visit.run >= zone.enter_frames:
                        visit.entered = visit.run_start
                        happened.append(Happened("zone_enter", zone.name, obj, t))
            elif visit.entered is None:
                del visits[obj.track_id]  # its frames inside in a row ended before it was in: as if unseen
        for key, visit in list(visits.items()):
            if visit.entered is not None and visit.last_inside < t and t - visit.last_inside >= zone.exit_grace_s:
                dwell = visit.last_inside - visit.entered
                happened.append(Happened("zone_exit", zone.name, visit.last_seen, t, {"dwell_s": round(dwell, 6)}))
                del visits[key]
            elif visit.entered is None and t - visit.last_inside > zone.exit_grace_s:
                del visits[key]  # frames inside, then gone before it was in: forgotten after the grace time
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
        streams = list(self.visits.values()) if stream is None else [self.visits.get(stream, {})]
        return sum(v.entered is not None for visits in streams for v in list(visits.values()))

    def reset(self, stream: int) -> None:
        self.visits.pop(stream, None)
        self.crowds.pop(stream, None)
