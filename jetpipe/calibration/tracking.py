"""Tracking quality with the field's own metrics: HOTA (with DetA and AssA), IDF1, MOTA and ID switches, computed
by TrackEval (the MOTChallenge / HOTA authors' code, from PyPI), not re-implemented here.

Two ways in: a built-in scene (tracking_scenes: ground truth and the detections a detector would give) run
through each tracker, or ground truth in MOTChallenge format (gt.txt) against a jetpipe JSONL of one stream
whose records carry track_ids. TrackEval's package metadata asks for opencv-python, which would replace the
headless OpenCV jetpipe uses; its metrics need only NumPy and SciPy, so it is installed without its
dependencies: `pip install --no-deps trackeval`.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jetpipe import output_folders
from jetpipe.calibration import reports
from jetpipe.calibration.tracking_scenes import make_scene
from jetpipe.errors import JetpipeError
from jetpipe.pipelines.core.tracking import make_tracker
from jetpipe.tasks.agreement_metrics import iou_matrix
from jetpipe.tasks.detections import NO_TRACK

TRACKEVAL_MISSING = ("tracking metrics need TrackEval: pip install --no-deps trackeval (its metadata pulls "
                     "opencv-python, which would replace jetpipe's headless OpenCV; the metrics need NumPy and SciPy)")
METRICS = ("HOTA", "DetA", "AssA", "IDF1", "MOTA", "IDSW")


@dataclass
class Sequence:
    """Per frame: the ground truth's IDs and boxes, and the tracker's (xyxy, pixels)."""

    gt_ids: list[np.ndarray]
    gt_boxes: list[np.ndarray]
    ids: list[np.ndarray]
    boxes: list[np.ndarray]


def import_trackeval():
    """TrackEval's metrics (HOTA, CLEAR, Identity); JetpipeError with the install line where it is missing."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # it prints which of its datasets lack their packages
            from trackeval.metrics import CLEAR, HOTA, Identity
    except ImportError:
        raise JetpipeError(TRACKEVAL_MISSING) from None
    return HOTA, CLEAR, Identity


def score(sequence: Sequence) -> dict[str, float]:
    """HOTA, DetA, AssA (averaged over TrackEval's IoU thresholds), IDF1, MOTA (IoU 0.5) and ID switches, as
    TrackEval computes them; HOTA, DetA, AssA, IDF1 and MOTA in per cent."""
    hota, clear, identity = (cls({"PRINT_CONFIG": False}) for cls in import_trackeval())
    data = _trackeval_data(sequence)
    with contextlib.redirect_stdout(io.StringIO()):
        h, c, i = hota.eval_sequence(data), clear.eval_sequence(data), identity.eval_sequence(data)
    return {"HOTA": 100 * float(np.mean(h["HOTA"])), "DetA": 100 * float(np.mean(h["DetA"])),
            "AssA": 100 * float(np.mean(h["AssA"])), "IDF1": 100 * float(i["IDF1"]), "MOTA": 100 * float(c["MOTA"]),
            "IDSW": int(c["IDSW"])}


def _trackeval_data(seq: Sequence) -> dict:
    """TrackEval's per-sequence input: IDs renumbered from 0, IoU of every ground-truth box with every
    tracker box in each frame."""
    gt_map = {v: k for k, v in enumerate(sorted({int(i) for ids in seq.gt_ids for i in ids}))}
    tr_map = {v: k for k, v in enumerate(sorted({int(i) for ids in seq.ids for i in ids}))}
    return {"num_timesteps": len(seq.gt_ids), "num_gt_ids": len(gt_map), "num_tracker_ids": len(tr_map),
            "num_gt_dets": sum(len(i) for i in seq.gt_ids), "num_tracker_dets": sum(len(i) for i in seq.ids),
            "gt_ids": [np.array([gt_map[int(i)] for i in ids], int) for ids in seq.gt_ids],
            "tracker_ids": [np.array([tr_map[int(i)] for i in ids], int) for ids in seq.ids],
            "similarity_scores": [iou_matrix(g, b) for g, b in zip(seq.gt_boxes, seq.boxes)]}


# -- built-in scenes ------------------------------------------------------------------------------------------------
def track_scene(scene, kind: str, camera: bool = False, looks=None) -> tuple[Sequence, float]:
    """The scene's detections through a tracker of `kind`: what it tracked, and its CPU seconds. camera: botsort
    is told the camera's true motion between frames (the ceiling of what motion compensation buys); looks:
    botsort given the objects' looks (tracking_scenes.SimulatedLooks)."""
    tracker = make_tracker(kind)
    ids, boxes = [], []
    started = time.thread_time()
    last = None
    for frame in scene.frames:
        if camera or looks is not None:
            motion = None
            if camera:
                moved = np.zeros(2) if last is None else frame.camera - last
                motion = np.array([[1.0, 0.0, -moved[0]], [0.0, 1.0, -moved[1]]])  # the picture moves against the view
                last = frame.camera
            tracked = tracker.table.update([(0, frame.boxes, frame.scores, frame.t, motion)],
                                           None if looks is None else looks.embed_for(frame))[0]
        else:
            tracked = tracker.update(frame.boxes, frame.scores, frame.t)
        keep = tracked != NO_TRACK
        ids.append(tracked[keep])
        boxes.append(frame.boxes[keep])
    cpu = time.thread_time() - started
    return Sequence([f.gt_ids for f in scene.frames], [f.gt_boxes for f in scene.frames], ids, boxes), cpu


def compare(scenes: list, trackers: list[str]) -> list[dict]:
    """A row per scene and tracker: the metrics, and the tracker's CPU per detection in microseconds."""
    rows = []
    for scene in scenes:
        detections = sum(len(f.boxes) for f in scene.frames)
        for kind in trackers:
            sequence, cpu = track_scene(scene, kind)
            rows.append({"scene": scene.name, "tracker": kind, "objects": scene.objects,
                         **{k: round(v, 2) for k, v in score(sequence).items()},
                         "us_per_detection": round(1e6 * cpu / max(1, detections), 2)})
    return rows


# -- MOTChallenge ground truth against a jetpipe JSONL --------------------------------------------------------------
def read_mot(path: Path) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """gt.txt (frame, id, left, top, width, height[, conf, class, visibility], frames from 1): frame -> IDs and
    xyxy boxes. Rows of conf 0 (MOTChallenge's "ignore") are left out. A bad row: JetpipeError naming it."""
    frames: dict[int, list] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            values = [float(v) for v in line.replace(" ", "").split(",")]
            frame, track, left, top, width, height = values[:6]
        except ValueError:
            raise JetpipeError(f"{path}:{number}: a MOTChallenge row is frame,id,left,top,width,height[,conf,class,"
                               f"visibility] (numbers); found {line[:80]!r}") from None
        if not (frame >= 1 and frame == int(frame) and width > 0 and height > 0 and
                all(map(math.isfinite, (track, left, top)))):
            raise JetpipeError(f"{path}:{number}: frame numbers start at 1, width and height are positive; "
                               f"found {line[:80]!r}")
        if len(values) > 6 and values[6] == 0:
            continue
        frames.setdefault(int(frame), []).append((int(track), left, top, left + width, top + height))
    if not frames:
        raise JetpipeError(f"{path}: no ground-truth rows")
    return {f: (np.array([r[0] for r in rows]), np.array([r[1:] for r in rows], np.float64))
            for f, rows in frames.items()}


def read_jsonl_tracks(path: Path, stream: int = 0) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """A jetpipe results JSONL: frame number (from 1, as MOTChallenge's) -> track IDs and boxes of `stream`'s
    records; boxes without a track left out."""
    tracked: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise JetpipeError(f"{path}:{number}: not a JSON line") from None
        if not isinstance(record, dict) or record.get("stream") != stream or record.get("type") not in (None, "frame"):
            continue
        results = record.get("results") or {}
        ids, boxes = results.get("track_ids"), results.get("boxes")
        if ids is None or boxes is None:
            raise JetpipeError(f"{path}:{number}: a frame record without track_ids: serve with --tracker")
        keep = [k for k, i in enumerate(ids) if i is not None]
        tracked[int(record["frame"]) + 1] = (np.array([ids[k] for k in keep], np.int64),
                                            np.array([boxes[k] for k in keep], np.float64).reshape(-1, 4))
    if not tracked:
        raise JetpipeError(f"{path}: no frame records of stream {stream}")
    return tracked


def sequence_of(gt: dict, tracked: dict) -> Sequence:
    """Ground truth and tracks by frame number as one Sequence over every frame either has."""
    empty = (np.zeros(0, np.int64), np.zeros((0, 4)))
    frames = range(1, max(max(gt), max(tracked)) + 1)
    return Sequence([gt.get(f, empty)[0] for f in frames], [gt.get(f, empty)[1] for f in frames],
                    [tracked.get(f, empty)[0] for f in frames], [tracked.get(f, empty)[1] for f in frames])


# -- the report ----------------------------------------------------------------------------------------------------
@dataclass
class TrackingOptions:
    report: Path
    trackers: tuple[str, ...] = ("bytetrack", "botsort")
    scenes: tuple[str, ...] = ()
    fps: tuple[float, ...] = (30.0, 10.0)
    seeds: tuple[int, ...] = (1, 2, 3)
    gt: Path | None = None
    results: Path | None = None
    stream: int = 0
    force: bool = False


def run_tracking(opts: TrackingOptions) -> dict:
    """Measure, then write the report folder (report.json, report.md, a plot) whole or not at all."""
    protected = tuple(p for p in (opts.gt, opts.results) if p is not None)
    output_folders.check_destination(Path(opts.report), opts.force, "--report", "report", reports.owned_files,
                                     protected=protected)
    import_trackeval()  # before any work: the install line, not a traceback
    if opts.gt is not None:
        sequence = sequence_of(read_mot(opts.gt), read_jsonl_tracks(opts.results, opts.stream))
        rows = [{"scene": str(opts.results), "tracker": "as served", "seed": None,
                 **{k: round(v, 2) for k, v in score(sequence).items()}}]
    else:
        rows = []
        for seed in opts.seeds:
            scenes = [make_scene(name, fps, seed=seed) for name in opts.scenes for fps in opts.fps]
            rows += [{**row, "seed": seed} for row in compare(scenes, list(opts.trackers))]
    summary = summarize(rows)
    report = {"kind": "tracking", "trackers": list(opts.trackers), "seeds": list(opts.seeds), "rows": rows,
              "summary": summary, "metrics": "TrackEval: HOTA, DetA, AssA (mean over IoU 0.05-0.95), IDF1, "
                                             "MOTA (IoU 0.5), IDSW"}
    labels = [f"{s['scene']} {s['tracker']}" for s in summary]
    plots = {"hota.png": reports.bar_chart(labels, [s["HOTA"] for s in summary], "HOTA (mean over seeds)", "HOTA %"),
             "idf1.png": reports.bar_chart(labels, [s["IDF1"] for s in summary], "IDF1 (mean over seeds)", "IDF1 %")}
    reports.write(opts.report, report, tracking_markdown(report), plots)
    return report


def summarize(rows: list[dict]) -> list[dict]:
    """Per scene and tracker: each metric's mean over the seeds, and the worst seed's HOTA and IDF1 (a mean
    must not hide a seed that collapsed)."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["scene"], row["tracker"]), []).append(row)
    summary = []
    for (scene, tracker), members in groups.items():
        mean = {k: round(float(np.mean([m[k] for m in members])), 2) for k in METRICS}
        worst = {f"worst_{k}": min(m[k] for m in members) for k in ("HOTA", "IDF1")}
        cost = [m["us_per_detection"] for m in members if "us_per_detection" in m]
        summary.append({"scene": scene, "tracker": tracker, "seeds": len(members), **mean, **worst,
                        **({"us_per_detection": round(float(np.median(cost)), 1)} if cost else {})})
    return summary


def tracking_markdown(report: dict) -> str:
    lines = ["# Tracking quality", "", f"Metrics: {report['metrics']}, by TrackEval.", ""]
    if report["seeds"] and report["rows"] and report["rows"][0]["seed"] is not None:
        lines += [f"Built-in scenes (jetpipe.calibration.tracking_scenes), seeds {report['seeds']}: mean over the "
                  "seeds, and the worst seed's HOTA and IDF1. The trackers' constants were chosen on seed 0.", ""]
    lines += ["| scene | tracker | HOTA | DetA | AssA | IDF1 | MOTA | ID switches | worst HOTA | worst IDF1 | "
              "CPU us / detection |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in report["summary"]:
        lines.append(f"| {s['scene']} | {s['tracker']} | {s['HOTA']:.1f} | {s['DetA']:.1f} | {s['AssA']:.1f} | "
                     f"{s['IDF1']:.1f} | {s['MOTA']:.1f} | {s['IDSW']:g} | {s['worst_HOTA']:.1f} | "
                     f"{s['worst_IDF1']:.1f} | {s.get('us_per_detection', '-')} |")
    return "\n".join(lines) + "\n"
