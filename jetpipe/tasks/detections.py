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
    det[det.confidence > 0.5]       # the objects that pass, every per-object array and list taken alike
    det.to_results()                # the JSON record's "results", as jetpipe has always written it

A task that finishes into lists (a record dict, as before this type) is wrapped by `from_results`: its dict
is kept and written as it came, so its JSON does not change by a byte; its arrays are read from it once.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

NO_TRACK = -1  # tracker_id of a box that is not (yet) part of a confirmed track

# per-object extras a task may give (an entry per box); any other key of a results dict is the frame's
PER_OBJECT = ("quads", "keypoints", "polygons", "mask_areas")


class Detections:
    __slots__ = ("xyxy", "confidence", "class_id", "tracker_id", "labels", "data", "frame_data", "secondary",
                 "layout", "given")

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

    # -- made from a task's results dict --------------------------------------------------------------------------
    @classmethod
    def from_results(cls, results: Mapping) -> Detections:
        """A task's results dict (lists, as JSON has them) as arrays; to_results() gives the dict back as it was
        (a tracker's IDs and the secondaries' results added at its end)."""
        boxes = results.get("boxes")
        objects = boxes is not None  # else a frame's results: a classifier's "classes" and "scores" are no boxes'
        given = {k: v for k, v in results.items() if k not in ("track_ids", "secondary")}
        det = cls(boxes, results.get("scores") if objects else None, results.get("classes") if objects else None,
                  layout=tuple(given))
        det.given = given
        for key, value in results.items():
            if key in ("track_ids", "secondary") or (objects and key in ("boxes", "scores", "classes")):
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
        return taken

    # -- JSON, once, in the sinks ---------------------------------------------------------------------------------
    def to_results(self) -> dict:
        """The JSON record's "results": the task's keys in its order, then "track_ids" where a tracker ran and
        "secondary" where secondaries did."""
        results = dict(self.given) if self.given is not None else self._made()
        if self.tracker_id is not None:
            results["track_ids"] = self.track_list()
        if self.secondary:
            results["secondary"] = {k: list(v) for k, v in self.secondary.items()}
        return results

    def _made(self) -> dict:
        results: dict = {}
        for key in self.layout:
            if key == "boxes":
                results[key] = np.round(self.xyxy.astype(np.float64), 1).tolist()
            elif key == "scores":
                results[key] = np.round(self.confidence.astype(np.float64), 4).tolist()
            elif key == "classes":
                results[key] = self.class_ids.tolist()
            elif key == "labels":
                labelled = self.labelled()
                if labelled is not None:
                    results[key] = labelled
            elif key in self.data:
                value = self.data[key]
                results[key] = value.tolist() if isinstance(value, np.ndarray) else list(value)
            elif key in self.frame_data:
                results[key] = self.frame_data[key]
        return results

    def __repr__(self) -> str:
        extras = ", ".join([*self.data, *self.frame_data])
        return (f"Detections({len(self)} objects{', tracked' if self.tracker_id is not None else ''}"
                f"{', ' + extras if extras else ''})")


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
