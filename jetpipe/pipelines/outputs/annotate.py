"""Results drawn on frames: boxes, scores, class names, track IDs and speeds (calibrated streams), read text,
masks and segmented regions (outlines filled translucent), keypoint skeletons, over the source image (CPU, OpenCV).

For sinks a person looks at (annotated video, the preview page). The frame is converted from the ring's
YUV once, at the size the sink wants, then drawn on in place.
"""

from __future__ import annotations

import numpy as np

from jetpipe.frames import frame_size, native_planes
from jetpipe.lazy import lazy_import
from jetpipe.preprocess import opencv_bgr
from jetpipe.tasks.detections import Detections, as_detections
from jetpipe.tasks.pose_yolo import COCO_LIMBS, VISIBLE

cv2 = lazy_import("cv2")

# distinct colours for track IDs (BGR), cycled
PALETTE = [(75, 25, 230), (75, 180, 60), (25, 225, 255), (200, 130, 0), (48, 130, 245), (180, 30, 145),
            (240, 240, 70), (230, 50, 240), (60, 245, 210), (212, 190, 250), (128, 128, 0), (255, 190, 220)]
UNTRACKED = (0, 255, 0)  # a box that is not (yet) part of a track
SCENE = (255, 255, 0)  # the events' zones and lines (cyan), apart from the tracks' colours
MASK_OPACITY = 0.4
REGION_LABELS = 8  # the largest regions of a segmented frame named on it


def output_size(source_hw: tuple[int, int], width: int | None) -> tuple[int, int]:
    """(height, width) of the drawn frame: the source's, or scaled to `width` (both even, for encoders)."""
    h, w = source_hw
    if width is None or width >= w:
        return h // 2 * 2, w // 2 * 2
    return max(2, round(h * width / w) // 2 * 2), width // 2 * 2


def to_bgr(frame: np.ndarray, fmt: str, size_hw: tuple[int, int]) -> np.ndarray:
    """A host frame of any jetpipe format -> BGR at size_hw (a new array). YUV frames are resized plane by
    plane first and converted at the target size: a 1080p frame shown 960 wide costs a quarter."""
    height, width = frame_size(frame, fmt)
    h, w = size_hw
    if fmt in ("nv12", "i420") and (h, w) != (height, width):
        frame = _resize_420(frame, fmt, height, width, h, w)
    bgr = opencv_bgr(frame, fmt)
    if bgr.shape[:2] != (h, w):
        bgr = cv2.resize(bgr, (w, h), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(bgr)


def _resize_420(frame, fmt, height, width, h, w) -> np.ndarray:
    """An NV12 / I420 frame resized to (h, w), still in its own layout."""
    out = np.empty((h * 3 // 2, w), np.uint8)
    cv2.resize(frame[:height], (w, h), dst=out[:h], interpolation=cv2.INTER_AREA)
    if fmt == "nv12":
        uv = frame[height:].reshape(height // 2, width // 2, 2)
        out[h:] = cv2.resize(uv, (w // 2, h // 2), interpolation=cv2.INTER_AREA).reshape(h // 2, w)
    else:
        chroma = native_planes(frame, fmt, height, width)[1:]
        small = [cv2.resize(c, (w // 2, h // 2), interpolation=cv2.INTER_AREA).reshape(-1) for c in chroma]
        out[h:] = np.concatenate(small).reshape(h // 2, w)
    return out


def draw(image: np.ndarray, found: Detections, source_hw: tuple[int, int]) -> np.ndarray:
    """Draw one frame's results (in source pixels; a results dict is taken too) on `image` (BGR, any size), in
    place."""
    found = as_detections(found)
    scale_y, scale_x = image.shape[0] / source_hw[0], image.shape[1] / source_hw[1]
    boxes = found.xyxy.astype(np.float64) * [scale_x, scale_y, scale_x, scale_y]
    scores = found.confidence.tolist() if found.has_boxes else [None] * len(boxes)
    classes = found.names() or [None] * len(boxes)
    tracks = found.track_list()
    speeds = found.ground.speed_list() if found.ground is not None else [None] * len(boxes)
    said = _secondary_words(found.secondary, len(boxes))
    quads = found.data.get("quads")
    quads = [None] * len(boxes) if quads is None else quads
    thickness = max(1, round(image.shape[0] / 360))
    frame = found.frame_data
    if frame.get("regions"):  # semantic segmentation: regions of each class, filled in its colour
        regions = frame["regions"]
        _fill_outlines(image, [r["polygon"] for r in regions], [r["class"] for r in regions], (scale_x, scale_y))
        for region in regions[:REGION_LABELS]:
            top = min(region["polygon"], key=lambda p: p[1], default=None)
            if top is not None:
                _label(image, region["label"], (int(top[0] * scale_x), int(top[1] * scale_y)),
                       _object_colour(0, region["class"]))
    if len(found.data.get("polygons", ())):
        _fill_outlines(image, found.data["polygons"], tracks, (scale_x, scale_y))
    if len(found.data.get("keypoints", ())):
        _draw_skeletons(image, found.data["keypoints"], tracks, (scale_x, scale_y), thickness)
    for box, quad, score, cls, track, speed, words in zip(boxes.round().astype(int), quads, scores, classes, tracks,
                                                         speeds, said):
        color = PALETTE[track % len(PALETTE)] if track is not None else UNTRACKED
        if quad is not None:  # a text line's quadrilateral, turned with the line
            corners = np.round(np.asarray(quad, np.float64) * [scale_x, scale_y]).astype(np.int32)
            cv2.polylines(image, [corners], True, color, thickness)
        else:
            cv2.rectangle(image, (int(box[0]), int(box[1])), (int(box[2]), int(box[3])), color, thickness)
        label = " ".join(p for p in (f"#{track}" if track is not None else "", cls or "",
                                     f"{score:.2f}" if score is not None else "",
                                     f"{speed:.0f} km/h" if speed is not None else "", words) if p)
        if label:
            _label(image, label, (int(box[0]), int(box[1])), color)
    _, top_scores, top_names = found.top()
    if top_names:  # classification: the top classes, top left
        _label(image, ", ".join(f"{c}: {s:.2f}" for c, s in zip(top_names[:3], top_scores)), (4, 4), (255, 255, 255))
    if "text" in frame:  # a recognizer's line: what it read, top left
        _label(image, f"{frame['text'].strip()} ({frame.get('score', 0):.2f})", (4, 4), (255, 255, 255))
    return image


def _object_colour(index: int, track) -> tuple[int, int, int]:
    """An object's fill / skeleton colour: its track's, else one per object of the frame."""
    return PALETTE[(track if track is not None else index) % len(PALETTE)]


def _fill_outlines(image, polygons, tracks, scale) -> None:
    """Each object's mask outline filled, blended over the frame once for all of them."""
    overlay = image.copy()
    for i, (polygon, track) in enumerate(zip(polygons, tracks)):
        if len(polygon) >= 3:
            corners = np.round(np.asarray(polygon, np.float64) * scale).astype(np.int32)
            cv2.fillPoly(overlay, [corners], _object_colour(i, track))
    cv2.addWeighted(overlay, MASK_OPACITY, image, 1 - MASK_OPACITY, 0, dst=image)


def _draw_skeletons(image, keypoints, tracks, scale, thickness) -> None:
    """Each object's keypoints (those it sees) and, for COCO's 17, the limbs between them."""
    radius = thickness + 1
    for i, (points, track) in enumerate(zip(keypoints, tracks)):
        points = np.asarray(points, np.float64).reshape(len(points), -1)
        seen = points[:, 2] >= VISIBLE if points.shape[1] > 2 else np.ones(len(points), bool)
        xy = np.round(points[:, :2] * scale).astype(int)
        colour = _object_colour(i, track)
        if len(points) == 17:
            for a, b in COCO_LIMBS:
                if seen[a] and seen[b]:
                    cv2.line(image, tuple(xy[a]), tuple(xy[b]), colour, thickness, cv2.LINE_AA)
        for (x, y), visible in zip(xy, seen):
            if visible:
                cv2.circle(image, (int(x), int(y)), radius, colour, -1, cv2.LINE_AA)


def _secondary_words(secondary: dict, count: int) -> list[str]:
    """Per box, what the secondary models said of it: the text read, or the top class."""
    words = [[] for _ in range(count)]
    for entries in secondary.values():
        for said, entry in zip(words, entries):
            if entry and entry.get("text", "").strip():
                said.append(repr(entry["text"].strip()))
            elif entry and (named := as_detections(entry).top()[2]):  # a secondary classifier's best class
                said.append(named[0])
    return [" ".join(w) for w in words]


def _label(image, text, corner, color) -> None:
    scale = max(0.35, image.shape[0] / 1440)
    (w, h), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)
    x, y = corner[0], max(h + base, corner[1])
    cv2.rectangle(image, (x, y - h - base), (x + w, y), color, -1)
    cv2.putText(image, text, (x, y - base), cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), 1, cv2.LINE_AA)


def draw_scene(image: np.ndarray, scene, source_hw: tuple[int, int]) -> np.ndarray:
    """The events' zones and lines (EventStep.scene: points in source pixels) with their counts, in place. A
    line carries an arrow to the side its "in" crossings go to."""
    scale = np.array([image.shape[1] / source_hw[1], image.shape[0] / source_hw[0]])
    thickness = max(1, round(image.shape[0] / 360))
    for kind, points, text in scene:
        corners = np.round(np.asarray(points, np.float64) * scale).astype(np.int32)
        cv2.polylines(image, [corners], kind == "zone", SCENE, thickness, cv2.LINE_AA)
        if kind == "line":
            _in_arrow(image, corners, thickness)
        _label(image, text, tuple(int(v) for v in corners[0]), SCENE)
    return image


def _in_arrow(image, corners, thickness) -> None:
    """From the line's middle towards its left-hand side (walking from its first point to its second): where
    "in" goes (rules.py's convention; y grows downwards, so the left-hand normal of (dx, dy) is (dy, -dx))."""
    (x1, y1), (x2, y2) = corners[:2].astype(np.float64)
    dx, dy = x2 - x1, y2 - y1
    length = max(1e-6, np.hypot(dx, dy))
    reach = max(16.0, image.shape[0] / 10)
    middle = np.array([(x1 + x2) / 2, (y1 + y2) / 2])
    tip = middle + np.array([dy, -dx]) / length * reach
    cv2.arrowedLine(image, tuple(int(v) for v in middle.round()), tuple(int(v) for v in tip.round()), SCENE,
                    thickness, cv2.LINE_AA, tipLength=0.3)
    _label(image, "in", tuple(int(v) for v in tip.round()), SCENE)


def render(frame: np.ndarray, fmt: str, found: Detections, width: int | None, scene=None) -> np.ndarray:
    """A host frame with one record's results (and the events' scene, where given) drawn on it, BGR, `width`
    wide (None: the frame's size)."""
    source_hw = frame_size(frame, fmt)
    image = draw(to_bgr(frame, fmt, output_size(source_hw, width)), found, source_hw)
    return draw_scene(image, scene, source_hw) if scene else image
