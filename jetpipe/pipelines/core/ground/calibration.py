"""A stream's ground plane: image points and their positions in metres, a homography between them.

    [[calibration]]
    stream = 0
    image = [[612, 1040], [1310, 1040], [1105, 560], [815, 560]]   # points on the ground in the picture
    world = [[0, 0], [7.5, 0], [7.5, 30], [0, 30]]                 # the same points on the ground, metres
    units = "pixels"        # or "normalized" (0..1 of the frame), as the rules' points
    window_s = 1.5          # speed: a straight-line fit of the positions over this much of the frames' clock
                            # (1.5 s: 2.7 km/h off at most on the speed scenes at 30 fps, 1.0 s: 4.6)

Four points or more, no three of four on one line, every one in front of the camera (below the horizon the
homography puts between the picture's ground and its sky). With more than four the points must agree: each
maps to its measured position within TOLERANCE_M (or 2 % of the points' spread) and back. What cannot give a
right position is refused at start with one line: too few points, points on one line, points on both sides of
the horizon, points that disagree.

A box's position on the ground is its anchor (bottom-centre: where an object stands) through the
homography; a box above the horizon has none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from jetpipe.errors import JetpipeError

UNITS = ("pixels", "normalized")
MAX_POINTS = 64
MAX_METRES = 100_000.0     # a world coordinate (100 km: a plane, not a map projection)
MAX_PIXELS = 65_536.0
MIN_WINDOW_S, MAX_WINDOW_S = 0.3, 5.0
TOLERANCE_M = 0.25         # a point's round trip through the fitted plane, beyond 4 points
SPREAD_SHARE = 0.02        # or this share of the points' spread, the larger
COLLINEAR = 1e-3           # a triangle of three points this small beside its longest side squared: a line
HORIZON_MARGIN = 1e-6      # |w| below this share of the points' own: at the horizon (no finite position)
REACH = 10.0               # a position farther from the points' centre than this many times their spread: none
#                            (towards the horizon a pixel is metres: a position there is a guess, not a measure)


class CalibrationError(JetpipeError):
    """A calibration that cannot give right positions: names the stream, the points and the fix."""


@dataclass
class Calibration:
    stream: int
    image: list               # [[x, y], ...] in `units`
    world: list               # [[x, y], ...] metres
    units: str = "pixels"
    window_s: float = 1.5
    plane: GroundPlane | None = field(default=None, init=False, repr=False, compare=False)


KEYS = {"stream": int, "image": list, "world": list, "units": str, "window_s": (int, float)}


def from_table(table, where: str) -> Calibration:
    """A [[calibration]] table, its keys and types checked, then the points (check())."""
    if not isinstance(table, dict):
        raise CalibrationError(f"{where}: a calibration is a table with stream, image and world")
    for key in table:
        if key not in KEYS:
            raise CalibrationError(f"{where}: unknown key {key!r}; a calibration takes {', '.join(sorted(KEYS))}")
    for key in ("stream", "image", "world"):
        if key not in table:
            raise CalibrationError(f"{where}: {key} is required (stream: its ID; image: 4+ points in the picture; "
                                   "world: the same points on the ground in metres)")
    for key, kinds in KEYS.items():
        value = table.get(key)
        if key in table and (not isinstance(value, kinds) or isinstance(value, bool)):
            raise CalibrationError(f"{where} {key} = {str(value)[:60]}: expected "
                                   f"{'a number' if kinds == (int, float) else kinds.__name__}")
    calibration = Calibration(**table)
    check(calibration, where)
    return calibration


def check(calibration: Calibration, where: str) -> None:
    """Every value bounded, the plane fitted (calibration.plane) and refused where it cannot be right."""
    c = calibration
    if not 0 <= c.stream <= 999_999_999:
        raise CalibrationError(f"{where}: stream {c.stream}: a stream ID from 0 to 999,999,999")
    if c.units not in UNITS:
        raise CalibrationError(f"{where}: units {c.units!r}: pixels or normalized (0..1 of the frame)")
    if not MIN_WINDOW_S <= c.window_s <= MAX_WINDOW_S:
        raise CalibrationError(f"{where}: window_s {c.window_s}: seconds from {MIN_WINDOW_S} to {MAX_WINDOW_S}")
    bound = 1.0 if c.units == "normalized" else MAX_PIXELS
    image = _points(c.image, "image", 0.0, bound, where)
    world = _points(c.world, "world", -MAX_METRES, MAX_METRES, where)
    if len(image) != len(world):
        raise CalibrationError(f"{where}: {len(image)} image points and {len(world)} world points: give each image "
                               "point its position on the ground")
    if len(image) < 4:
        raise CalibrationError(f"{where}: {len(image)} points: a ground plane needs at least 4 (the corners of "
                               "a marked rectangle on the ground, e.g. a parking bay or lane markings)")
    for name, points in (("image", image), ("world", world)):
        _check_spread(points, name, where)
    c.plane = GroundPlane.fit(image, world, where, c.units)


def _points(values, name: str, low: float, high: float, where: str) -> np.ndarray:
    if not isinstance(values, list) or len(values) > MAX_POINTS:
        raise CalibrationError(f"{where}: {name}: a list of at most {MAX_POINTS} [x, y] points")
    for p in values:
        if not (isinstance(p, (list, tuple)) and len(p) == 2 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and low <= v <= high
                for v in p)):
            raise CalibrationError(f"{where}: {name} point {str(p)[:60]}: write [x, y], finite numbers from "
                                   f"{low:g} to {high:g}")
    return np.array(values, np.float64).reshape(-1, 2)


def _check_spread(points: np.ndarray, name: str, where: str) -> None:
    """Four points: no three on one line. More: not all near one line (the fit and its round trip judge the
    rest)."""
    if float(np.ptp(points, axis=0).max()) <= 0:
        raise CalibrationError(f"{where}: the {name} points are all one point: spread them over the ground")
    if len(points) == 4:
        for i, j, k in combinations(range(4), 3):
            if _flat(points[i], points[j], points[k]):
                raise CalibrationError(f"{where}: {name} points {i + 1}, {j + 1} and {k + 1} lie on one line: four "
                                       "points must span an area (no three in a row)")
        return
    singular = np.linalg.svd(points - points.mean(axis=0), compute_uv=False)
    if singular[1] < COLLINEAR * singular[0]:
        raise CalibrationError(f"{where}: the {name} points lie on one line: at least four must span an area")


def _flat(a, b, c) -> bool:
    area = abs((b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])) / 2
    longest = max(np.hypot(*(b - a)), np.hypot(*(c - a)), np.hypot(*(c - b)))
    return longest == 0 or area < COLLINEAR * longest ** 2


def _odd_one_out(image: np.ndarray, world: np.ndarray, tolerance: float) -> int | None:
    """The one point without which the others fit a plane within the tolerance (six points or more: five
    always fit one within a point's freedom), or None where no one point is it."""
    import cv2

    if len(image) < 6:
        return None
    fits = []
    for i in range(len(image)):
        others = np.arange(len(image)) != i
        homography, _ = cv2.findHomography(image[others], world[others], 0)
        if homography is None:
            fits.append(math.inf)
            continue
        mapped = np.column_stack([image[others], np.ones(len(image) - 1)]) @ homography.T
        fits.append(float(np.hypot(*(mapped[:, :2] / mapped[:, 2:] - world[others]).T).max()))
    best = int(np.argmin(fits))
    return best if fits[best] <= tolerance else None


class GroundPlane:
    """image -> ground (metres) by a homography fitted to the calibration's points (OpenCV, least squares)."""

    def __init__(self, homography: np.ndarray, units: str = "pixels", sign: float = 1.0, scale: float = 1.0):
        """sign: the sign of w in front of the camera (the calibration points'); scale: their smallest |w|."""
        self.h = np.asarray(homography, np.float64).reshape(3, 3)
        self.units, self.sign, self.scale = units, sign, scale
        self.centre, self.reach = np.zeros(2), math.inf  # positions beyond `reach` metres of `centre`: none

    @classmethod
    def fit(cls, image: np.ndarray, world: np.ndarray, where: str = "calibration",
            units: str = "pixels") -> GroundPlane:
        import cv2  # OpenCV loads with the first calibration, not with jetpipe

        homography, _ = cv2.findHomography(image, world, 0)
        if homography is None or not np.isfinite(homography).all() or abs(np.linalg.det(homography)) < 1e-15:
            raise CalibrationError(f"{where}: no plane fits these points: check that each image point is the "
                                   "world point of the same row")
        w = homography[2, 0] * image[:, 0] + homography[2, 1] * image[:, 1] + homography[2, 2]
        if not ((w > 0).all() or (w < 0).all()):
            raise CalibrationError(f"{where}: the image points lie on both sides of the horizon the world points "
                                   "make: a point is in the wrong row or not on the ground")
        plane = cls(homography, units, 1.0 if w[0] > 0 else -1.0, float(np.abs(w).min()))
        plane.centre, plane.reach = world.mean(axis=0), REACH * float(np.ptp(world, axis=0).max())
        plane.check_round_trip(image, world, where)
        return plane

    def check_round_trip(self, image: np.ndarray, world: np.ndarray, where: str) -> None:
        """Each point to the ground within the tolerance of its measured position, and back to the picture."""
        tolerance = max(TOLERANCE_M, SPREAD_SHARE * float(np.ptp(world, axis=0).max()))
        mapped, ok = self.to_ground(image[:, 0], image[:, 1])
        error = np.where(ok, np.hypot(*(mapped - world).T), np.inf)
        back = np.linalg.inv(self.h) @ np.column_stack([world, np.ones(len(world))]).T
        returned = (back[:2] / back[2]).T
        pixels = SPREAD_SHARE * float(np.ptp(image, axis=0).max())
        worst = int(np.argmax(error))
        if error[worst] > tolerance or not np.isfinite(returned).all() \
                or np.hypot(*(returned - image).T).max() > pixels:
            suspect = _odd_one_out(image, world, tolerance)
            which = f"point {suspect + 1} is the odd one out" if suspect is not None else \
                "check each image point is the world point of its row"
            raise CalibrationError(f"{where}: the points do not fit one ground plane (one maps {error[worst]:.2f} m "
                                   f"from its world position, at most {tolerance:.2f} m): {which}; measure again or "
                                   "leave the doubtful point out")

    def to_ground(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N, 2) metres for image points in the calibration's units (NaN where none), and whether each has one
        (in front of the horizon, within reach)."""
        return _on_ground(self.h, self.sign, self.scale, self.centre, self.reach, x, y)

    def in_front(self, points) -> np.ndarray:
        """Whether each image point (calibration units) is on the ground's side of the horizon."""
        points = np.asarray(points, np.float64).reshape(-1, 2)
        return self.to_ground(points[:, 0], points[:, 1])[1]


def _on_ground(h, sign, scale, centre, reach, x, y) -> tuple[np.ndarray, np.ndarray]:
    """Points through homographies: one (h (3, 3), the rest scalars) or one a point (h (N, 3, 3), the rest per
    point); NaN and False where a point has no position."""
    w = h[..., 2, 0] * x + h[..., 2, 1] * y + h[..., 2, 2]
    ok = w * sign > HORIZON_MARGIN * scale
    safe = np.where(ok, w, 1.0)
    ground = np.column_stack(((h[..., 0, 0] * x + h[..., 0, 1] * y + h[..., 0, 2]) / safe,
                              (h[..., 1, 0] * x + h[..., 1, 1] * y + h[..., 1, 2]) / safe))
    ok &= np.hypot(ground[:, 0] - centre[..., 0], ground[:, 1] - centre[..., 1]) <= reach
    ground[~ok] = np.nan
    return ground, ok


class Planes:
    """Every calibrated stream's plane as stacked arrays: the boxes of a batch's streams mapped in one go."""

    def __init__(self, calibrations: dict):
        """calibrations: stream ID -> Calibration (checked: its plane fitted)."""
        self.streams = np.array(sorted(calibrations), np.int64)
        planes = [calibrations[s].plane for s in self.streams.tolist()]
        self.h = np.array([p.h for p in planes]).reshape(-1, 3, 3)
        self.sign = np.array([p.sign for p in planes])
        self.scale = np.array([p.scale for p in planes])
        self.centre = np.array([p.centre for p in planes]).reshape(-1, 2)
        self.reach = np.array([p.reach for p in planes])
        self.normalized = np.array([calibrations[s].units == "normalized" for s in self.streams.tolist()], bool)
        self.window = np.array([calibrations[s].window_s for s in self.streams.tolist()])

    def to_ground(self, stream: np.ndarray, x: np.ndarray, y: np.ndarray, width, height):
        """Each point's (N, 2) metres through its stream's plane (pixels; width and height: its frame's) and
        its stream's window (NaN both where the stream has no calibration or the point no position)."""
        at = np.minimum(np.searchsorted(self.streams, stream), max(len(self.streams) - 1, 0))
        known = (self.streams[at] == stream) if len(self.streams) else np.zeros(len(stream), bool)
        normalized = self.normalized[at]
        x, y = np.where(normalized, x / width, x), np.where(normalized, y / height, y)
        ground, ok = _on_ground(self.h[at], self.sign[at], self.scale[at], self.centre[at], self.reach[at], x, y)
        ground[~known] = np.nan
        return ground, np.where(known & ok, self.window[at], np.nan)
