"""What a task is: the contract every task module fills. No CUDA here: the GPU reductions a task asks for
(`Reduction`) are implemented in jetpipe/runtime, which finishes them into the task's compact arrays.

A task answers, for a model:
- `mismatch(facts)`: why the model's outputs do not fit it (None: they do), in words a user can act on;
- `recognizes(facts)`: whether convert may pick it without being told (stricter than fitting);
- `postprocessor(options)`: outputs -> per-frame result records (the CPU path and, where it has one, the
  GPU reduction's finish, the same code from the compact arrays);
- `metric(reference, candidate, options)`: its own agreement metrics of a model against FP32;
- `labels(facts)`: class names or an alphabet from the model's own metadata.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.geometry import Letterbox
from jetpipe.tasks.agreement_metrics import box_agreement, detection_map
from jetpipe.tasks.detections import Detections


class TaskError(JetpipeError):
    """A task that does not fit a model's outputs, or an unknown task."""


Shape = tuple  # ints, or names / "?" for dimensions not fixed in the graph


@dataclass(frozen=True)
class ModelFacts:
    """What a task is recognised from: the output shapes (batch first), the network's input size and the
    model's own metadata (ONNX metadata_props: Ultralytics' task/names/imgsz, PP-OCR's character)."""

    outputs: tuple[tuple[str, Shape], ...]
    input_hw: tuple[int, int]
    metadata: dict
    labels: tuple[str, ...] | None = None  # given by the user (--labels FILE) or stored in the bundle

    @classmethod
    def from_io(cls, io: dict, input_hw, metadata: dict | None = None, labels=None) -> ModelFacts:
        """From a manifest's "io" (as convert writes it)."""
        return cls(tuple((o["name"], tuple(o["shape"])) for o in io["outputs"]), tuple(input_hw),
                   dict(metadata or {}), tuple(labels) if labels else None)

    def shapes(self) -> str:
        return ", ".join(f"{name} {list(shape)}" for name, shape in self.outputs)


@dataclass(frozen=True)
class TaskOptions:
    """What a task's postprocessing and metric need from the bundle."""

    input_hw: tuple[int, int] = (640, 640)
    labels: tuple[str, ...] | None = None  # class names by index, or a recognizer's alphabet (blank first)
    metadata: dict = field(default_factory=dict)  # the export's own (MODEL_METADATA keys): kpt_shape, task
    outputs: tuple = ()                    # (name, shape) of each output, as ModelFacts has them

    @classmethod
    def of(cls, facts: ModelFacts, labels) -> TaskOptions:
        return cls(tuple(facts.input_hw), labels, dict(facts.metadata), facts.outputs)


# the export's metadata a bundle keeps (its manifest's "metadata"): what tasks are recognized and laid out by
MODEL_METADATA = ("task", "kpt_shape", "imgsz", "stride")


def kept_metadata(metadata: dict) -> dict:
    return {k: str(metadata[k]) for k in MODEL_METADATA if k in metadata}


def probabilities(minimum, total) -> bool:
    """Whether scores already are probabilities (a softmax ends the model) rather than logits, from each row's
    smallest value and sum."""
    return bool(np.min(minimum) >= 0 and np.allclose(total, 1.0, atol=1e-3))


def known(dim) -> bool:
    return isinstance(dim, int) and dim > 0


class Task:
    """Base: a task that fits nothing and is never picked on its own."""

    name = ""
    boxes = False            # its results carry boxes and scores (trackers, secondary stages)
    class_ids = False        # its results carry class numbers (and labels where the bundle has names)
    metrics: dict[str, str] = {}  # metric it reports -> how a budget bounds it (">=" or "<=")
    check_bounds: dict[str, float] = {}  # convert's check against FP32 warns where a metric misses its bound
    summary = ""             # one line for --help and the task table in docs/convert.md

    def mismatch(self, facts: ModelFacts) -> str | None:
        raise NotImplementedError

    def recognizes(self, facts: ModelFacts) -> bool:
        return self.mismatch(facts) is None

    def labels(self, facts: ModelFacts) -> tuple[str, ...] | None:
        """Class names (or an alphabet): the user's (--labels) or the bundle's, else the model's own metadata."""
        return facts.labels

    def postprocessor(self, options: TaskOptions):
        raise NotImplementedError

    def class_count(self, options: TaskOptions) -> int | None:
        """How many classes its boxes may carry (rules' class numbers are held to it); None: not known."""
        if not self.boxes:
            return None
        if not self.class_ids:
            return 1  # boxes of one kind (text lines, people): class 0
        return len(options.labels) if options.labels else None

    def metric(self, reference: list, candidate: list, options: TaskOptions) -> dict:
        raise NotImplementedError


class DetectorTask(Task):
    """What the box detectors share: boxes with classes (names from --labels or the model), and the box metrics
    against FP32 of their own postprocessing in network pixels."""

    boxes = True
    class_ids = True
    metrics = {"box_f1": ">=", "box_f1_min": ">=", "score_mae": "<=", "map": ">="}
    check_bounds = {"box_f1": 0.9, "score_mae": 0.05}  # scores collapse before boxes move

    def labels(self, facts: ModelFacts) -> tuple[str, ...] | None:
        return facts.labels or class_names(facts.metadata)

    @staticmethod
    def detector_output(facts: ModelFacts, what: str) -> tuple | str:
        """The one [N, ., .] output's shape where the model may be a detector, else why not."""
        return ultralytics_misfit(facts, "detect", "a detector") or single_output(facts, 3, what)

    def metric(self, reference: list, candidate: list, options: TaskOptions) -> dict:
        """Box metrics of the task's own postprocessing in network pixels, and what object_metrics adds."""
        post = self.postprocessor(options)
        boxes, sizes = identity_frames(len(reference[0]), options.input_hw)
        names = [f"o{i}" for i in range(len(reference))]
        ref = post(dict(zip(names, reference)), boxes, sizes)
        cand = post(dict(zip(names, candidate)), boxes, sizes)
        agreement = box_agreement(ref, cand)
        return {**{k: agreement[k] for k in ("box_f1", "box_f1_min", "score_mae")}, "map": detection_map(ref, cand),
                **self.object_metrics(ref, cand, options)}

    def object_metrics(self, reference: list[dict], candidate: list[dict], options: TaskOptions) -> dict:
        """What a head adds per matched object (keypoints, masks) to the box metrics."""
        return {}


def ultralytics_misfit(facts: ModelFacts, task: str, what: str) -> str | None:
    """Why an export whose metadata names another Ultralytics task is not `what` (None: it names none or this)."""
    said = facts.metadata.get("task")
    return None if said in (None, task) else f"the model says it is an Ultralytics {said!r} model, not {what}"


def single_output(facts: ModelFacts, rank: int, what: str) -> tuple | str:
    """The one output's shape when there is one of `rank` dimensions, else why not."""
    if len(facts.outputs) != 1:
        return f"expects one output ({what}), the model has {len(facts.outputs)}: {facts.shapes()}"
    shape = facts.outputs[0][1]
    if len(shape) != rank:
        return f"expects one output {what}, found {facts.shapes()}"
    return shape


def class_names(metadata: dict) -> tuple[str, ...] | None:
    """Ultralytics' `names` ("{0: 'person', 1: 'bicycle'}") as a tuple by class index."""
    text = metadata.get("names")
    if not text:
        return None
    try:
        names = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    if isinstance(names, dict) and all(isinstance(k, int) for k in names) and sorted(names) == list(range(len(names))):
        return tuple(str(names[i]) for i in range(len(names)))
    if isinstance(names, (list, tuple)):
        return tuple(str(n) for n in names)
    return None


def labels_misfit(facts: ModelFacts, classes) -> str | None:
    """Why the given labels do not fit `classes` (None: they do, or none were given, or the count is unknown)."""
    if facts.labels is None or not known(classes) or len(facts.labels) == classes:
        return None
    return f"{len(facts.labels)} labels given for {classes} classes: one label a line, one per class"


def with_labels(result: dict, labels: tuple[str, ...] | None) -> dict:
    """A record's "labels" beside its "classes" (names where the bundle has them)."""
    if labels is not None and "classes" in result:
        result["labels"] = [labels[c] if 0 <= c < len(labels) else str(c) for c in result["classes"]]
    return result


def boxes_to_source(xyxy, letterbox, height: int, width: int):
    """Network-input boxes -> source pixels through the letterbox, clipped to the frame."""
    pts = letterbox.to_source(xyxy.reshape(-1, 2, 2)).reshape(-1, 4)
    pts[:, 0::2] = pts[:, 0::2].clip(0, width)
    pts[:, 1::2] = pts[:, 1::2].clip(0, height)
    return pts


def split_by_counts(listed: list, counts) -> list[list]:
    """A list of rows joined one part after another -> a list per part, of counts[i] rows each."""
    parts, start = [], 0
    for count in counts:
        parts.append(listed[start:start + count])
        start += count
    return parts


class JoinedRows:
    """A batch's per-frame rows (kept boxes, their keypoints) joined frame after frame into one array, so that
    the mapping to source pixels, the rounding and tolist run once a batch: frame by frame, those calls'
    overhead was most of the host's finishing time (pose: 2.05 -> 1.24 ms a batch of 8 x 28 objects). Each
    value is computed as Letterbox.to_source and the clip to its own frame would compute it."""

    def __init__(self, counts):
        self.counts = [int(c) for c in counts]
        self.frame = np.repeat(np.arange(len(self.counts)), self.counts)  # each row's frame

    @classmethod
    def joined(cls, frames: list[tuple]) -> tuple[JoinedRows, list[np.ndarray]]:
        """Each frame's columns (arrays of a row per kept object: boxes, scores, ...) -> the rows, and each
        column joined frame after frame (its dtype kept)."""
        return cls([len(columns[0]) for columns in frames]), [np.concatenate(column) for column in zip(*frames)]

    @classmethod
    def kept(cls, counts, frames: int, limit: int) -> JoinedRows:
        """The first counts[i] rows (at most `limit`) of each of the first `frames` frames: a reduction's."""
        return cls(np.minimum(np.asarray(counts[:frames], np.int64), limit))

    def take(self, array: np.ndarray) -> np.ndarray:
        """[frames, limit, ...] -> the kept rows [T, ...]."""
        keep = np.arange(array.shape[1]) < np.asarray(self.counts)[:, None]
        return array[:len(self.counts)][keep]

    def to_source(self, xy: np.ndarray, letterboxes, sizes) -> np.ndarray:
        """Network-input (x, y) of the rows ([T, ..., 2]) -> source pixels (float64), clipped to each frame."""
        pad = np.array([(b.pad_x, b.pad_y) for b in letterboxes[:len(self.counts)]], np.float64).reshape(-1, 2)
        scale = np.array([(b.scale_x, b.scale_y) for b in letterboxes[:len(self.counts)]], np.float64).reshape(-1, 2)
        size = np.array([(w, h) for h, w in sizes[:len(self.counts)]], np.float64).reshape(-1, 2)
        shape = (len(self.frame),) + (1,) * (xy.ndim - 2) + (2,)
        src = (np.asarray(xy, np.float64) - pad[self.frame].reshape(shape)) / scale[self.frame].reshape(shape)
        return np.clip(src, 0, size[self.frame].reshape(shape))

    def split(self, listed: list) -> list[list]:
        """A list of the joined rows -> one list per frame."""
        return split_by_counts(listed, self.counts)

    def box_detections(self, xyxy, score, cls, letterboxes, sizes, labels=None,
                       extras: dict | None = None) -> list[Detections]:
        """Each frame's boxes (source pixels to 0.1, clipped), scores (to 1e-4) and classes as arrays, with the
        bundle's class names where it has them: the records box_records makes, without their lists. extras:
        per-object arrays of the joined rows (keypoints), written after the classes and before the labels."""
        boxes = np.round(self.to_source(np.asarray(xyxy).reshape(-1, 2, 2), letterboxes, sizes), 1).reshape(-1, 4)
        at = np.cumsum(self.counts)[:-1]
        extras = extras or {}
        layout = ("boxes", "scores", "classes", *extras, *(("labels",) if labels is not None else ()))
        split = {name: np.split(value, at) for name, value in extras.items()}
        return [Detections(b, s, c, labels=labels, layout=layout, data={n: v[k] for n, v in split.items()})
                for k, (b, s, c) in enumerate(zip(np.split(boxes, at), np.split(np.round(score, 4), at),
                                                  np.split(np.asarray(cls, np.int64), at)))]

    def box_records(self, xyxy, score, cls, letterboxes, sizes) -> list[dict]:
        """Each frame's "boxes" (source pixels to 0.1, clipped), "scores" (to 1e-4) and "classes" as lists: the
        records of box_detections."""
        return [found.to_results() for found in self.box_detections(xyxy, score, cls, letterboxes, sizes)]


def identity_frames(count: int, input_hw) -> tuple[list, list]:
    """Letterboxes and sizes that leave results in network-input pixels: what metrics compare in."""
    return [Letterbox(1.0, 1.0, 0, 0)] * count, [tuple(input_hw)] * count
