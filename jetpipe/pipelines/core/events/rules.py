"""Event rules: zones and lines, per stream, in the frame's normalized coordinates (0..1) or in pixels.

    [[zone]]                       [[line]]
    name = "waiting"               name = "door"
    points = [[0.1, 0.5], ...]     points = [[0.5, 0.0], [0.5, 1.0]]
    streams = [0]                  streams = []          # [] = every stream
    classes = ["person"]           classes = []          # [] = every class (names or numbers)
    min_score = 0.3                min_score = 0.0
    anchor = "bottom-center"       anchor = "bottom-center"   # center, top-left, top-right, bottom-left, ...
    units = "normalized"           units = "normalized"  # or "pixels"
    enter_frames = 3               frames_each_side = 3
    exit_grace_s = 1.0             cooldown_s = 1.0
    hidden_grace_s = 3.0
    loiter_s = 0                   extended = false      # true: the whole line through the two points counts
    occupancy_at_least = 0         # 0: off
    occupancy_for_s = 0.0
    speed_limit_kmh = 0            speed_limit_kmh = 0   # a speed event for a track above it (0: off; needs the
                                                         # stream's [[calibration]]): once a visit, once a crossing

On the command line: `--zone NAME:x1,y1,x2,y2,x3,y3[,...]`, `--line NAME:x1,y1,x2,y2` (normalized, every
stream and class, the defaults above). Everything is checked before anything runs: one line naming the
rule, the key and what is allowed.

Direction of a line: walk along it on the image from its first point to its second. An object crossing from
your right-hand side to your left-hand side goes "in"; from the left to the right, "out". A line drawn from
the top of the frame to its bottom (0.5,0 -> 0.5,1) counts objects moving right (towards larger x) as "in",
objects moving left as "out"; draw it bottom to top to swap them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jetpipe.errors import JetpipeError, some

ANCHORS = ("bottom-center", "center", "top-center", "top-left", "top-right", "bottom-left", "bottom-right")
UNITS = ("normalized", "pixels")
MAX_POINTS = 256
MAX_SECONDS = 86_400.0
MAX_FRAMES = 1_000
MAX_STREAM_ID = 999_999_999  # the control API's /streams/ID takes up to 9 digits
MAX_KMH = 1_000.0            # a speed limit
MAX_CLASS_ID = 9_999         # where the model's own number of classes is not known
MAX_PIXELS = 65_536.0        # a coordinate in pixels (16K video is 15,360 wide)
MIN_LENGTH = {"normalized": 1e-3, "pixels": 1.0}  # the shortest line (a thousandth of the frame; one pixel)
MIN_AREA = {"normalized": 1e-6, "pixels": 1.0}    # the smallest zone
MAX_RULES = 1_000            # rules in all (each costs memory and time in every frame it takes)
MAX_RULES_PER_STREAM = 100   # rules that take any one stream (those of every stream count for each)


class RuleError(JetpipeError):
    """A rule that cannot be used: names the rule, the key and what is allowed."""


@dataclass
class Zone:
    name: str
    points: list                  # [[x, y], ...] at least 3, a simple polygon
    streams: list = field(default_factory=list)   # stream IDs; [] = every stream
    classes: list = field(default_factory=list)   # class names or numbers; [] = every class
    min_score: float = 0.0
    anchor: str = "bottom-center"
    units: str = "normalized"
    enter_frames: int = 3         # an object is in after this many frames inside in a row
    exit_grace_s: float = 1.0     # and out after this long seen outside: a box flickering at the edge does not
    #                               split a visit
    hidden_grace_s: float = 3.0   # or this long not seen at all (behind something: botsort keeps the track 3 s);
    #                               the larger of the two
    loiter_s: float = 0.0         # a loiter event once per visit that lasts this long (0: none)
    occupancy_at_least: int = 0   # an occupancy event when this many are in (0: none) ...
    occupancy_for_s: float = 0.0  # ... for this long, and again when fewer have been in for as long
    speed_limit_kmh: float = 0.0  # a speed event once a visit for a track inside faster than this (0: none)

    kind = "zone"


@dataclass
class Line:
    name: str
    points: list                  # [[x1, y1], [x2, y2]]
    streams: list = field(default_factory=list)
    classes: list = field(default_factory=list)
    min_score: float = 0.0
    anchor: str = "bottom-center"
    units: str = "normalized"
    frames_each_side: int = 3     # a crossing: this many frames on one side, then this many on the other
    cooldown_s: float = 1.0       # after a crossing, the same object's next one counts only after this long
    extended: bool = False        # count crossings beyond the segment's ends too
    speed_limit_kmh: float = 0.0  # a speed event for a crossing faster than this (0: none)

    kind = "line"


_COMMON = {"name": str, "points": list, "streams": list, "classes": list, "min_score": (int, float), "anchor": str,
           "units": str, "speed_limit_kmh": (int, float)}
ZONE_KEYS = {**_COMMON, "enter_frames": int, "exit_grace_s": (int, float), "hidden_grace_s": (int, float),
             "loiter_s": (int, float),
             "occupancy_at_least": int, "occupancy_for_s": (int, float)}
LINE_KEYS = {**_COMMON, "frames_each_side": int, "cooldown_s": (int, float), "extended": bool}


def from_table(table, kind: str, where: str) -> Zone | Line:
    """A [[zone]] or [[line]] table (a dict), its keys and types checked, then the rule itself (check())."""
    keys = ZONE_KEYS if kind == "zone" else LINE_KEYS
    if not isinstance(table, dict):
        raise RuleError(f"{where}: a {kind} is a table with a name and points")
    for key in table:
        if key not in keys:
            raise RuleError(f"{where}: unknown key {key!r}; a {kind} takes {', '.join(sorted(keys))}")
    for key in ("name", "points"):
        if key not in table:
            raise RuleError(f"{where}: {key} is required")
    for key, kinds in keys.items():
        value = table.get(key)
        if key in table and (not isinstance(value, kinds) or (kinds is not bool and isinstance(value, bool))):
            raise RuleError(f"{where} {key} = {value!r}: expected {_kind(kinds)}")
    rule = (Zone if kind == "zone" else Line)(**table)
    check(rule, where)
    return rule


def from_flag(text: str, kind: str) -> Zone | Line:
    """--zone NAME:x1,y1,x2,y2,x3,y3[,...] / --line NAME:x1,y1,x2,y2 (normalized coordinates)."""
    example = "--zone waiting:0.1,0.5,0.4,0.5,0.4,0.9,0.1,0.9" if kind == "zone" else "--line door:0.5,0,0.5,1"
    name, sep, numbers = text.partition(":")
    try:
        values = [float(v) for v in numbers.split(",")] if sep else []
    except ValueError:
        values = []
    if not sep or not values or len(values) % 2:
        raise RuleError(f"--{kind} {text!r}: write NAME:x1,y1,x2,y2{',...' if kind == 'zone' else ''} (pairs of "
                        f"numbers from 0 to 1), e.g. {example}")
    points = [[values[i], values[i + 1]] for i in range(0, len(values), 2)]
    rule = Zone(name, points) if kind == "zone" else Line(name, points)
    check(rule, f"--{kind} {name}")
    return rule


def check(rule: Zone | Line, where: str) -> None:
    """The rule's values, each bounded; a polygon that is one, a line of some length."""
    if not rule.name or not rule.name.replace("-", "").replace("_", "").replace(".", "").isalnum() \
            or len(rule.name) > 64:
        raise RuleError(f"{where}: name {rule.name!r}: letters, digits, '-', '_' and '.', at most 64")
    if rule.anchor not in ANCHORS:
        raise RuleError(f"{where}: anchor {rule.anchor!r}: choose one of {', '.join(ANCHORS)}")
    if rule.units not in UNITS:
        raise RuleError(f"{where}: units {rule.units!r}: normalized (0..1 of the frame) or pixels")
    if not 0.0 <= rule.min_score <= 1.0:
        raise RuleError(f"{where}: min_score {rule.min_score}: from 0 to 1")
    if not 0.0 <= rule.speed_limit_kmh <= MAX_KMH:
        raise RuleError(f"{where}: speed_limit_kmh {rule.speed_limit_kmh}: km/h from 0 (off) to {MAX_KMH:g}")
    if any(not isinstance(s, int) or isinstance(s, bool) or not 0 <= s <= MAX_STREAM_ID for s in rule.streams):
        raise RuleError(f"{where}: streams {_shown(rule.streams)}: stream IDs (0 to {MAX_STREAM_ID:,}), or [] for "
                        "every stream")
    if any(not isinstance(c, (str, int)) or isinstance(c, bool) or (isinstance(c, int) and not 0 <= c <= MAX_CLASS_ID)
           for c in rule.classes):
        raise RuleError(f"{where}: classes {_shown(rule.classes)}: class names or numbers (0 to {MAX_CLASS_ID:,}), "
                        "or [] for every class")
    points = _points(rule, where)
    if rule.kind == "zone":
        _check_zone(rule, points, where)
    else:
        _check_line(rule, points, where)


def check_names_unique(rules: list, where: str) -> None:
    names = [r.name for r in rules]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise RuleError(f"{where}: two rules are named {twice[0]!r}: give each zone and line its own name")


def check_against(rules: list, streams: int, labels, control: bool, where: str, classes: int | None = None) -> None:
    """Rules against the pipeline: streams that exist (with the control API any ID may come later), the classes
    the model has (names; numbers below `classes`, its number of classes where known)."""
    for rule in rules:
        missing = [s for s in rule.streams if s >= streams]
        if missing and not control:
            raise RuleError(f"{where}: {rule.kind} {rule.name!r}: stream {missing[0]} does not exist (the streams are "
                            f"0 to {streams - 1})")
        beyond = [c for c in rule.classes if isinstance(c, int) and classes is not None and c >= classes]
        if beyond:
            raise RuleError(f"{where}: {rule.kind} {rule.name!r}: class {beyond[0]} is not one of the model's: it has "
                            f"{classes} class{'es' if classes != 1 else ''} (0 to {classes - 1}); the rule could "
                            "never count")
        for name in (c for c in rule.classes if isinstance(c, str)):
            if not labels or name not in labels:
                known = some(labels) if labels \
                    else "none: this model's classes have no names; give numbers"
                raise RuleError(f"{where}: {rule.kind} {rule.name!r}: unknown class {name!r}; the model's classes: "
                                f"{known}")


def check_count(rules: list, where: str) -> None:
    """At most MAX_RULES rules, and MAX_RULES_PER_STREAM taking any one stream."""
    if len(rules) > MAX_RULES:
        raise RuleError(f"{where}: {len(rules)} rules: at most {MAX_RULES:,} (each is weighed in every frame it takes)")
    every = sum(1 for r in rules if not r.streams)
    named: dict[int, int] = {}
    for rule in rules:
        for stream in set(rule.streams):
            named[stream] = named.get(stream, 0) + 1
    busiest = max(named.items(), key=lambda item: item[1], default=(None, 0))
    if every + busiest[1] > MAX_RULES_PER_STREAM:
        which = "every stream" if busiest[0] is None else f"stream {busiest[0]}"
        raise RuleError(f"{where}: {every + busiest[1]} rules take {which}: at most {MAX_RULES_PER_STREAM} a stream "
                        "(each is weighed in every frame of the stream)")


def _shown(values: list) -> str:
    """A list as a message shows it: its first values, and a number too long to print shortened."""
    shown = [v if not isinstance(v, int) or abs(v) < 10**12 else f"{str(v)[:6]}...({len(str(v))} digits)"
             for v in values[:5]]
    return f"[{', '.join(map(str, shown))}{', ...' if len(values) > 5 else ''}]"


def _points(rule, where: str) -> list[tuple[float, float]]:
    if len(rule.points) > MAX_POINTS:
        raise RuleError(f"{where}: {len(rule.points)} points: at most {MAX_POINTS}")
    points = []
    for p in rule.points:
        if not (isinstance(p, (list, tuple)) and len(p) == 2 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in p)):
            raise RuleError(f"{where}: point {p!r}: write [x, y]")
        try:
            x, y = float(p[0]), float(p[1])
        except OverflowError:  # an integer beyond any float
            raise RuleError(f"{where}: point {_shown(list(p))}: finite numbers") from None
        if not (x == x and y == y) or abs(x) == float("inf") or abs(y) == float("inf"):
            raise RuleError(f"{where}: point {p!r}: finite numbers")
        if rule.units == "normalized" and not (0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
            raise RuleError(f"{where}: point {p!r} is outside 0..1: normalized coordinates are fractions of the "
                            "frame (units = \"pixels\" for pixels)")
        if rule.units == "pixels" and not (0 <= x <= MAX_PIXELS and 0 <= y <= MAX_PIXELS):
            raise RuleError(f"{where}: point {_shown(list(p))}: pixels from 0 to {MAX_PIXELS:,.0f}")
        points.append((x, y))
    return points


def _check_zone(zone: Zone, points, where: str) -> None:
    if len(points) < 3:
        raise RuleError(f"{where}: a zone needs at least 3 points, got {len(points)}")
    if _self_intersecting(points):
        raise RuleError(f"{where}: the zone's edges cross each other: list its points in order around it")
    if abs(_area(points)) < MIN_AREA[zone.units]:
        raise RuleError(f"{where}: the zone's points enclose no area (at least {MIN_AREA[zone.units]:g} "
                        f"{'of the frame' if zone.units == 'normalized' else 'square pixels'})")
    if not 1 <= zone.enter_frames <= MAX_FRAMES:
        raise RuleError(f"{where}: enter_frames {zone.enter_frames}: from 1 to {MAX_FRAMES}")
    for key in ("exit_grace_s", "hidden_grace_s", "loiter_s", "occupancy_for_s"):
        if not 0.0 <= getattr(zone, key) <= MAX_SECONDS:
            raise RuleError(f"{where}: {key} {getattr(zone, key)}: seconds from 0 to {MAX_SECONDS:g}")
    if not 0 <= zone.occupancy_at_least <= MAX_FRAMES:
        raise RuleError(f"{where}: occupancy_at_least {zone.occupancy_at_least}: from 0 (off) to {MAX_FRAMES}")


def _check_line(line: Line, points, where: str) -> None:
    if len(points) != 2:
        raise RuleError(f"{where}: a line has 2 points, got {len(points)}")
    length = ((points[1][0] - points[0][0]) ** 2 + (points[1][1] - points[0][1]) ** 2) ** 0.5
    if length == 0:
        raise RuleError(f"{where}: the line's two points are the same: a line needs a length")
    if length < MIN_LENGTH[line.units]:
        raise RuleError(f"{where}: the line is {length:.3g} long: at least {MIN_LENGTH[line.units]:g} "
                        f"({'of the frame' if line.units == 'normalized' else 'pixel'}), a line needs a length")
    if not 1 <= line.frames_each_side <= MAX_FRAMES:
        raise RuleError(f"{where}: frames_each_side {line.frames_each_side}: from 1 to {MAX_FRAMES}")
    if not 0.0 <= line.cooldown_s <= MAX_SECONDS:
        raise RuleError(f"{where}: cooldown_s {line.cooldown_s}: seconds from 0 to {MAX_SECONDS:g}")


def _area(points) -> float:
    return 0.5 * sum(x1 * y2 - x2 * y1 for (x1, y1), (x2, y2) in zip(points, points[1:] + points[:1]))


def _self_intersecting(points) -> bool:
    edges = list(zip(points, points[1:] + points[:1]))
    n = len(edges)
    for i in range(n):
        for j in range(i + 1, n):
            if j == i + 1 or (i == 0 and j == n - 1):
                continue  # neighbours share a corner
            if segments_cross(*edges[i], *edges[j]):
                return True
    return False


def segments_cross(a, b, c, d) -> bool:
    """Whether segment ab and segment cd intersect (touching counts)."""
    def orient(p, q, r):
        value = (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])
        return 0 if abs(value) < 1e-12 else (1 if value > 0 else -1)

    def on(p, q, r):
        return min(p[0], q[0]) - 1e-12 <= r[0] <= max(p[0], q[0]) + 1e-12 and \
            min(p[1], q[1]) - 1e-12 <= r[1] <= max(p[1], q[1]) + 1e-12

    o1, o2, o3, o4 = orient(a, b, c), orient(a, b, d), orient(c, d, a), orient(c, d, b)
    if o1 != o2 and o3 != o4:
        return True
    return (o1 == 0 and on(a, b, c)) or (o2 == 0 and on(a, b, d)) or (o3 == 0 and on(c, d, a)) or \
        (o4 == 0 and on(c, d, b))


def _kind(kinds) -> str:
    names = {str: "a string", int: "an integer", list: "a list", (int, float): "a number", bool: "true or false"}
    return names.get(kinds, str(kinds))
