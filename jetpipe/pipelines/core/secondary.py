"""Secondary models on the primary's boxes: read the text in each detected line, classify each detected object.

For each box of a batch's results (filtered by class, size and count per frame) a crop is cut from the
frame as the primary read it (along the box's quadrilateral where the primary gives one, "quads": a tilted
text line is warped upright), batched across frames and streams up to the secondary's max batch, run, and
finished by the secondary's task. On the GPU runtime the crop is cut from the frame where it already is in
device memory (NVDEC's slot, or the batch's staging copy, held until the batch is released): the fused
kernel reads the crop's rectangle straight into the secondary's input, so neither frame nor crop crosses
the bus again; only the secondary's compact results come back. On the CPU runtime the same crops are cut
from the host frame (only the part around each box is colour-converted).

Records gain `results["secondary"][NAME]`: one entry per box, the secondary's result, or None where it did
not run on that box (class filtered, too small, over max_per_frame).

`direction`: a direction classifier (PP-OCR's `ppocr-cls`: classes "0" and "180") runs on the same crops
first; a crop it finds upside down (class "180" at a score of at least direction_threshold, PaddleOCR's
cls_thresh) is cut again turned half a turn (its quadrilateral's corners named from the other end: the
kernel does the turn) and its entry says "angle": 180.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from jetpipe import bundle as bundles
from jetpipe.errors import JetpipeError, some
from jetpipe.geometry import box_region, quad_region, quad_size
from jetpipe.limits import MAX_SIDE
from jetpipe.runtime.api import Frame, check_priority
from jetpipe.runtime.open import open_runtime
from jetpipe.runtime.triton_backend import is_triton
from jetpipe.tasks import Task, for_bundle
from jetpipe.tasks.detections import Detections, as_detections

log = logging.getLogger(__name__)

MAX_PER_FRAME = 1024  # bound of max_per_frame: crops of one frame
MAX_EVERY_TRACK = 10_000  # bound of every_track: frames a track's result is reused for


@dataclass
class SecondaryConfig:
    bundle: Path
    name: str = ""                          # default: the bundle folder's name
    classes: tuple = ()                     # primary classes it runs on (names or numbers); () = all boxes
    min_size: int = 8                       # shorter box side, in source pixels, below which it does not run
    max_per_frame: int = 32                 # boxes per frame it runs on (highest scores first)
    direction: Path | None = None           # a direction classifier bundle (classes "0" and "180") run first
    direction_threshold: float = 0.9        # its score at which a crop is turned
    every_track: int = 0                    # with a tracker: run once per track every N frames, reuse between
    backend: str = ""                       # "" = the pipeline's; triton://HOST:PORT/NAME: its model on a server
    priority: str = "high"                  # its runs at the GPU's highest stream priority (Triton's PRIORITY_MAX),
                                            # ahead of the primary's next batch; "normal": the default stream's

    @property
    def label(self) -> str:
        return self.name or Path(self.bundle).name


def check(config: SecondaryConfig, primary: Task, primary_labels, where: str) -> None:
    """Start-up checks that need no runtime: the primary has boxes, the classes exist, bounds."""
    what = f"{where}: secondary {config.label!r}"
    if not primary.boxes:
        raise JetpipeError(f"{what}: the primary's task {primary.name} has no boxes to run it on")
    if not 1 <= config.max_per_frame <= MAX_PER_FRAME:
        raise JetpipeError(f"{what}: max_per_frame = {config.max_per_frame}: from 1 to {MAX_PER_FRAME}")
    if not 1 <= config.min_size <= MAX_SIDE:
        raise JetpipeError(f"{what}: min_size = {config.min_size}: pixels from 1 to {MAX_SIDE}")
    if not 0 <= config.every_track <= MAX_EVERY_TRACK:
        raise JetpipeError(f"{what}: every_track = {config.every_track}: frames from 0 (off) to {MAX_EVERY_TRACK}")
    if not 0.0 <= config.direction_threshold <= 1.0:
        raise JetpipeError(f"{what}: direction_threshold = {config.direction_threshold}: from 0 to 1")
    try:
        check_priority(config.priority)
    except JetpipeError as exc:
        raise JetpipeError(f"{what}: {exc}") from None
    if config.classes and not primary.class_ids:
        raise JetpipeError(f"{what}: classes = {list(config.classes)}: the primary's task {primary.name} has no "
                           "classes; leave classes out")
    for cls in config.classes:
        if isinstance(cls, str) and (primary_labels is None or cls not in primary_labels):
            known = some(primary_labels, 10) \
                if primary_labels else "none (the primary bundle has no class names: use class numbers)"
            raise JetpipeError(f"{what}: class {cls!r} is not one of the primary's classes: {known}")


class TrackResults:
    """every_track: a secondary's result per (stream slot, track id), reused until `every` more of that stream's
    frames have passed. forget(slot) may come from any thread (a new stream taking the slot, whose tracker numbers
    its tracks from 1 again: the old camera's text must not be reused for it); it takes effect in the secondary's
    own thread, before its next frame of any stream."""

    def __init__(self, every: int):
        self.every = every
        self._results: dict[tuple[int, int], tuple[dict, int]] = {}  # -> (result, the stream's frame when read)
        self._seen: dict[int, int] = {}
        self._forgotten: deque[int] = deque()

    def forget(self, stream: int) -> None:
        self._forgotten.append(stream)

    def next_frame(self, stream: int) -> None:
        """Count a frame of `stream`; its results read `every` frames ago or more go (read again, or ended)."""
        while self._forgotten:
            gone = self._forgotten.popleft()
            self._seen.pop(gone, None)
            self._drop(lambda key, at, gone=gone: key[0] == gone)
        seen = self._seen[stream] = self._seen.get(stream, 0) + 1
        self._drop(lambda key, at: key[0] == stream and seen - at >= self.every)

    def get(self, stream: int, track: int) -> dict | None:
        kept = self._results.get((stream, track))
        return kept[0] if kept is not None else None

    def keep(self, stream: int, track: int, result: dict) -> None:
        self._results[(stream, track)] = (result, self._seen.get(stream, 0))

    def _drop(self, which) -> None:
        for key in [key for key, (_, at) in self._results.items() if which(key, at)]:
            del self._results[key]


class SecondaryStage:
    """One secondary model: its runtime (allocated here, released by close()) and its task's finish."""

    def __init__(self, config: SecondaryConfig, backend: str, memory: str, max_frame_hw, postprocess: str,
                 cpu_threads: int = 0):
        self.config, self.name = config, config.label
        manifest = bundles.load(config.bundle)
        task, options = for_bundle(manifest)
        self.post = task.postprocessor(options)
        reduction = None if postprocess == "cpu" else self.post.reduction(required=postprocess == "gpu")
        self.runtime = open_runtime(config.bundle, None, backend, memory, max_frame_hw=max_frame_hw,
                                    buffer_sets=2, reduction=reduction, priority=config.priority,
                                    cpu_threads=cpu_threads)
        self.classes = set(config.classes)
        self.crops_run = self.crops_turned = self.crops_reused = 0
        self.tracks = TrackResults(config.every_track)
        self.direction = None
        try:
            if config.direction is not None:  # a local model: a Triton secondary's classifier runs here
                local = "auto" if is_triton(backend) else backend
                self.direction = _DirectionStage(config, local, memory, max_frame_hw, postprocess, cpu_threads)
        except BaseException:
            self.runtime.close()
            raise
        log.info("secondary %s: %s (%s) on the primary's boxes, batches of up to %d, postprocessing on the %s",
                 self.name, task.name, self.runtime.backend_name, self.runtime.max_batch,
                 "GPU" if self.runtime.reduction else "CPU")

    def chosen(self, found: Detections) -> list[int]:
        """Indices of the boxes it runs on: class, size, then the highest scores up to max_per_frame."""
        scores = found.confidence.tolist()
        classes = None if found.class_id is None else found.class_id.tolist()
        labels, quads = found.labelled(), found.data.get("quads")
        picked = []
        for i, (x0, y0, x1, y1) in enumerate(found.xyxy.tolist()):
            if self.classes and not ({classes[i] if classes else None, labels[i] if labels else None} & self.classes):
                continue
            if min(quad_size(_listed(quads[i])) if quads is not None else (x1 - x0, y1 - y0)) < self.config.min_size:
                continue
            picked.append(i)
        picked.sort(key=lambda i: -(scores[i] if i < len(scores) else 0.0))
        return sorted(picked[:self.config.max_per_frame])

    def run(self, results: list[Detections], frames: list[Frame], streams: list[int] | None = None) -> None:
        """Add secondary[name] to each of a batch's results (an entry a box); `frames`: what the primary read;
        `streams`: each result's stream (every_track keys its tracks by stream)."""
        jobs, fresh = [], []
        for k, (found, frame) in enumerate(zip(results, frames)):
            entries = [None] * len(found)
            found.secondary[self.name] = entries
            height, width = frame.size()
            quads = found.data.get("quads")
            chosen = self.chosen(found)
            if self.config.every_track and found.tracker_id is not None:
                chosen = self._reuse(entries, chosen, found.track_list(), streams[k] if streams else 0, fresh)
            for i in chosen:
                quad = tuple(map(tuple, _listed(quads[i]))) if quads is not None else None
                crop = quad_region(quad, height, width) if quad else box_region(found.xyxy[i].tolist(), height, width)
                if crop is not None:
                    jobs.append((entries, i, replace(frame, crop=crop, quad=quad)))
        turned = self._turn_upside_down(jobs) if self.direction is not None else []
        self._run_groups(self._by_width(jobs))
        for entries, i in turned:
            if entries[i] is not None:
                entries[i]["angle"] = 180
        for (stream, track), entries, i in fresh:  # read now: kept for the track's next frames
            if entries[i] is not None:
                self.tracks.keep(stream, track, entries[i])

    def forget(self, stream: int) -> None:
        """A new stream takes this slot (its tracker numbers tracks from 1 again): the slot's kept results go."""
        self.tracks.forget(stream)

    def _reuse(self, entries: list, chosen: list[int], track_ids: list, stream: int, fresh: list) -> list[int]:
        """every_track: boxes of a track read less than every_track frames ago take that result (a copy
        marked "reused"); the others are returned to be read, those with a track noted in `fresh`."""
        self.tracks.next_frame(stream)
        to_read = []
        for i in chosen:
            track = track_ids[i] if i < len(track_ids) else None
            kept = self.tracks.get(stream, track) if track is not None else None
            if kept is not None:
                entries[i] = {**kept, "reused": True}
                self.crops_reused += 1
                continue
            to_read.append(i)
            if track is not None:
                fresh.append(((stream, track), entries, i))
        return to_read

    def _by_width(self, jobs) -> list[tuple[int, list]]:
        """Crops grouped by the narrowest of the runtime's widths that holds each at full height: a short
        word padded out to a long line's width reads worse (measured: 56 of 88 words with one width per
        frame's crops, 67 batched by width)."""
        widths = self.runtime.widths
        if len(widths) == 1:
            return [(widths[0], jobs)] if jobs else []
        groups: dict[int, list] = {}
        for job in jobs:
            wanted = self._width_wanted(job[2])
            groups.setdefault(next((w for w in widths if w >= wanted), widths[-1]), []).append(job)
        return sorted(groups.items())

    def _run_groups(self, groups: list[tuple[int, list]]) -> None:
        read = _read_groups(self.runtime, self.post, [(width, [frame for _, _, frame in jobs])
                                                      for width, jobs in groups])
        for (_, jobs), rows in zip(groups, read):
            for index, row in rows:
                entries, i, _ = jobs[index]
                entries[i] = row
                self.crops_run += 1

    def _turn_upside_down(self, jobs) -> list:
        """Run the direction classifier on the jobs' crops; turn those it finds upside down (in place).
        Returns the (entries, index) of the turned."""
        turned = []
        for k in self.direction.upside_down([frame for _, _, frame in jobs]):
            entries, i, frame = jobs[k]
            jobs[k] = (entries, i, replace(frame, quad=_half_turn(frame)))
            turned.append((entries, i))
        self.crops_turned += len(turned)
        return turned

    def _width_wanted(self, frame: Frame) -> int:
        """The input width a crop fills at the input's height, its aspect kept."""
        height, width = _crop_hw(frame)
        return math.ceil(self.runtime.size_hw[0] * width / height)

    def summary(self) -> dict:
        """Crops run, where, and what crossed the bus for them: frame bytes uploaded (0 where crops were cut
        in device memory) and the results' bytes downloaded; on a GPU runtime, the stream priority its runs
        got."""
        return {"crops": self.crops_run, "backend": self.runtime.backend_name,
                "postprocess": "gpu" if self.runtime.reduction else "cpu",
                **self._priority_got(),
                **({"crops_turned": self.crops_turned} if self.direction is not None else {}),
                **({"crops_reused": self.crops_reused} if self.config.every_track else {}),
                "frame_bytes_uploaded": self.runtime.frame_bytes_uploaded,
                "d2h_bytes_per_crop": round(self.runtime.output_bytes_downloaded / max(1, self.crops_run))}

    def _priority_got(self) -> dict:
        """What its runs got: "normal" where "high" was asked of a backend that cannot give it (ONNX Runtime
        without graphs); nothing on a CPU runtime or a server's model, which have no stream of ours."""
        got = self.runtime.priority_got()
        return {} if got is None else {"priority": got}

    def close(self) -> None:
        if self.direction is not None:
            self.direction.close()
        self.runtime.close()


class _DirectionStage:
    """A direction classifier on a secondary's crops (PP-OCR's text-line classifier): which are upside down."""

    def __init__(self, config: SecondaryConfig, backend: str, memory: str, max_frame_hw, postprocess: str,
                 cpu_threads: int = 0):
        manifest = bundles.load(config.direction)
        task, options = for_bundle(manifest)
        labels = options.labels or ()
        if task.name != "classification" or "180" not in labels:
            classes = some(labels) if labels else "unnamed"
            raise JetpipeError(f"secondary {config.label!r}: direction {config.direction} is a {task.name} bundle "
                               f"with classes {classes}: it needs a classifier whose classes are named 0 and 180 "
                               "(convert ppocr-cls)")
        self.upside, self.threshold = labels.index("180"), config.direction_threshold
        self.post = task.postprocessor(options)
        reduction = None if postprocess == "cpu" else self.post.reduction(required=postprocess == "gpu")
        self.runtime = open_runtime(config.direction, None, backend, memory, max_frame_hw=max_frame_hw,
                                    buffer_sets=2, reduction=reduction, priority=config.priority,
                                    cpu_threads=cpu_threads)

    def upside_down(self, frames: list[Frame]) -> list[int]:
        """Indices of the frames (crops) whose best class is "180" at a score of at least the threshold."""
        upside = []
        for index, row in _read(self.runtime, self.post, frames):
            classes, scores, _ = as_detections(row).top()
            if classes[0] == self.upside and scores[0] >= self.threshold:
                upside.append(index)
        return upside

    def close(self) -> None:
        self.runtime.close()


def _listed(value):
    """A per-object value as lists (a task's array, or the list it wrote)."""
    return value.tolist() if isinstance(value, np.ndarray) else value


def _read(runtime, post, crops: list[Frame], width: int | None = None) -> list[tuple[int, dict]]:
    """(index in `crops`, result) of every crop the runtime took, run at `width` and finished by the task
    `post` (on the device's reduction where it ran one)."""
    return _read_groups(runtime, post, [(width, crops)])[0]


def _read_groups(runtime, post, groups: list[tuple[int | None, list[Frame]]]) -> list[list[tuple[int, dict]]]:
    """_read for several (width, crops) groups, in batches of the runtime's max batch, with as many batches
    in flight as it has buffer sets: the next batch's crops are cut and run while the last one is finished."""
    read: list[list[tuple[int, dict]]] = [[] for _ in groups]
    step, pending = runtime.max_batch, []
    chunks = [(g, start, width, crops[start:start + step]) for g, (width, crops) in enumerate(groups)
              for start in range(0, len(crops), step)]
    try:
        for g, start, width, chunk in chunks:
            if len(pending) == runtime.buffer_sets:
                _finish_chunk(runtime, post, pending.pop(0), read)
            pending.append((g, start, chunk, runtime.submit(chunk, width)))
        while pending:
            _finish_chunk(runtime, post, pending.pop(0), read)
    finally:
        for *_, ticket in pending:  # a failed batch: the others in flight are collected and dropped
            runtime.collect(ticket)
    return read


def _finish_chunk(runtime, post, submitted, read) -> None:
    g, start, chunk, ticket = submitted
    found = runtime.collect(ticket)  # its set is reused only by a later submit, after this finish
    finish = post.reduced if found.reduction else post
    rows = finish(found.outputs, found.letterboxes, [_crop_hw(chunk[index]) for index in found.frame_indices])
    read[g] += [(start + index, row) for index, row in zip(found.frame_indices, rows)]


def _half_turn(frame: Frame) -> tuple:
    """The crop's quadrilateral named from its other end: cut by it, the crop comes out turned 180 degrees."""
    if frame.quad is not None:
        tl, tr, br, bl = frame.quad
    else:
        x0, y0, x1, y1 = frame.crop
        tl, tr, br, bl = (x0, y0), (x1, y0), (x1, y1), (x0, y1)
    return (br, bl, tl, tr)


def _crop_hw(frame: Frame) -> tuple[int, int]:
    """The size of what the secondary read: the upright quadrilateral's, or the rectangle's."""
    if frame.quad is not None:
        return quad_size(frame.quad)
    x0, y0, x1, y1 = frame.crop
    return y1 - y0, x1 - x0


def frames_read(result, packets_frames: list[Frame]) -> list[Frame]:
    """The frames a secondary cuts its crops from: where the primary's kernel read them on the GPU (held
    device memory, no copy), else the host frames themselves."""
    if result.frame_addresses is None:
        return packets_frames
    return [replace(f, data=None, address=a, device=True, hw=f.size(), pinned=False)
            for f, a in zip(packets_frames, result.frame_addresses)]
