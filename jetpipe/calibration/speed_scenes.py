"""Speeds with a known answer: vehicles and people on straight paths, seen through a known camera.

A pinhole camera (1080p, focal length in pixels, mounted `height` metres up and tilted down) looks at a flat
ground. Each object is a box in the world (a car 4.5 x 1.8 x 1.5 m, a person 0.5 x 0.5 x 1.75 m) moving at a
constant speed along a straight path; its detection in a frame is the bounding rectangle of its eight
corners' images, each edge jittered by a share of the box's size (a detector's noise), and a share of the
frames missed. The calibration is what a user measures: four points of a marked rectangle on the ground,
clicked to the pixel, with their positions in metres.

`evaluate()` runs the ground step's estimator (pipelines.core.ground) on the detections and reports the error
of every speed it gives against the true one: the largest, the mean, by speed band and by distance, so that
no band's failure hides in an average.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from jetpipe.pipelines.core.events.columns import TrackBatch
from jetpipe.pipelines.core.ground import Calibration, GroundMotion, check
from jetpipe.tasks.detections import Detections

CAR = (4.5, 1.8, 1.5)      # length, width, height in metres
PERSON = (0.5, 0.5, 1.75)
FRAME_HW = (1080, 1920)


@dataclass(frozen=True)
class Camera:
    """A pinhole camera at (0, 0, height) over the ground z = 0, looking along +y, tilted down by tilt_deg."""
    focal_px: float = 1400.0
    height: float = 6.0
    tilt_deg: float = 15.0
    frame_hw: tuple[int, int] = FRAME_HW

    def project(self, points: np.ndarray) -> np.ndarray:
        """(..., 3) world points (metres) -> (..., 2) pixels; NaN behind the camera."""
        tilt = math.radians(self.tilt_deg)
        d = points - np.array([0.0, 0.0, self.height])
        xc = d[..., 0]
        yc = -math.sin(tilt) * d[..., 1] - math.cos(tilt) * d[..., 2]   # image down
        zc = math.cos(tilt) * d[..., 1] - math.sin(tilt) * d[..., 2]    # along the optical axis
        zc = np.where(zc > 0.1, zc, np.nan)
        cy, cx = self.frame_hw[0] / 2, self.frame_hw[1] / 2
        return np.stack([cx + self.focal_px * xc / zc, cy + self.focal_px * yc / zc], axis=-1)


@dataclass(frozen=True)
class Mover:
    size: tuple[float, float, float]
    start: tuple[float, float]   # metres on the ground, the box's centre
    heading: float               # radians from +x towards +y
    speed_kmh: float

    def corners(self, t: float) -> np.ndarray:
        """(8, 3) the box's corners at time t."""
        length, width, height = self.size
        v = self.speed_kmh / 3.6
        cx, cy = self.start[0] + v * t * math.cos(self.heading), self.start[1] + v * t * math.sin(self.heading)
        along, across = np.array([math.cos(self.heading), math.sin(self.heading)]), \
            np.array([-math.sin(self.heading), math.cos(self.heading)])
        out = []
        for a in (-0.5, 0.5):
            for b in (-0.5, 0.5):
                x, y = np.array([cx, cy]) + a * length * along + b * width * across
                out += [(x, y, 0.0), (x, y, height)]
        return np.array(out)


def calibration(camera: Camera, stream: int = 0, window_s: float = 1.5) -> Calibration:
    """What a user measures: a 8 x 30 m rectangle on the ground from 10 m out, its corners clicked to the pixel."""
    world = [[-4.0, 10.0], [4.0, 10.0], [4.0, 40.0], [-4.0, 40.0]]
    image = np.round(camera.project(np.array([[x, y, 0.0] for x, y in world])))
    c = Calibration(stream, image.tolist(), world, "pixels", window_s)
    check(c, "speed scene")
    return c


def movers(seed: int, count: int = 24) -> list[Mover]:
    """Cars at 5-80 km/h along and across the view (and a share of people at walking and running pace), starting
    10-45 m out."""
    rng = np.random.default_rng(seed)
    found = []
    for k in range(count):
        person = k % 4 == 3
        speed = float(rng.uniform(4.0, 15.0) if person else rng.uniform(5.0, 80.0))
        heading = float(rng.choice([math.pi / 2, -math.pi / 2, 0.0, math.pi]) + rng.normal(0, 0.15))
        start = (float(rng.uniform(-10, 10)), float(rng.uniform(12, 45)))
        found.append(Mover(PERSON if person else CAR, start, heading, speed))
    return found


@dataclass(frozen=True)
class Noise:
    jitter: float = 0.02        # each box edge moved by a normal of this share of the box's size (sigma)
    missed: float = 0.10        # frames in which an object is not detected
    fps: float = 30.0
    seconds: float = 6.0


def detections(camera: Camera, objects: list[Mover], noise: Noise, seed: int):
    """Each frame's (t, Detections with the objects' indices + 1 as track IDs, their true speeds), objects
    whose box lies wholly in the frame."""
    rng = np.random.default_rng(seed + 1000)
    height, width = camera.frame_hw
    for k in range(int(noise.seconds * noise.fps)):
        t = k / noise.fps
        boxes, ids, speeds = [], [], []
        for i, mover in enumerate(objects):
            corners = camera.project(mover.corners(t))
            if not np.isfinite(corners).all() or rng.random() < noise.missed:
                continue
            x1, y1 = corners.min(axis=0)
            x2, y2 = corners.max(axis=0)
            if x1 < 0 or y1 < 0 or x2 > width or y2 > height or y2 - y1 < 8:
                continue
            size = np.array([x2 - x1, y2 - y1, x2 - x1, y2 - y1])
            boxes.append(np.array([x1, y1, x2, y2]) + rng.normal(0.0, noise.jitter, 4) * size)
            ids.append(i + 1)
            speeds.append(mover.speed_kmh)
        found = Detections(np.array(boxes).reshape(-1, 4), np.full(len(boxes), 0.9), np.zeros(len(boxes)),
                           tracker_id=np.array(ids, np.int64))
        yield t, found, np.array(speeds)


def evaluate(seed: int, noise: Noise = Noise(), camera: Camera = Camera(), window_s: float = 1.5) -> dict:
    """The estimator's speeds against the true ones over a scene: the largest and mean error (km/h), by true
    speed band and by distance, and the share of object-frames that had a speed."""
    objects = movers(seed)
    motion = GroundMotion({0: calibration(camera, window_s=window_s)})
    errors, truth, distance, given = [], [], [], 0
    frames = 0
    for t, found, speeds in detections(camera, objects, noise, seed):
        frames += len(found)
        position, speed, _ = motion.estimate(TrackBatch([(0, t, camera.frame_hw, found)]))
        known = np.isfinite(speed)
        given += int(known.sum())
        errors += (speed[known] - speeds[known]).tolist()
        truth += speeds[known].tolist()
        distance += np.hypot(position[known, 0], position[known, 1]).tolist()
    errors, truth, distance = np.abs(np.array(errors)), np.array(truth), np.array(distance)
    report = {"seed": seed, "object_frames": frames, "with_speed": given, "max_error_kmh": _max(errors),
              "mean_error_kmh": _mean(errors), "by_speed": {}, "by_distance": {}}
    for low, high in ((0, 20), (20, 50), (50, 81)):
        band = (truth >= low) & (truth < high)
        report["by_speed"][f"{low}-{min(high, 80)} km/h"] = {"n": int(band.sum()), "max": _max(errors[band]),
                                                            "mean": _mean(errors[band])}
    for low, high in ((0, 20), (20, 35), (35, 60)):
        band = (distance >= low) & (distance < high)
        report["by_distance"][f"{low}-{high} m"] = {"n": int(band.sum()), "max": _max(errors[band]),
                                                   "mean": _mean(errors[band])}
    return report


def _max(values: np.ndarray) -> float | None:
    return round(float(values.max()), 2) if len(values) else None


def _mean(values: np.ndarray) -> float | None:
    return round(float(values.mean()), 3) if len(values) else None
