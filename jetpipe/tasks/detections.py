"""One frame's results as arrays: what a task makes of a frame, what every per-frame step reads and writes, and
what the sinks turn into JSON once (as supervision's `Detections` and Ultralytics' `Results` do).

    det = Detections(xyxy, confidence, class_id, labels=names, data={"quads": quads}, layout=KEYS)
    len(det)                        # objects in the frame
    det.xyxy                        # (N, 4) float32, x1 y1 x2 y2 in source pixels
    det.confidence, det.class_id    # (N,) float32, (N,) int64 (None: objects of one kind, e.g. text lines)
    det.tracker_id                  # (N,) int64, NO_TRACK where a box has no confirmed track (None: no tracker)
    det.data["quads"]               # per-object extras (N, ...) arrays or N-long lists: quads, keypoints, polygons
    det.frame_data                  # what the task says of the frame as a whole (a classifier's top classes)
    det.secondary["text"]           # a secondary model's result per object (None where it did not run)
    det.ground                      # Ground: position (m), speed (km/h), heading (deg) where calibrated (None)
    det[det.confidence > 0.5]       # the objects that pass, every per-object array and list taken alike
    det.to_results()                # the JSON record's "results", as jetpipe has always written it

A task that finishes into lists (a record dict, as before this type) is wrapped by `from_results`: its dict
is kept and written as it came, so its JSON does not change by a byte; its arrays are read from it once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

from jetpipe.tasks.json_numbers import COMPACT, rounded_json_many

ROUNDED = ("boxes", "scores")  # written rounded (to a tenth, to four places) from their float32 arrays
NO_TRACK = -1  # tracker_id of a box that is not (yet) part of a confirmed track

# per-object extras a task may give (an entry per box); any other key of a results dict is the frame's
PER_OBJECT = ("quads", "keypoints", "polygons", "mask_areas")
GROUND_KEYS = ("ground_m", "speed_kmh", "heading_deg")  # the ground step's (pipelines.core.ground), per object


class Detections:
    __slots__ = ("xyxy", "confidence", "class_id", "tracker_id", "labels", "data", "frame_data", "secondary",
                 "layout", "given", "ground", "view")

    def __init__(self, xyxy=None, confidence=None, class_id=None, *, labels: tuple[str, ...] | None = None,
                 data: dict | None = None, frame_data: dict | None = None, layout: tuple[str, ...] = (),
                 tracker_id=None):
        """xyxy (N, 4), confidence (N,), class_id (N,) or None; labels: the bundle's class names (the JSON's
        "labels" where given); data: per-object extras; frame_data: the frame's; layout: the JSON keys in the
        task's order ("boxes", "scores", "classes", "labels", then the extras' names)."""
        self.xyxy = np.asarray(np.empty((0, 4)) if xyxy is None else xyxy, np.float32).reshape(-1, 4)
        n = len(self.xyxy)
        self.confidence = np.asarray(np.zeros(n) if confidence is None else confidence, np.float32).reshape(n)
        self.class_id = None if class_id is None else np.asarray(class_id, np.int64).reshape(n)
        self.tracker_id = None if tracker_id is None else np.asarray(tracker_id, np.int64).reshape(n)
        self.labels = labels
        self.data = dict(data or {})
        self.frame_data = dict(frame_data or {})
        self.secondary: dict[str, list] = {}
        self.layout = tuple(layout)
        self.given = None  # the results dict it was made from (from_results), written as given
        self.ground: Ground | None = None  # the ground step's, on a calibrated stream's tracked frames
        self.view: np.ndarray | None = None  # a moving camera's: 2 x 3 affine, this frame's pixels -> its first's

    # -- made from a task's results dict --------------------------------------------------------------------------
    @classmethod
    def from_results(cls, results: Mapping) -> Detections:
        """A task's results dict (lists, as JSON has them) as arrays; to_results() gives the dict back as it was
        (a tracker's IDs and the secondaries' results added at its end)."""
        boxes = results.get("boxes")
        objects = boxes is not None  # else a frame's results: a classifier's "classes" and "scores" are no boxes'
        added = ("track_ids", "secondary", *GROUND_KEYS)  # the steps', not the task's
        given = {k: v for k, v in results.items() if k not in added}
        det = cls(boxes, results.get("scores") if objects else None, results.get("classes") if objects else None,
                  layout=tuple(given))
        det.given = given
        for key, value in results.items():
            if key in added or (objects and key in ("boxes", "scores", "classes")):
                continue
            if objects and (key in PER_OBJECT or key == "labels"):
                det.data[key] = value  # labels as given (names, or numbers as text), one per object
            else:
                det.frame_data[key] = value  # a classifier's classes, a segmenter's regions, a reader's text
        ids = results.get("track_ids")
        if ids is not None:
            det.tracker_id = track_array(ids).reshape(len(det))
        for name, entries in (results.get("secondary") or {}).items():
            det.secondary[name] = list(entries)
        if results.get("speed_kmh") is not None:
            det.ground = Ground.from_results(results, len(det))
        return det

    # -- the array view -------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.xyxy)

    @property
    def has_boxes(self) -> bool:
        """Whether the task gives boxes (a classifier's or a segmenter's frame has none, even empty)."""
        return "boxes" in self.layout

    @property
    def class_ids(self) -> np.ndarray:
        """(N,) int64: class_id, or zeros where the objects are of one kind (text lines)."""
        return self.class_id if self.class_id is not None else np.zeros(len(self), np.int64)

    @property
    def track_ids(self) -> np.ndarray:
        """(N,) int64: tracker_id, or NO_TRACK everywhere where no tracker ran."""
        return self.tracker_id if self.tracker_id is not None else np.full(len(self), NO_TRACK, np.int64)

    def track_list(self) -> list[int | None]:
        """Each box's track ID as the JSON writes it: None where it has no confirmed track (or no tracker ran)."""
        return [None if t == NO_TRACK else t for t in self.track_ids.tolist()]

    def labelled(self) -> list[str] | None:
        """Each object's label where the bundle names its classes (the JSON's "labels"); None where it does not."""
        given = self.data.get("labels")
        if given is not None:
            return [str(name) for name in given]
        if self.class_id is None or self.labels is None:
            return None
        return [self.labels[c] if 0 <= c < len(self.labels) else str(c) for c in self.class_id.tolist()]

    def names(self) -> list[str] | None:
        """What each object is called on screen: its label, else c<N>; None without classes."""
        labelled = self.labelled()
        if labelled is not None or self.class_id is None:
            return labelled
        return [f"c{c}" for c in self.class_id.tolist()]

    def top(self) -> tuple[list[int], list[float], list[str]]:
        """A classifier's frame: its top classes, their scores and names (labels, else c<N>), best first; empty
        lists for a frame of objects."""
        if self.has_boxes:
            return [], [], []
        classes, scores = list(self.frame_data.get("classes") or ()), list(self.frame_data.get("scores") or ())
        names = self.frame_data.get("labels") or [f"c{c}" for c in classes]
        return classes, scores, [str(n) for n in names]

    def __getitem__(self, index) -> Detections:
        """The objects `index` selects (a boolean mask or integer indices), every per-object value taken alike."""
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        taken = Detections(self.xyxy[index], self.confidence[index],
                           None if self.class_id is None else self.class_id[index], labels=self.labels,
                           data={k: _take(v, index) for k, v in self.data.items()}, frame_data=self.frame_data,
                           layout=self.layout, tracker_id=None if self.tracker_id is None else self.tracker_id[index])
        taken.secondary = {k: _take(v, index) for k, v in self.secondary.items()}
        taken.ground = None if self.ground is None else self.ground[index]
        taken.view = self.view
        return taken

    # -- JSON, once, in the sinks ---------------------------------------------------------------------------------
    def to_results(self) -> dict:
        """The JSON record's "results": the task's keys in its order, then "track_ids" where a tracker ran, the
        ground's "ground_m", "speed_kmh" and "heading_deg" where the stream is calibrated, and "secondary" where
        secondaries ran."""
        results = dict(self.given) if self.given is not None else self._made()
        results.update(self._added())
        return results

    def results_json(self) -> str:
        """to_results() as compact JSON text, the same bytes json.dumps gives it: the boxes and the per-object
        float arrays and the scores written in one step each (json_numbers: a busy frame's numbers were most of its
        JSON). A batch's frames: results_json_many."""
        return results_json_many([self])[0]

    def json_parts(self) -> tuple[list[list], list[tuple[int, str, np.ndarray]]]:
        """The results' [key, JSON text] in order, the text None where it is an array's (results_json_many writes
        a batch's together), and those arrays: (place, key, array; boxes and scores as they are, ROUNDED)."""
        parts, arrays = [], []
        for key, value in self._parts(rounded=False):
            if isinstance(value, np.ndarray):
                arrays.append((len(parts), key, value))
                parts.append([key, None])
            else:
                parts.append([key, json.dumps(value, separators=COMPACT)])
        parts += [[key, json.dumps(value, separators=COMPACT)] for key, value in self._added().items()]
        return parts, arrays

    def _added(self) -> dict:
        """What the steps add to the task's results: "track_ids", the ground's keys, "secondary"."""
        added: dict = {}
        if self.tracker_id is not None:
            added["track_ids"] = self.track_list()
        if self.ground is not None:
            added.update(self.ground.results())
        if self.secondary:
            added["secondary"] = {k: list(v) for k, v in self.secondary.items()}
        return added

    def _made(self) -> dict:
        return {key: value.tolist() if isinstance(value, np.ndarray) else value for key, value in self._parts()}

    def _parts(self, rounded: bool = True):
        """(key, value) of the task's results in its order: boxes as float64 rounded to a tenth, scores to four
        places (rounded False: as they are, ROUNDED), per-object extras' arrays as they are (to_results makes lists
        of them), the rest as JSON writes it."""
        for key in self.layout:
            if key == "boxes":
                yield key, np.round(self.xyxy.astype(np.float64), 1) if rounded else self.xyxy
            elif key == "scores":
                yield key, np.round(self.confidence.astype(np.float64), 4) if rounded else self.confidence
            elif key == "classes":
                yield key, self.class_ids.tolist()
            elif key == "labels":
                labelled = self.labelled()
                if labelled is not None:
                    yield key, labelled
            elif key in self.data:
                value = self.data[key]
                yield key, value if isinstance(value, np.ndarray) else list(value)
            elif key in self.frame_data:
                yield key, self.frame_data[key]

    def __repr__(self) -> str:
        extras = ", ".join([*self.data, *self.frame_data])
        return (f"Detections({len(self)} objects{', tracked' if self.tracker_id is not None else ''}"
                f"{', ' + extras if extras else ''})")


def results_json_many(found: list[Detections]) -> list[str]:
    """[d.results_json() for d in found]: each key's arrays of every frame written together (a batch's boxes in one
    pass of json_numbers.rounded_json_many, its scores in another, ...), the same text as frame by frame."""
    texts: list = [None] * len(found)
    parts: dict[int, list] = {}  # a frame's [key, its JSON text (None: its array's, made below)]
    arrays: dict[tuple[str, int], list] = {}  # (key, places): [(frame, part, array)]
    for k, detections in enumerate(found):
        if detections.given is not None:
            texts[k] = json.dumps(detections.to_results(), separators=COMPACT)
            continue
        parts[k], mine = detections.json_parts()
        for at, key, value in mine:
            arrays.setdefault((key, 4 if key == "scores" else 1), []).append((k, at, value))
    for (key, places), members in arrays.items():  # the boxes and scores rounded there, all at once
        for (k, at, _), text in zip(members, rounded_json_many([value for *_, value in members], places,
                                                               round_first=key in ROUNDED)):
            parts[k][at][1] = text
    for k, mine in parts.items():
        texts[k] = "{" + ",".join(f"{json.dumps(key)}:{text}" for key, text in mine) + "}"
    return texts


class Ground:
    """Each object's place on the ground of a calibrated stream (pipelines.core.ground): position (N, 2) in
    metres, speed in km/h, heading in degrees from the world's x axis towards its y axis; NaN where it has none
    (no confirmed track, above the horizon, not seen long enough for a speed)."""

    __slots__ = ("position", "speed_kmh", "heading_deg")

    def __init__(self, position: np.ndarray, speed_kmh: np.ndarray, heading_deg: np.ndarray):
        self.position, self.speed_kmh, self.heading_deg = position, speed_kmh, heading_deg

    @classmethod
    def at(cls, n: int, objects: np.ndarray, position, speed_kmh, heading_deg) -> Ground:
        """Of a frame's n objects, those at `objects` (indices) given; the others none."""
        ground = cls(np.full((n, 2), np.nan), np.full(n, np.nan), np.full(n, np.nan))
        ground.position[objects], ground.speed_kmh[objects], ground.heading_deg[objects] = \
            position, speed_kmh, heading_deg
        return ground

    @classmethod
    def from_results(cls, results: Mapping, n: int) -> Ground:
        """A record's ground lists back as arrays (null: NaN)."""
        def floats(values, width=0):
            values = list(values or [None] * n)
            blank = [None] * width if width else None
            return np.array([blank if v is None else v for v in values], np.float64).reshape((n, width) if width
                                                                                              else n)
        return cls(floats(results.get("ground_m"), 2), floats(results.get("speed_kmh")),
                   floats(results.get("heading_deg")))

    def __getitem__(self, index) -> Ground:
        return Ground(self.position[index], self.speed_kmh[index], self.heading_deg[index])

    def speed_list(self) -> list[float | None]:
        return [None if v != v else v for v in np.round(self.speed_kmh.astype(np.float64), 1).tolist()]

    def results(self) -> dict:
        """The record's per-object lists (null where none): metres to the centimetre, km/h to a tenth, degrees
        whole."""
        columns = np.column_stack([self.position, self.speed_kmh, self.heading_deg]).astype(np.float64)
        rows = (np.round(columns * ROUNDING) / ROUNDING).tolist()
        return {"ground_m": [None if x != x else [x, y] for x, y, _, _ in rows],
                "speed_kmh": [None if v != v else v for _, _, v, _ in rows],
                "heading_deg": [None if h != h else int(h) % 360 for _, _, _, h in rows]}


ROUNDING = np.array([100.0, 100.0, 10.0, 1.0])  # metres to the centimetre, km/h to a tenth, whole degrees


def track_array(ids) -> np.ndarray:
    """Track IDs as a tracker gives them (None: no confirmed track) -> tracker_id (NO_TRACK there)."""
    return np.array([NO_TRACK if i is None else i for i in ids], np.int64)


def finish_detections(post, outputs: dict, letterboxes, sizes, pool=None, reduced: bool = False) -> list[Detections]:
    """A task's finish of a batch as Detections a frame: made as arrays where the task makes them (its
    `detections`: no per-object lists on the way), else its results dicts wrapped. reduced: `outputs` are its
    GPU reduction's."""
    native = getattr(post, "detections", None)
    if native is not None:
        return native(outputs, letterboxes, sizes, pool=pool, reduced=reduced)
    finish = post.reduced if reduced else post
    return [as_detections(r) for r in finish(outputs, letterboxes, sizes, pool=pool)]


def as_detections(result) -> Detections:
    """A task's finish of one frame as Detections: as it came, or its results dict wrapped (from_results)."""
    return result if isinstance(result, Detections) else Detections.from_results(result)


def _take(value, index: np.ndarray):
    if isinstance(value, np.ndarray):
        return value[index]
    return [value[i] for i in index.tolist()]
