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
out once it has been seen outside and not inside for `exit_grace_s`, or not seen at all for `hidden_grace_s`
(the larger of the two: an object behind a pillar, whose track the tracker keeps, does not split its visit);
its dwell is from its first to its last frame inside. A visit lasting `loiter_s` gives one loiter event.
Occupancy (the objects in a zone, per stream) gives an event when it has been at least `occupancy_at_least` for
`occupancy_for_s`, and another when it has been below for as long (hysteresis: no event per flicker).

A batch is decided at once (columns.py): the rules' tests are array operations over all its boxes, and the
states live in columns of one table of tracks; Python runs per box only where a state changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from jetpipe.pipelines.core.events.columns import SWEEP_EVERY, TrackBatch, TrackTable, column, grown
from jetpipe.pipelines.core.events.rules import Line, Zone, segments_cross

LINE_BAND = 0.005   # of the frame's diagonal: an anchor this close to a line is on neither side


class Seen(NamedTuple):
    """One confirmed track's box in one frame, as an event tells of it."""
    track_id: int
    box: list  # [x1, y1, x2, y2], source pixels, as the record's results hold it
    score: float
    class_id: int
    speed_kmh: float | None = None  # on a calibrated stream, where the track has one


@dataclass
class Happened:
    """An event before it becomes a record: what, which rule, which track, and the rule's own fields."""
    type: str
    rule: str
    seen: Seen | None  # None: an event of the zone, not of one object (occupancy)
    t: float
    fields: dict = field(default_factory=dict)


class Engine:
    """The rules of now over one table of tracks: decide() a batch's frames, in order."""

    def __init__(self):
        self.table = TrackTable()
        self.rules: list = []  # rule() engines, replaced whole by a change (the step's lock): read once a batch

    def rule(self, rule, class_ids: set[int] | None):
        """The engine of one Zone or Line (class_ids: those it takes; None: every class)."""
        return (ZoneRule if rule.kind == "zone" else LineRule)(rule, class_ids, self.table)

    def decide(self, frames) -> list[tuple[int, Happened]]:
        """frames: (stream, t, (height, width), results) of a batch, a stream's in its order. Its events as
        (the index of their frame, what happened), in frame order, then rule order."""
        batch = TrackBatch(frames)
        rows = self.table.rows(batch)
        rules = self.rules
        self._clear(rules)  # rows given up to make room
        decided = []
        for order, rule in enumerate(rules):
            rule.fit()
            decided += [(frame, order, happened) for frame, happened in rule.update(batch, rows)]
        decided.sort(key=lambda d: (d[0], d[1]))  # stable: a rule's events of a frame stay in their order
        if self.table.batches % SWEEP_EVERY == 0:
            self._forget(rules)
        return [(frame, happened) for frame, _, happened in decided]

    def _forget(self, rules) -> None:
        """Tracks unseen for long go, unless a zone holds a visit of theirs."""
        gone = self.table.unseen()
        for rule in rules:
            gone &= ~rule.holds()
        for row in np.flatnonzero(gone).tolist():
            self.table.drop(row)
        self._clear(rules)

    def _clear(self, rules) -> None:
        if self.table.dropped:
            for rule in rules:
                rule.clear(self.table.dropped)
            self.table.dropped = []

    def reset(self, stream: int) -> None:
        """The stream left: its tracks and every rule's states of it go."""
        self.table.drop_stream(stream)
        rules = self.rules
        self._clear(rules)
        for rule in rules:
            rule.reset(stream)


def anchor_fractions(anchor: str) -> tuple[float, float]:
    """Where in a box its anchor is: (0, 0) its top-left corner, (0.5, 1) the middle of its bottom edge."""
    if anchor == "center":
        return 0.5, 0.5
    vertical, horizontal = anchor.split("-")
    return {"left": 0.0, "center": 0.5, "right": 1.0}[horizontal], {"top": 0.0, "bottom": 1.0}[vertical]


def in_pixels(points, units: str, frame_hw) -> list[tuple[float, float]]:
    height, width = frame_hw
    return [(x * width, y * height) if units == "normalized" else (x, y) for x, y in points]


def polygon_edges(polygon) -> list[tuple]:
    """A polygon's edges, its last point joined to its first."""
    return list(zip(polygon, polygon[1:] + polygon[:1]))


def inside_polygon(x: np.ndarray, y: np.ndarray, edges) -> np.ndarray:
    """Ray casting, for many points at once; a point on an edge counts as inside on some edges only (as every
    such test)."""
    inside = np.zeros(len(x), bool)
    for (x1, y1), (x2, y2) in edges:
        if y1 == y2:
            continue  # a horizontal edge: no ray crosses it
        spans = (y1 > y) != (y2 > y)
        inside ^= spans & (x < x1 + (y - y1) * (x2 - x1) / (y2 - y1))
    return inside


class _Rule:
    """What every rule keeps: which streams and classes it takes, its geometry in each frame size, and its
    states in columns of the table's rows (COLUMNS: name -> fill, dtype, width)."""

    COLUMNS: dict[str, tuple] = {}

    def __init__(self, rule, class_ids: set[int] | None, table: TrackTable):
        self.rule, self.class_ids, self.table = rule, class_ids, table
        self.streams = set(rule.streams)
        self._stream_list = np.array(sorted(self.streams), np.int64)
        self._class_list = None if class_ids is None else np.array(sorted(class_ids), np.int64)
        self.anchor = anchor_fractions(rule.anchor)
        self._geometry: dict[tuple[int, int], list] = {}
        for name, (fill, dtype, width) in self.COLUMNS.items():
            setattr(self, name, column(0, fill, dtype, width))
        self._rows = 0

    def takes(self, stream: int) -> bool:
        return not self.streams or stream in self.streams

    def taken(self, batch: TrackBatch) -> np.ndarray | None:
        """The boxes (indices) it decides: of its streams and classes, and scored at least its minimum. None:
        every box (most rules: no look at the boxes)."""
        if not self.streams and self._class_list is None and self.rule.min_score <= 0:
            return None
        mask = np.ones(len(batch), bool)
        if self.streams:
            mask &= np.isin(batch.stream, self._stream_list)
        if self._class_list is not None:
            mask &= np.isin(batch.class_id, self._class_list)
        if self.rule.min_score > 0:
            mask &= batch.score >= self.rule.min_score
        return np.flatnonzero(mask)

    def points(self, frame_hw) -> list[tuple[float, float]]:
        points = self._geometry.get(frame_hw)
        if points is None:
            points = self._geometry[frame_hw] = in_pixels(self.rule.points, self.rule.units, frame_hw)
        return points

    def fit(self) -> None:
        """Columns for every row of the table (it grew: the new rows clean)."""
        if self._rows < self.table.capacity:
            for name, (fill, _, _) in self.COLUMNS.items():
                setattr(self, name, grown(getattr(self, name), self.table.capacity, fill))
            self._rows = self.table.capacity

    def clear(self, rows: list[int]) -> None:
        """The table gave these rows up: their states go."""
        rows = [r for r in rows if r < self._rows]
        for name, (fill, _, _) in self.COLUMNS.items():
            getattr(self, name)[rows] = fill

    def holds(self) -> np.ndarray:
        """Rows (a mask below the table's `high`) it needs kept although unseen for long."""
        return np.zeros(self.table.high, bool)

    def reset(self, stream: int) -> None:
        """The stream left (its rows are gone from the table)."""

    def _seen(self, batch: TrackBatch, box: int) -> Seen:
        speed = None if batch.speed is None or batch.speed[box] != batch.speed[box] else float(batch.speed[box])
        return Seen(int(batch.track[box]), batch.box[box].tolist(), float(batch.score[box]), int(batch.class_id[box]),
                    speed)

    def _too_fast(self, seen: Seen, t: float, fields: dict) -> Happened | None:
        """A speed event where the rule has a limit and the track goes faster."""
        limit = self.rule.speed_limit_kmh
        if not limit or seen.speed_kmh is None or seen.speed_kmh <= limit:
            return None
        return Happened("speed", self.rule.name, seen, t, {**fields, "limit_kmh": limit})


class LineRule(_Rule):
    COLUMNS = {"side": (0, np.int8, 0),          # -1 right-hand, +1 left-hand, 0 none yet
               "run": (0, np.int32, 0),          # frames in a row on `side`
               "settled": (0, np.int8, 0),       # the side it held for frames_each_side frames (0: none yet)
               "last_x": (math.nan, np.float64, 0),  # its anchor at its last frame on the settled side
               "last_y": (math.nan, np.float64, 0),
               "blocked_until": (-math.inf, np.float64, 0),  # cooldown
               "counted": (0, np.int8, 0)}       # directions counted for this track: 1 in, 2 out

    def __init__(self, rule: Line, class_ids, table: TrackTable):
        super().__init__(rule, class_ids, table)
        self._equations: dict[tuple[int, int], tuple] = {}

    def equation(self, frame_hw) -> tuple[float, float, float, float]:
        """The line in a frame of this size as a * x + b * y + c, (a, b) of unit length (c: the signed distance
        of (x, y) from it in pixels, positive on its right-hand side); and the band's half-width."""
        found = self._equations.get(frame_hw)
        if found is None:
            (x1, y1), (x2, y2) = self.points(frame_hw)
            length = math.hypot(x2 - x1, y2 - y1)
            a, b = -(y2 - y1) / length, (x2 - x1) / length
            found = self._equations[frame_hw] = (a, b, -(a * x1 + b * y1), LINE_BAND * math.hypot(*frame_hw))
        return found

    def sides(self, batch: TrackBatch, boxes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each box's anchor (x, y) and its side: +1 left-hand, -1 right-hand, 0 within the band (y grows
        downwards: the left-hand side has the negative distance)."""
        x, y = batch.anchors(self.anchor)
        if boxes is not None:
            x, y = x[boxes], y[boxes]
        if batch.size is not None:
            a, b, c, band = self.equation(batch.size)
        else:  # frames of several sizes: each box's own line
            width, height = (v if boxes is None else v[boxes] for v in (batch.width, batch.height))
            (x1, y1), (x2, y2) = self.rule.points
            if self.rule.units == "normalized":
                x1, y1, x2, y2 = x1 * width, y1 * height, x2 * width, y2 * height
            length = np.hypot(x2 - x1, y2 - y1)
            a, b = -(y2 - y1) / length, (x2 - x1) / length
            c, band = -(a * x1 + b * y1), LINE_BAND * np.hypot(width, height)
        distance = a * x + b * y + c
        side = (distance <= -band).view(np.int8) - (distance >= band).view(np.int8)
        return x, y, side

    def update(self, batch: TrackBatch, rows: np.ndarray) -> list[tuple[int, Happened]]:
        boxes = self.taken(batch)
        if not len(batch) or (boxes is not None and not len(boxes)):
            return []
        x, y, side = self.sides(batch, boxes)
        taken = rows if boxes is None else rows[boxes]
        happened = []
        for at in batch.parts(boxes):
            row, now, px, py = taken, side, x, y
            if at is not None:
                row, now, px, py = row[at], side[at], x[at], y[at]
            beside = now != 0  # on the line: decides nothing, interrupts nothing
            still = beside & (now == self.settled[row]) & (now == self.side[row])  # most boxes, most frames
            self.last_x[row[still]], self.last_y[row[still]] = px[still], py[still]
            for k in np.flatnonzero(beside ^ still).tolist():
                box = k if at is None else int(at[k])
                box = box if boxes is None else int(boxes[box])
                for found in self._moved(int(row[k]), int(now[k]), (float(px[k]), float(py[k])), batch, box):
                    happened.append((int(batch.frame[box]), found))
        return happened

    def _moved(self, row: int, side: int, point, batch: TrackBatch, box: int) -> list[Happened]:
        """A box on another side than the one its track settled on: a run there, perhaps a crossing (and a
        speed event where it was faster than the limit)."""
        line = self.rule
        run = int(self.run[row]) + 1 if side == self.side[row] else 1
        self.side[row], self.run[row] = side, run
        if run < line.frames_each_side:
            return []
        settled, last = int(self.settled[row]), (float(self.last_x[row]), float(self.last_y[row]))
        self.settled[row], (self.last_x[row], self.last_y[row]) = side, point
        if settled == 0 or settled == side:
            return []
        direction, bit = ("in", 1) if side == 1 else ("out", 2)  # from the right-hand side to the left: in
        frame_hw = batch.sizes[batch.frame[box]]
        crossed = line.extended or segments_cross(*self.points(frame_hw), last, point)
        t = float(batch.t[box])
        if not crossed or t < self.blocked_until[row] or self.counted[row] & bit:
            return []
        self.counted[row] |= bit
        self.blocked_until[row] = t + line.cooldown_s
        seen = self._seen(batch, box)
        fast = self._too_fast(seen, t, {"direction": direction})
        return [Happened("line_cross", line.name, seen, t, {"direction": direction}), *([fast] if fast else [])]


@dataclass(slots=True)
class _Crowd:
    above: bool = False           # the state last reported
    since: float | None = None    # when the count last crossed the threshold against that state


class ZoneRule(_Rule):
    COLUMNS = {"visiting": (False, np.bool_, 0),   # a visit (or frames inside towards one) is kept
               "run": (0, np.int32, 0),            # frames inside in a row while not in
               "run_start": (math.nan, np.float64, 0),
               "entered": (math.nan, np.float64, 0),  # the visit's start (its first frame inside); NaN: not in
               "last_inside": (math.nan, np.float64, 0),
               "last_seen": (math.nan, np.float64, 0),   # its last frame seen, inside or out
               "loitered": (False, np.bool_, 0),
               "began": (0, np.int64, 0),          # the order visits began in: their events' order
               "sped": (False, np.bool_, 0),       # this visit's speed event given
               "seen": (math.nan, np.float64, 7)}  # x1, y1, x2, y2, score, class, speed when last seen (its exit's)

    def __init__(self, rule: Zone, class_ids, table: TrackTable):
        super().__init__(rule, class_ids, table)
        self.crowds: dict[int, _Crowd] = {}
        self.visits_begun = 0
        self._shape: dict[tuple[int, int], tuple] = {}

    def shape(self, frame_hw=None) -> tuple:
        """The zone in a frame of this size (None: in the frame's 0..1): its edges, its bounding box, and
        whether it is its bounding box (a rectangle along the axes: no edge to test)."""
        found = self._shape.get(frame_hw)
        if found is None:
            polygon = [tuple(p) for p in (self.rule.points if frame_hw is None else self.points(frame_hw))]
            xs, ys = sorted({p[0] for p in polygon}), sorted({p[1] for p in polygon})
            rectangle = len(polygon) == 4 and len(xs) == 2 and len(ys) == 2
            found = self._shape[frame_hw] = (polygon_edges(polygon), xs[0], ys[0], xs[-1], ys[-1], rectangle)
        return found

    def inside(self, batch: TrackBatch, boxes) -> np.ndarray:
        """Whether each box's anchor is inside: its bounding box first, the polygon only for those within."""
        x, y = batch.anchors(self.anchor)
        if boxes is not None:
            x, y = x[boxes], y[boxes]
        if batch.size is not None:
            edges, left, top, right, bottom, rectangle = self.shape(batch.size)
        else:  # frames of several sizes: in each frame's 0..1 (inside-ness holds under scaling)
            width, height = (v if boxes is None else v[boxes] for v in (batch.width, batch.height))
            if self.rule.units == "normalized":
                x, y = x / width, y / height
            edges, left, top, right, bottom, rectangle = self.shape(None)
        inside = (x >= left) & (x <= right) & (y >= top) & (y <= bottom)
        if not rectangle:
            near = np.flatnonzero(inside)
            inside[near] = inside_polygon(x[near], y[near], edges)
        return inside

    def update(self, batch: TrackBatch, rows: np.ndarray) -> list[tuple[int, Happened]]:
        boxes = self.taken(batch)
        inside = self.inside(batch, boxes) if len(batch) else np.zeros(0, bool)
        happened = []
        for generation, at in enumerate(batch.parts(boxes)):
            which = boxes if at is None else (at if boxes is None else boxes[at])
            row = rows if which is None else rows[which]
            happened += self._boxes(batch, which, row, inside if at is None else inside[at])
            frames = [f for f in batch.frames_of(generation) if self.takes(batch.streams[f])]
            if frames:
                happened += self._visits(batch, frames)
        return happened

    def _boxes(self, batch: TrackBatch, which, row, inside) -> list[tuple[int, Happened]]:
        """One generation's boxes (indices; None: every box): visits go on, begin, enter or end before they
        were in."""
        visiting = self.visiting[row]
        if not visiting.any() and not inside.any():
            return []  # no visit, none starting: nothing to keep (most boxes, most frames)
        boxes = np.arange(len(batch)) if which is None else which
        self.seen[row[visiting]] = batch.described()[boxes[visiting]]
        self.last_seen[row[visiting]] = batch.t[boxes[visiting]]
        pending = np.isnan(self.entered[row])
        staying = visiting & inside & ~pending  # most boxes with a visit, most frames
        self.last_inside[row[staying]] = batch.t[boxes[staying]]
        happened = self._speeding(batch, boxes, row, staying) if self.rule.speed_limit_kmh else []
        for k in np.flatnonzero((inside & ~visiting) | (visiting & pending)).tolist():
            found = self._pending(int(row[k]), bool(inside[k]), batch, int(boxes[k]))
            if found:
                happened.append((int(batch.frame[boxes[k]]), found))
        return happened

    def _speeding(self, batch: TrackBatch, boxes: np.ndarray, row: np.ndarray, staying: np.ndarray) -> list:
        """Visits in whose zone the track goes faster than the limit: a speed event, once a visit."""
        if batch.speed is None:
            return []
        fast = staying & ~self.sped[row] & (batch.speed[boxes] > self.rule.speed_limit_kmh)  # NaN: not fast
        happened = []
        for k in np.flatnonzero(fast).tolist():
            box = int(boxes[k])
            self.sped[row[k]] = True
            found = self._too_fast(self._seen(batch, box), float(batch.t[box]), {})
            happened.append((int(batch.frame[box]), found))
        return happened

    def _pending(self, row: int, inside: bool, batch: TrackBatch, box: int) -> Happened | None:
        """A box inside with no visit yet, or one whose visit has not entered: its run of frames inside."""
        if not self.visiting[row]:
            self.visiting[row], self.run[row], self.loitered[row], self.entered[row] = True, 0, False, math.nan
            self.sped[row] = False
            self.began[row], self.visits_begun = self.visits_begun, self.visits_begun + 1
            self.seen[row] = batch.described()[box]
        if not inside:
            self.visiting[row] = False  # its frames inside in a row ended before it was in: as if unseen
            return None
        t = float(batch.t[box])
        self.last_inside[row] = self.last_seen[row] = t
        if self.run[row] == 0:
            self.run_start[row] = t
        self.run[row] += 1
        if self.run[row] < self.rule.enter_frames:
            return None
        self.entered[row] = self.run_start[row]
        return Happened("zone_enter", self.rule.name, self._seen(batch, box), t)

    def _visits(self, batch: TrackBatch, frames: list[int]) -> list[tuple[int, Happened]]:
        """The visits of these frames' streams at their frames' times: exits after the grace time, loiter
        events, and half-begun visits forgotten; then each stream's occupancy."""
        zone = self.rule
        frame_of = {batch.streams[f]: f for f in frames}
        rows = np.flatnonzero(self.visiting[:self.table.high])
        if not len(rows):
            return self._crowds(frame_of, batch)
        streams = self.table.stream[rows]
        t = np.array([batch.times[frame_of[s]] if s in frame_of else math.nan for s in streams.tolist()])
        entered, last = self.entered[rows], self.last_inside[rows]
        ours, pending = ~np.isnan(t), np.isnan(entered)
        hidden = ~(self.last_seen[rows] > last)  # not seen anywhere since its last frame inside
        grace = np.where(hidden, max(zone.exit_grace_s, zone.hidden_grace_s), zone.exit_grace_s)
        leaving = ours & ~pending & (last < t) & (t - last >= grace)
        forgotten = ours & pending & (t - last > zone.exit_grace_s)
        loitering = ours & ~pending & ~leaving & ~self.loitered[rows] & (last - entered >= zone.loiter_s) \
            if zone.loiter_s else np.zeros(len(rows), bool)
        happened = []
        for k in sorted(np.flatnonzero(leaving | loitering).tolist(), key=lambda k: self.began[rows[k]]):
            row, dwell = int(rows[k]), round(float(last[k] - entered[k]), 6)
            kind = "zone_exit" if leaving[k] else "loiter"
            happened.append((frame_of[int(streams[k])], Happened(kind, zone.name, self._last_seen(row),
                                                                  float(t[k]), {"dwell_s": dwell})))
        self.visiting[rows[leaving | forgotten]] = False
        self.loitered[rows[loitering]] = True
        return happened + self._crowds(frame_of, batch)

    def _crowds(self, frame_of: dict[int, int], batch: TrackBatch) -> list[tuple[int, Happened]]:
        if not self.rule.occupancy_at_least:
            return []
        return [(f, h) for stream, f in frame_of.items() for h in self._crowd(stream, batch.times[f])]

    def _last_seen(self, row: int) -> Seen:
        *box, score, class_id, speed = self.seen[row].tolist()
        return Seen(int(self.table.track[row]), box, score, int(class_id), None if speed != speed else speed)

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

    def _kept(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows kept (a mask over the table's rows in use) and their streams. Read by other threads too:
        a rule made since the last batch has no columns yet."""
        high = min(self.table.high, len(self.visiting))
        return self.visiting[:high] & (self.table.key[:high] >= 0), self.table.stream[:high]

    def occupancy(self, stream: int | None = None) -> int:
        kept, streams = self._kept()
        inside = kept & ~np.isnan(self.entered[:len(kept)])
        return int(np.count_nonzero(inside if stream is None else inside & (streams == stream)))

    def visits(self, stream: int) -> int:
        """The visits kept of a stream (entered or on their way in)."""
        kept, streams = self._kept()
        return int(np.count_nonzero(kept & (streams == stream)))

    def streams_visiting(self) -> set[int]:
        kept, streams = self._kept()
        return set(streams[kept].tolist())

    def holds(self) -> np.ndarray:
        held = np.zeros(self.table.high, bool)
        kept, _ = self._kept()
        held[:len(kept)] = kept
        return held

    def reset(self, stream: int) -> None:
        self.crowds.pop(stream, None)
