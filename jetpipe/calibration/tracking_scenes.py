"""Scenes with ground truth for measuring trackers: objects that walk behind pillars, cross each other's paths,
walk in groups, stop and go, under a panning and shaking camera, at 10 or 30 fps.

A scene is simulated at the level of what a detector gives a tracker: every object has a box on the frames'
clock; what of it is visible is sampled on an 8 x 8 grid (pillars are in front of everyone; of two objects,
the one lower in the picture is nearer and hides the other); an object with at least MIN_VISIBLE of its box
in view is in the ground truth with its visible box, and is detected with probability DETECTED, its box
jittered by 2 % of its size, its score falling with how much of it is hidden (a half-hidden object is a
"weak" detection, as ByteTrack calls them); a few false detections a second come and go. Seeds make every
scene the same on every machine. (A rendered video of such scenes, through a real detector, is the next step;
this measures what the trackers do with the same detections.)
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from jetpipe import synth

SCENES = ("pillars", "crossing", "groups", "stop_and_go", "pan")
WIDTH, HEIGHT = 1920, 1080
GRID = 8
MIN_VISIBLE = 0.3      # of a box's grid points in view: in the ground truth, and detectable
DETECTED = 0.95        # chance a detectable object is detected in a frame
JITTER = 0.02          # of the box's width / height, one standard deviation a coordinate
FALSE_PER_S = 3.0      # false detections a second


@dataclass
class Walker:
    """An object crossing the scene: in it from `start` (seconds), at (x, y) (its box's top-left, world pixels),
    `speed` px/s along x (negative: right to left), `stops`: (from, seconds) pauses on its own clock."""

    start: float
    x: float
    y: float
    speed: float
    w: float
    h: float
    stops: list = field(default_factory=list)

    def box(self, t: float) -> np.ndarray | None:
        if t < self.start:
            return None
        moving = t - self.start
        for begin, seconds in self.stops:
            if moving > begin:
                moving -= min(seconds, moving - begin)
        x = self.x + self.speed * moving
        return np.array([x, self.y, x + self.w, self.y + self.h])


@dataclass
class Frame:
    t: float
    gt_ids: np.ndarray      # (n,) int: each visible object's ID (its index in the scene)
    gt_boxes: np.ndarray    # (n, 4) its visible box, image pixels
    boxes: np.ndarray       # (d, 4) the detections
    scores: np.ndarray      # (d,)
    truth: np.ndarray       # (d,) the object a detection is of (-1: a false one)
    camera: np.ndarray = field(default_factory=lambda: np.zeros(2))  # the view's offset (pan): x, y pixels


@dataclass
class Scene:
    name: str
    fps: float
    frames: list[Frame]

    @property
    def objects(self) -> int:
        return len({int(i) for f in self.frames for i in f.gt_ids})


def make_scene(name: str, fps: float = 30.0, seconds: float = 20.0, seed: int = 0) -> Scene:
    """One of SCENES at `fps` (the same objects and paths at any fps: only the sampling differs)."""
    if name not in SCENES:
        raise ValueError(f"scene {name!r}: choose one of {', '.join(SCENES)}")
    if not 1 <= fps <= 120 or not 1 <= seconds <= 600:
        raise ValueError(f"scene {name}: fps {fps} (1-120), seconds {seconds} (1-600)")
    layout = np.random.default_rng([seed, SCENES.index(name)])
    walkers, pillars, pan = _LAYOUTS[name](layout, seconds)
    noise = np.random.default_rng([seed, SCENES.index(name), int(fps * 1000)])
    frames = [_frame(k / fps, walkers, pillars, pan, noise, fps) for k in range(int(seconds * fps))]
    return Scene(f"{name}@{fps:g}fps", fps, frames)


# -- the scenes -----------------------------------------------------------------------------------------------------
def _person(rng, start, x, y, speed, stops=()) -> Walker:
    h = rng.uniform(120, 180)
    return Walker(start, x, y - h, speed, h * 0.4, h, list(stops))


def _crossers(rng, count: int, seconds: float, rows=(300, 1000), speeds=(120, 200)) -> list[Walker]:
    """`count` people entering from either side over the first half, walking across."""
    walkers = []
    for k in range(count):
        right = k % 2 == 0
        speed = rng.uniform(*speeds)
        walkers.append(_person(rng, rng.uniform(0, seconds / 2), -80 if right else WIDTH + 10,
                               rng.uniform(*rows), speed if right else -speed))
    return walkers


def _pillars(rng, seconds):
    """20 people, three pillars 240 px wide: 1-2 s behind each."""
    return _crossers(rng, 20, seconds), [(440, 680), (1000, 1240), (1560, 1800)], None


def _crossing(rng, seconds):
    """30 people in one band, half each way: they pass in front of and behind each other."""
    return _crossers(rng, 30, seconds, rows=(560, 700), speeds=(100, 200)), [], None


def _groups(rng, seconds):
    """Six groups of three walking together, one pillar."""
    walkers = []
    for g in range(6):
        right, start, y = g % 2 == 0, rng.uniform(0, seconds / 2), rng.uniform(400, 950)
        speed = rng.uniform(110, 170) * (1 if right else -1)
        for m in range(3):
            x = (-80 - 70 * m) if right else (WIDTH + 10 + 70 * m)
            walkers.append(_person(rng, start, x, y + 25 * m, speed))
    return walkers, [(900, 1120)], None


def _stop_and_go(rng, seconds):
    """15 people stopping for 1-3 s, some of them behind one of two pillars."""
    walkers = _crossers(rng, 15, seconds)
    for w in walkers:
        w.stops = [(rng.uniform(2, 8), rng.uniform(1, 3))]
    return walkers, [(600, 820), (1250, 1470)], None


def _pan(rng, seconds):
    """20 people and two pillars under a camera panning 150 px back and forth (8 s a sweep) and shaking by 3 px;
    four people stand still."""
    walkers = _crossers(rng, 16, seconds) + [_person(rng, 0, x, rng.uniform(500, 900), 0.0)
                                             for x in (300, 800, 1300, 1700)]
    shake = rng.normal(0, 3, (int(seconds * 120) + 2, 2))

    def pan(t: float) -> np.ndarray:
        return np.array([150 * np.sin(2 * np.pi * t / 8), 0.0]) + shake[int(t * 120)]
    return walkers, [(700, 900), (1300, 1500)], pan


_LAYOUTS = {"pillars": _pillars, "crossing": _crossing, "groups": _groups, "stop_and_go": _stop_and_go,
            "pan": _pan}


# -- a frame --------------------------------------------------------------------------------------------------------
def _frame(t, walkers, pillars, pan, rng, fps) -> Frame:
    offset = pan(t) if pan is not None else np.zeros(2)
    ids, boxes = [], []
    for i, walker in enumerate(walkers):
        box = walker.box(t)
        if box is not None:
            ids.append(i)
            boxes.append(box - np.tile(offset, 2))
    ids, boxes = np.array(ids, np.int64), np.array(boxes, np.float64).reshape(-1, 4)
    walls = np.array([(x0 - offset[0], -1e9, x1 - offset[0], 1e9) for x0, x1 in pillars]).reshape(-1, 4)
    share, visible = _visible(boxes, walls)
    seen = share >= MIN_VISIBLE
    ids, visible, share = ids[seen], visible[seen], share[seen]
    detected = rng.random(len(ids)) < DETECTED
    found = visible[detected]
    size = np.tile(found[:, 2:] - found[:, :2], 2)
    found = found + rng.normal(0, JITTER, found.shape) * size
    scores = np.clip(0.35 + 0.6 * share[detected] + rng.normal(0, 0.05, detected.sum()), 0.05, 0.99)
    false = _false_detections(rng, fps)
    return Frame(t, ids, visible, np.concatenate([found, false[0]]), np.concatenate([scores, false[1]]),
                 np.concatenate([ids[detected], np.full(len(false[1]), -1)]), offset)


def _visible(boxes: np.ndarray, walls: np.ndarray, covers: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each box's share in view (grid points not behind a pillar, a nearer object or the frame's edge) and
    the box around those points (cells, not points: a fully visible box is itself). covers: what of each
    object hides the others (a rendered sign: its card around its word); default the boxes themselves."""
    covers = boxes if covers is None else covers
    n = len(boxes)
    if not n:
        return np.zeros(0), np.zeros((0, 4))
    u = (np.arange(GRID) + 0.5) / GRID
    gx, gy = np.meshgrid(u, u)
    size = boxes[:, 2:] - boxes[:, :2]
    points = boxes[:, None, :2] + np.stack([gx.ravel(), gy.ravel()], axis=1)[None] * size[:, None, :]
    hidden = (points[..., 0] < 0) | (points[..., 0] >= WIDTH) | (points[..., 1] < 0) | (points[..., 1] >= HEIGHT)
    for x0, y0, x1, y1 in walls:
        hidden |= (points[..., 0] >= x0) & (points[..., 0] < x1) & (points[..., 1] >= y0) & (points[..., 1] < y1)
    nearer = covers[None, :, 3] > covers[:, None, 3]  # [i, j]: j is in front of i
    c = covers[None, None]
    inside = ((points[:, :, None, 0] >= c[..., 0]) & (points[:, :, None, 0] < c[..., 2]) &
              (points[:, :, None, 1] >= c[..., 1]) & (points[:, :, None, 1] < c[..., 3]))
    hidden |= (inside & nearer[:, None, :]).any(axis=2)
    share = 1.0 - hidden.mean(axis=1)
    cell = np.stack([np.tile(np.arange(GRID), GRID), np.repeat(np.arange(GRID), GRID)], axis=1)  # (64, 2): x, y
    shown = ~hidden
    lo = np.where(shown[..., None], cell[None], GRID).min(axis=1)
    hi = np.where(shown[..., None], cell[None] + 1, 0).max(axis=1)
    visible = np.concatenate([boxes[:, :2] + lo / GRID * size, boxes[:, :2] + hi / GRID * size], axis=1)
    return share, np.clip(visible, 0, [WIDTH, HEIGHT, WIDTH, HEIGHT])  # a cell half out of the frame: its inside


def _false_detections(rng, fps: float) -> tuple[np.ndarray, np.ndarray]:
    count = rng.poisson(FALSE_PER_S / fps)
    xy = rng.uniform([0, 0], [WIDTH - 150, HEIGHT - 150], (count, 2))
    wh = rng.uniform(40, 140, (count, 2))
    return np.concatenate([xy, xy + wh], axis=1), rng.uniform(0.2, 0.6, count)


# -- looks of a known quality, for botsort's use of appearance --------------------------------------------------------
class SimulatedLooks:
    """What a ReID network would give for the scenes' detections, of a known quality: each object a random unit
    vector, each look of it that vector plus noise (`noise`: the noise's length against the vector's), a false
    detection a random vector. squeeze: every look pulled toward one direction (0: none; 0.9: every pair of
    objects at a cosine near 0.9, as the colour cue puts light signs). `embed_for(frame)` is botsort's embed()
    for a scene's frame; `asked` counts the looks given."""

    def __init__(self, noise: float, dim: int = 32, seed: int = 0, squeeze: float = 0.0):
        self.rng = np.random.default_rng(seed)
        self.vectors = _unit(self.rng.normal(size=(1000, dim)))
        self.noise, self.squeeze, self.asked = noise, squeeze, 0
        self.common = _unit(np.ones(dim))

    def look(self, own: np.ndarray) -> np.ndarray:
        v = _unit(own + self.rng.normal(size=own.shape) * self.noise / np.sqrt(own.shape[-1]))
        return _unit(self.squeeze * self.common + (1 - self.squeeze) * v)

    def embed_for(self, frame: Frame):
        def embed(jobs) -> np.ndarray:
            rows = []
            for _, boxes in jobs:
                for box in np.asarray(boxes).reshape(-1, 4):
                    truth = frame.truth[np.flatnonzero((frame.boxes == box).all(axis=1))[0]]
                    rows.append(self.look(self.vectors[truth] if truth >= 0 else _unit(self.rng.normal(
                        size=self.vectors.shape[1]))))
            self.asked += len(rows)
            return np.array(rows).reshape(-1, self.vectors.shape[1])
        return embed


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


# -- the same scenes as video, for a real detector ------------------------------------------------------------------
SIGN_MARGIN = 10  # pixels of card around a sign's word


def render_scene(name: str, video: Path, fps: float = 30.0, seconds: float = 12.0, seed: int = 0) -> Path:
    """The scene as an H.264 video a real text detector sees: every walker carries a sign (one word on a light
    card, the walker's width), pillars in front of everyone, the nearer sign hiding the farther (the panning
    scene on a paved ground: a moving camera's motion is measured on what the ground shows); with its
    ground truth beside it in MOTChallenge format (gt.txt: frame from 1, id, left, top, width, height, 1, 1,
    visibility), the visible part of each sign seen at MIN_VISIBLE or more: its card, which is what PP-OCR's
    detector outlines (its boxes are grown past the ink, by about the card's margin). Needs ffmpeg; returns
    gt.txt."""
    import cv2  # OpenCV and Pillow load with the first scene rendered, not with `jetpipe calibrate`
    from PIL import Image, ImageDraw

    if name not in SCENES:
        raise ValueError(f"scene {name!r}: choose one of {', '.join(SCENES)}")
    rng = np.random.default_rng([seed, SCENES.index(name), 7])
    walkers, pillars, pan = _LAYOUTS[name](np.random.default_rng([seed, SCENES.index(name)]), seconds)
    fonts = synth.several_fonts()
    signs = []
    for walker in walkers:  # a word a walker, its card as wide as the word needs; the walker's box is the card
        font = synth.pick_font(rng, fonts, int(rng.integers(34, 46)))
        word = synth.random_word(rng)
        x0, y0, x1, y1 = ImageDraw.Draw(Image.new("RGB", (1, 1))).textbbox((0, 0), word, font=font)
        card = Image.new("RGB", (x1 - x0 + 2 * SIGN_MARGIN, y1 - y0 + 2 * SIGN_MARGIN),
                         tuple(int(v) for v in rng.integers(200, 256, 3)))
        ImageDraw.Draw(card).text((SIGN_MARGIN - x0, SIGN_MARGIN - y0), word, font=font, fill=(0, 0, 0))
        walker.w, walker.h = card.size
        signs.append(np.asarray(card)[:, :, ::-1])
    margin = 400
    ground = synth.background(rng, HEIGHT + 2 * margin, WIDTH + 2 * margin)
    if pan is not None:  # a ground with texture, as a real one has: a moving camera's motion is measured on it
        ground = _textured(ground, rng)
    command = ["ffmpeg", "-loglevel", "error", "-y", "-f", "rawvideo", "-pix_fmt", "bgr24", "-s", f"{WIDTH}x{HEIGHT}",
               "-r", f"{fps:g}", "-i", "-", "-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p",
               "-g", str(int(fps)), str(video)]
    encoder = subprocess.Popen(command, stdin=subprocess.PIPE)
    rows = []
    for k in range(int(seconds * fps)):
        t = k / fps
        offset = pan(t) if pan is not None else np.zeros(2)
        ox, oy = int(round(offset[0])), int(round(offset[1]))
        image = ground[margin + oy:margin + oy + HEIGHT, margin + ox:margin + ox + WIDTH].copy()
        present = [(i, w.box(t) - np.tile(offset, 2)) for i, w in enumerate(walkers) if w.box(t) is not None]
        for i, box in sorted(present, key=lambda p: p[1][3]):  # the farther first: the nearer paints over it
            _paste(image, signs[i], int(round(box[0])), int(round(box[1])))
        for x0, x1 in pillars:
            cv2.rectangle(image, (int(x0 - offset[0]), 0), (int(x1 - offset[0]) - 1, HEIGHT - 1), (70, 70, 75), -1)
        encoder.stdin.write(image.tobytes())
        if present:
            ids = np.array([i for i, _ in present])
            cards = np.array([b for _, b in present])
            walls = np.array([(x0 - offset[0], -1e9, x1 - offset[0], 1e9) for x0, x1 in pillars]).reshape(-1, 4)
            share, visible = _visible(cards, walls)
            for i, v, b in zip(ids[share >= MIN_VISIBLE], share[share >= MIN_VISIBLE], visible[share >= MIN_VISIBLE]):
                rows.append(f"{k + 1},{i + 1},{b[0]:.1f},{b[1]:.1f},{b[2] - b[0]:.1f},{b[3] - b[1]:.1f},1,1,{v:.3f}")
    encoder.stdin.close()
    if encoder.wait() != 0:
        raise RuntimeError("ffmpeg could not encode the scene")
    gt = Path(video).with_name("gt.txt")
    gt.write_text("\n".join(rows) + "\n")
    return gt


def _textured(ground: np.ndarray, rng) -> np.ndarray:
    """The ground with paving on it: flagstones of slightly different shades with darker joints, and grit."""
    import cv2

    height, width = ground.shape[:2]
    stone = 90
    shades = rng.normal(0, 14, (height // stone + 2, width // stone + 2)).astype(np.float32)
    paving = cv2.resize(shades, None, fx=stone, fy=stone, interpolation=cv2.INTER_NEAREST)[:height, :width]
    paving[::stone, :] -= 45
    paving[:, ::stone] -= 45
    grit = cv2.GaussianBlur(rng.normal(0, 30, (height, width)).astype(np.float32), (0, 0), 1.5)
    return np.clip(ground + (paving + grit)[..., None], 0, 255).astype(np.uint8)


def _paste(image: np.ndarray, sign: np.ndarray, x: int, y: int) -> None:
    h, w = sign.shape[:2]
    x0, y0, x1, y1 = max(0, x), max(0, y), min(image.shape[1], x + w), min(image.shape[0], y + h)
    if x1 > x0 and y1 > y0:
        image[y0:y1, x0:x1] = sign[y0 - y:y1 - y, x0 - x:x1 - x]
