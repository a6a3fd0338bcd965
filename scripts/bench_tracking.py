#!/usr/bin/env python3
"""Trackers on scenes with ground truth (issue 65), two ways:

  scenes  the built-in scenes' detections (calibration/tracking_scenes.py) through each tracker, scored by
          TrackEval: what `jetpipe calibrate tracking` reports, with the tracker's CPU per detection.
  video   the same scenes rendered as H.264 video (a word on a card a walker, pillars, the camera's pan),
          served by `jetpipe serve` through a real text detector (a bundle: `jetpipe convert ppocr-det`) with
          each tracker, the JSONL's tracks scored against the rendered ground truth (gt.txt, MOTChallenge).

  cost    the trackers' CPU as the post stage spends it: 16 streams x N objects moving a frame, batches of one
          frame a stream; ByteTrack and botsort a tracker a stream, and botsort's table (every stream of a
          batch in one pass, what `jetpipe serve` runs). Microseconds of thread CPU per object-frame.

  python scripts/bench_tracking.py scenes [--scenes pillars,crossing] [--fps 30,10] [--seeds 1,2,3] [--json OUT]
  python scripts/bench_tracking.py video BUNDLE [--scenes pillars] [--fps 10] [--seconds 12] [--seeds 1] [--camera]
                                         [--json OUT]
  python scripts/bench_tracking.py cost [--streams 16] [--objects 20,60,100] [--batches 300] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from jetpipe.calibration.tracking import compare, read_jsonl_tracks, read_mot, score, sequence_of, summarize
from jetpipe.calibration.tracking_scenes import SCENES, make_scene, render_scene

TRACKERS = ("bytetrack", "botsort")


def scenes(args) -> list[dict]:
    rows = []
    for seed in args.seeds:
        rows += [{**r, "seed": seed} for r in compare([make_scene(n, f, seed=seed) for n in args.scenes
                                                        for f in args.fps], list(TRACKERS))]
    return rows


def video(args) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for name in args.scenes:
                for fps in args.fps:
                    clip = Path(tmp) / f"{name}-{fps:g}-{seed}.mp4"
                    gt = read_mot(render_scene(name, clip, fps, args.seconds, seed))
                    for kind in (*TRACKERS, *(["botsort+camera"] if args.camera else [])):
                        served = Path(tmp) / f"{clip.stem}-{kind}.jsonl"
                        command = [sys.executable, "-m", "jetpipe", "serve", "--bundle", str(args.bundle),
                                   "--source", str(clip), "--tracker", kind, "--sink", f"jsonl:{served}",
                                   "--metrics", ""]
                        if kind == "botsort+camera":  # the source as a moving camera: a config's [[source]]
                            config = Path(tmp) / "camera.toml"
                            config.write_text(f'[pipeline]\nbundle = "{args.bundle}"\ntracker = "botsort"\n'
                                              f'[[source]]\nuri = "{clip}"\nmoving_camera = true\n')
                            command = [sys.executable, "-m", "jetpipe", "serve", str(config), "--sink",
                                       f"jsonl:{served}", "--metrics", ""]
                        done = subprocess.run(command, capture_output=True, text=True)
                        if done.returncode != 0:
                            raise SystemExit(f"jetpipe serve failed:\n{done.stderr[-2000:]}")
                        metrics = score(sequence_of(gt, read_jsonl_tracks(served)))
                        rows.append({"scene": f"{name}@{fps:g}fps video", "tracker": kind, "seed": seed,
                                     **{k: round(v, 2) for k, v in metrics.items()}})
                        print(rows[-1], flush=True)
    return rows


def moving_boxes(streams: int, objects: int, batches: int, seed: int = 0) -> list[list[tuple]]:
    """Each batch's (slot, boxes, scores, t): objects crossing a 1080p frame at 30 fps, 5 % of them missed a
    frame, 1 px of jitter."""
    rng = np.random.default_rng(seed)
    start = rng.uniform([100, 100], [1800, 1000], (streams, objects, 2))
    velocity = rng.uniform(-4, 4, (streams, objects, 2))
    out = []
    for b in range(batches):
        batch = []
        for s in range(streams):
            centre = start[s] + velocity[s] * b
            boxes = np.column_stack([centre - 20, centre + 20]) + rng.normal(0, 1, (objects, 4))
            seen = rng.random(objects) > 0.05
            batch.append((s, boxes[seen], np.full(int(seen.sum()), 0.9), b / 30))
        out.append(batch)
    return out


def cost(args) -> list[dict]:
    from jetpipe.pipelines.core.tracking import BotSortTable, make_tracker

    rows = []
    for objects in args.objects:
        batches = moving_boxes(args.streams, objects, args.batches)
        found = sum(len(f[1]) for batch in batches for f in batch)
        for name in ("bytetrack", "botsort", "botsort table"):
            for _repeat in range(2):  # the second run is reported: SciPy and the caches warm
                if name == "botsort table":
                    table = BotSortTable(first_ids=[1] * args.streams)
                    started = time.thread_time()
                    for batch in batches:
                        table.update(batch)
                else:
                    trackers = [make_tracker(name) for _ in range(args.streams)]
                    started = time.thread_time()
                    for batch in batches:
                        for slot, boxes, scores, t in batch:
                            trackers[slot].update(boxes, scores, t)
                spent = time.thread_time() - started
            rows.append({"tracker": name, "streams": args.streams, "objects": objects,
                         "us_per_object_frame": round(spent / found * 1e6, 2),
                         "ms_per_batch": round(spent / len(batches) * 1e3, 3)})
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("scenes", "video", "cost"))
    parser.add_argument("bundle", nargs="?", type=Path, help="video: the detector's bundle")
    parser.add_argument("--scenes", default=",".join(SCENES))
    parser.add_argument("--fps", default="30,10")
    parser.add_argument("--seconds", type=float, default=12.0, help="video: each scene's length")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--camera", action="store_true",
                        help="video: botsort with the source as a moving camera too (its motion measured)")
    parser.add_argument("--streams", type=int, default=16, help="cost: streams")
    parser.add_argument("--objects", default="20,60,100", help="cost: objects a frame")
    parser.add_argument("--batches", type=int, default=300, help="cost: batches (a frame of every stream each)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.mode == "cost":
        args.objects = [int(v) for v in args.objects.split(",")]
        rows = cost(args)
        if args.json:
            args.json.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
        return
    args.scenes = args.scenes.split(",")
    args.fps = [float(v) for v in args.fps.split(",")]
    args.seeds = [int(v) for v in args.seeds.split(",")]
    if args.mode == "video" and args.bundle is None:
        parser.error("video needs the detector's BUNDLE")
    rows = scenes(args) if args.mode == "scenes" else video(args)
    summary = summarize(rows)
    for s in summary:
        print(f"{s['scene']:24s} {s['tracker']:10s} HOTA {s['HOTA']:5.1f} IDF1 {s['IDF1']:5.1f} MOTA {s['MOTA']:5.1f} "
              f"IDSW {s['IDSW']:6.1f} worst IDF1 {s['worst_IDF1']:5.1f} {s.get('us_per_detection', '')}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
