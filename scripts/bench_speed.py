#!/usr/bin/env python3
"""Speeds on a calibrated ground plane against the truth (issue 65, item 5), and what the ground step costs.

  accuracy  vehicles (5-80 km/h) and people through a known pinhole camera (calibration/speed_scenes.py: 1080p,
            6 m up, tilted 15 degrees, the calibration four corners clicked to the pixel), box edges jittered and
            frames missed: the error of every speed given, the largest and the mean, by speed band and distance,
            per seed, window and condition.
  cost      the ground step's CPU per tracked object per frame (positions, the fit, the records' lists): 16
            streams x N objects a frame, batches of 16 frames, microseconds.

  python scripts/bench_speed.py accuracy [--seeds 1,2,3] [--windows 1.0,1.5] [--json OUT]
  python scripts/bench_speed.py cost [--objects 20,60,100]
"""

from __future__ import annotations

import argparse
import json
import time
from types import SimpleNamespace

import numpy as np

from jetpipe.calibration import speed_scenes
from jetpipe.calibration.speed_scenes import Noise

CONDITIONS = {"2% jitter, 10% missed, 30 fps": Noise(), "2% jitter, 10% missed, 10 fps": Noise(fps=10.0),
              "5% jitter, 10% missed, 30 fps": Noise(jitter=0.05), "no jitter, none missed, 30 fps": Noise(0.0, 0.0)}


def accuracy(args) -> list[dict]:
    rows = []
    for name, noise in CONDITIONS.items():
        for window in args.windows:
            for seed in args.seeds:
                report = speed_scenes.evaluate(seed, noise, window_s=window)
                rows.append({"condition": name, "window_s": window, **report})
                bands = " ".join(f"{k}: {v['max']}/{v['mean']}" for k, v in report["by_speed"].items())
                print(f"{name:32s} window {window:.1f} s seed {seed}: max {report['max_error_kmh']:5.2f} mean "
                      f"{report['mean_error_kmh']:5.3f} km/h, speed in {report['with_speed']}/"
                      f"{report['object_frames']} object-frames | by speed (max/mean) {bands}", flush=True)
    return rows


class _Picture:
    def size(self):
        return speed_scenes.FRAME_HW


def cost(args) -> list[dict]:
    from jetpipe.pipelines.core.ground import GroundStep
    from jetpipe.tasks.detections import Detections

    rows = []
    calibrations = [speed_scenes.calibration(speed_scenes.Camera(), stream=s) for s in range(16)]
    for objects in args.objects:
        step = GroundStep(calibrations, stream_id=lambda slot: slot)
        rng = np.random.default_rng(0)
        start = rng.uniform([200, 400], [1700, 1000], (16, objects, 2))
        batches, frames = 200, 16
        elapsed = 0.0
        for b in range(batches):
            packets, results = [], []
            for s in range(16):
                x, y = start[s, :, 0] + 3 * b, start[s, :, 1] + 0.5 * b
                boxes = np.column_stack([x - 20, y - 80, x + 20, y])
                found = Detections(boxes, np.full(objects, 0.9), np.zeros(objects),
                                   tracker_id=np.arange(1, objects + 1))
                packets.append(SimpleNamespace(stream=s, pts=b / 30, t_capture=0.0, frame=_Picture()))
                results.append(found)
            began = time.thread_time()
            step.run(packets, results)
            for found in results:
                found.ground.results()  # the records' lists: made once, in the sinks
            elapsed += time.thread_time() - began
        per_object = elapsed / (batches * frames * objects) * 1e6
        rows.append({"objects": objects, "us_per_object_frame": round(per_object, 2),
                     "ms_per_batch": round(elapsed / batches * 1e3, 3)})
        print(f"16 streams x {objects} objects: {per_object:.2f} us per object-frame, "
              f"{elapsed / batches * 1e3:.2f} ms per batch of 16 frames", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    a = sub.add_parser("accuracy")
    a.add_argument("--seeds", default="1,2,3")
    a.add_argument("--windows", default="1.0,1.5")
    a.add_argument("--json", default=None)
    c = sub.add_parser("cost")
    c.add_argument("--objects", default="20,60,100")
    c.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.what == "accuracy":
        args.seeds = [int(s) for s in args.seeds.split(",")]
        args.windows = [float(w) for w in args.windows.split(",")]
        rows = accuracy(args)
    else:
        args.objects = [int(n) for n in args.objects.split(",")]
        rows = cost(args)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
