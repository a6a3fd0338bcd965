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

  python scripts/bench_tracking.py scenes [--scenes pillars,crossing] [--fps 30,10] [--seeds 1,2,3] [--looks 0.7,2]
                                         [--json OUT]
  python scripts/bench_tracking.py video BUNDLE [--scenes pillars] [--fps 10] [--seconds 12] [--seeds 1] [--camera]
                                         [--json OUT]
  python scripts/bench_tracking.py cost [--streams 16] [--objects 20,60,100] [--batches 300] [--json OUT]
  python scripts/bench_tracking.py sign-reid OUT.onnx
  python scripts/bench_tracking.py reid-cost-model OUT.onnx

  sign-reid  an embedding model with real weights for the rendered scenes, whose objects are signs: PP-OCRv4's
             recognizer (rapidocr-onnxruntime) with its per-step character probabilities reduced to the
             largest each character reached (the blank left out): which characters a sign shows. Then
             `jetpipe convert OUT.onnx --task embedding --preset ppocr-rec --input-size 48x320 -o BUNDLE` and
             `video BUNDLE --reid BUNDLE`. Not a person ReID network: the scenes' objects are not people.
  reid-cost-model  for cost only (random weights): a CNN the size of a person ReID network, 256 x 128 in, a
             512-long vector out, about OSNet x0.5's work (0.27 G multiply-adds; torchreid's model zoo). Convert
             it with `--task embedding --preset imagenet` and pass it to bench_busy.py --variant.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from jetpipe.calibration.tracking import (
    compare,
    read_jsonl_tracks,
    read_mot,
    score,
    sequence_of,
    summarize,
    track_scene,
)
from jetpipe.calibration.tracking_scenes import SCENES, SimulatedLooks, make_scene, render_scene

TRACKERS = ("bytetrack", "botsort")


def scenes(args) -> list[dict]:
    rows = []
    for seed in args.seeds:
        made = [make_scene(n, f, seed=seed) for n in args.scenes for f in args.fps]
        rows += [{**r, "seed": seed} for r in compare(made, list(TRACKERS))]
        for scene, noise in itertools.product(made, args.looks):  # botsort given looks of a known quality
            sequence, _ = track_scene(scene, "botsort", looks=SimulatedLooks(noise, seed=seed))
            rows.append({"scene": scene.name, "tracker": f"botsort+looks(noise {noise:g})", "seed": seed,
                         **{k: round(v, 2) for k, v in score(sequence).items()}})
    return rows


def video(args) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for name in args.scenes:
                for fps in args.fps:
                    clip = Path(tmp) / f"{name}-{fps:g}-{seed}.mp4"
                    gt = read_mot(render_scene(name, clip, fps, args.seconds, seed))
                    kinds = [*args.trackers, *(["botsort+camera"] if args.camera else []),
                             *(f"botsort+reid={reid}" for reid in args.reid)]
                    for kind in kinds:
                        served = Path(tmp) / f"{clip.stem}-{len(rows)}.jsonl"
                        tracker, _, reid = kind.partition("+reid=")
                        command = [sys.executable, "-m", "jetpipe", "serve", "--bundle", str(args.bundle),
                                   "--source", str(clip), "--tracker", tracker, "--sink", f"jsonl:{served}",
                                   "--metrics", "", *(["--reid", reid] if reid else [])]
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


def sign_reid(out: Path) -> None:
    import onnx
    from onnx import helper, numpy_helper

    from jetpipe.models import BUILTIN

    model = onnx.load(str(BUILTIN["ppocr-rec"].path()))
    probabilities = model.graph.output[0].name
    model.graph.initializer.extend([numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
                                    (("sign_start", [1]), ("sign_end", [1 << 30]), ("sign_axis", [1]))])
    model.graph.node.extend([
        helper.make_node("ReduceMax", [probabilities], ["sign_peaks"], axes=[1], keepdims=0),
        helper.make_node("Slice", ["sign_peaks", "sign_start", "sign_end", "sign_axis"], ["sign_look"])])
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("sign_look", onnx.TensorProto.FLOAT, ["N", 6624]))
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    print(f"wrote {out}")


def reid_cost_model(out: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    layers = [(3, 16, 2), (16, 32, 1), (32, 32, 2), (32, 64, 1), (64, 64, 2), (64, 128, 1), (128, 160, 2),
              (160, 512, 1)]  # (in, out, stride) of 3 x 3 convolutions, each with a ReLU
    nodes, weights, name, macs, hw = [], [], "x", 0, np.array([256, 128])
    for k, (cin, cout, stride) in enumerate(layers):
        weights += [numpy_helper.from_array((rng.normal(size=(cout, cin, 3, 3)) * np.sqrt(2 / (9 * cin)))
                                            .astype(np.float32), f"w{k}"),
                    numpy_helper.from_array(np.zeros(cout, np.float32), f"b{k}")]
        nodes += [helper.make_node("Conv", [name, f"w{k}", f"b{k}"], [f"c{k}"], pads=[1, 1, 1, 1],
                                   strides=[stride, stride]),
                  helper.make_node("Relu", [f"c{k}"], [f"r{k}"])]
        hw = hw // stride
        macs += cin * cout * 9 * int(hw.prod())
        name = f"r{k}"
    nodes += [helper.make_node("GlobalAveragePool", [name], ["pooled"]),
              helper.make_node("Flatten", ["pooled"], ["look"])]
    graph = helper.make_graph(nodes, "reid_cost", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                 ["N", 3, 256, 128])],
                              [helper.make_tensor_value_info("look", TensorProto.FLOAT, ["N", 512])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    print(f"wrote {out}: {macs / 1e9:.2f} G multiply-adds a crop (random weights: for cost only)")


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


LOOK = np.random.default_rng(0).normal(size=(4096, 512)).astype(np.float32)
LOOK /= np.linalg.norm(LOOK, axis=1, keepdims=True)


def ready_looks(jobs) -> np.ndarray:
    """The tracker's side of looks alone: 512-long vectors ready (a model's time is the GPU's, measured apart)."""
    return LOOK[:sum(len(boxes) for _, boxes in jobs)]


def cost(args) -> list[dict]:
    """`botsort table + looks`: the table asking for looks (512 long, as OSNet's) and using them, their model's
    run left out (it is on the GPU; bench_busy.py --variant measures the whole)."""
    from jetpipe.pipelines.core.tracking import BotSortTable, make_tracker

    rows = []
    for objects in args.objects:
        batches = moving_boxes(args.streams, objects, args.batches)
        found = sum(len(f[1]) for batch in batches for f in batch)
        for name in ("bytetrack", "botsort", "botsort table", "botsort table + looks"):
            for _repeat in range(2):  # the second run is reported: SciPy and the caches warm
                if name.startswith("botsort table"):
                    table = BotSortTable(first_ids=[1] * args.streams)
                    embed = ready_looks if name.endswith("looks") else None
                    started = time.thread_time()
                    for batch in batches:
                        table.update(batch, embed)
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
    parser.add_argument("mode", choices=("scenes", "video", "cost", "sign-reid", "reid-cost-model"))
    parser.add_argument("bundle", nargs="?", type=Path, help="video: the detector's bundle; sign-reid: the ONNX "
                                                             "file to write")
    parser.add_argument("--scenes", default=",".join(SCENES))
    parser.add_argument("--fps", default="30,10")
    parser.add_argument("--seconds", type=float, default=12.0, help="video: each scene's length")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--trackers", default=",".join(TRACKERS), help="video: the trackers without looks")
    parser.add_argument("--looks", default="", help="scenes: botsort given simulated looks of these noise levels too "
                                                     "(comma-separated; 0.7: a good ReID, 2: a poor one)")
    parser.add_argument("--reid", default="", help="video: botsort with these looks too (comma-separated: colour, "
                                                    "an embedding bundle)")
    parser.add_argument("--camera", action="store_true",
                        help="video: botsort with the source as a moving camera too (its motion measured)")
    parser.add_argument("--streams", type=int, default=16, help="cost: streams")
    parser.add_argument("--objects", default="20,60,100", help="cost: objects a frame")
    parser.add_argument("--batches", type=int, default=300, help="cost: batches (a frame of every stream each)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.mode == "sign-reid":
        return sign_reid(args.bundle)
    if args.mode == "reid-cost-model":
        return reid_cost_model(args.bundle)
    if args.mode == "cost":
        args.objects = [int(v) for v in args.objects.split(",")]
        rows = cost(args)
        if args.json:
            args.json.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
        return
    args.scenes = args.scenes.split(",")
    args.fps = [float(v) for v in args.fps.split(",")]
    args.seeds = [int(v) for v in args.seeds.split(",")]
    args.trackers = [v for v in args.trackers.split(",") if v]
    args.reid = [v for v in args.reid.split(",") if v]
    args.looks = [float(v) for v in args.looks.split(",") if v]
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
