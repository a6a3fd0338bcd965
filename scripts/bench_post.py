#!/usr/bin/env python3
"""The serving side's CPU per tracked object on any machine (issue 66 target 4): a busy scene's real model
outputs replayed through the post stage's code, phase by phase, without a GPU.

  python scripts/bench_post.py BUNDLE [--video words200.mp4 | --words 200] [--frames 300] [--streams 16]
                               [--batch 8] [--rounds 300] [--repeats 3] [--profile OUT.prof] [--json OUT]

BUNDLE is a text-detection bundle (`jetpipe convert ppocr-det`, PP-OCRv4 det: real weights). The video
(scripts/bench_events.py's words panning past the camera; made once with --words where --video is not given) is
decoded with OpenCV and its first --frames frames run through the bundle's model on ONNX Runtime (CPU), once:
the probability maps are reduced to what the GPU's "components" reduction hands the post thread (each region's
box, area, probability sum, orientation and extents: jetpipe.runtime.postprocess_gpu.COMPONENT) and cached beside
the video. Then --streams streams, each starting at another frame of the video, are replayed --rounds frames each
(30 frames/s of stream time), in batches of --batch frames of different streams as the batcher forms them under
load, through what `jetpipe serve` runs on a finished batch with 4 rules a stream (two lines, two zones:
bench_events.RULES) and a jsonl sink:

  finish    the task's finish from the GPU's components (tasks.detections.finish_detections, reduced)
  tracker   botsort's table (the rules turn it on), the batch in one pass
  events    the rules (EventStep: decided 32 frames at a time)
  records   each frame's FrameRecord, published on the record bus
  sinks     the jsonl sink's write of every record and event (the JSON made once, by numpy where it can; a
            batch's results JSON made together at its first record's, as the daemon's emit shares it)

Reported: each phase's thread CPU in microseconds per tracked object per frame (objects with a track ID in a
record, as bench_busy.py counts them), their sum (the serving side's), tracked and detected boxes a frame. The GPU
machine's `bench_busy.py` measures the same phases inside the daemon (post thread + sinks); this replay leaves out
the daemon's threads, queues and the GIL's contention with decoding, so its figure is the work itself.
--profile writes a cProfile of the last repeat's replay (the imports and first calls behind it; pstats).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root / "scripts"), str(root)]

from bench_events import RULES, make_video  # noqa: E402

from jetpipe.pipelines.core.bus import RecordBus  # noqa: E402
from jetpipe.pipelines.core.record import BatchJson, FrameRecord  # noqa: E402
from jetpipe.pipelines.core.steps import build_steps  # noqa: E402
from jetpipe.pipelines.outputs.sinks.lines import JsonlSink  # noqa: E402
from jetpipe.runtime.api import Frame  # noqa: E402
from jetpipe.runtime.postprocess_gpu import COMPONENT, EXTENT_SCALE, SUM_SCALE  # noqa: E402
from jetpipe.tasks.detections import NO_TRACK, finish_detections  # noqa: E402

FPS = 30.0
PHASES = ("finish", "tracker", "events", "records", "sinks")


def components_of(prob: np.ndarray, threshold: float, limit: int) -> tuple[int, np.ndarray]:
    """What the GPU's components reduction writes for one probability map: (regions found, [limit] COMPONENT),
    from the CPU path's measure of its regions (text_detection.regions; the tests hold the two paths equal)."""
    from jetpipe.tasks.text_detection import regions  # here: a tree before it still replays a made cache

    x, y, w, h, area, total, angle, extents = regions(prob, threshold)
    found = np.zeros(limit, COMPONENT)
    n = min(len(area), limit)
    found["x0"][:n], found["y0"][:n], found["x1"][:n], found["y1"][:n] = x[:n], y[:n], x[:n] + w[:n] - 1, \
        y[:n] + h[:n] - 1
    found["area"][:n], found["angle"][:n] = area[:n], angle[:n]
    found["sum"][:n] = np.round(total[:n] * SUM_SCALE).astype(np.uint64)
    for k, name in enumerate(("along_min", "along_max", "across_min", "across_max")):
        found[name][:n] = np.rint(extents[:n, k] * EXTENT_SCALE)
    return len(area), found


def model_outputs(bundle: Path, video: Path, frames: int, cache: Path) -> dict:
    """The video's first `frames` frames through the bundle's model (ONNX Runtime, CPU), as the GPU's
    components; cached (the model's run takes minutes on a small CPU)."""
    if cache.exists():
        return dict(np.load(cache, allow_pickle=False))
    import cv2

    from jetpipe.runtime.open import open_runtime

    runtime = open_runtime(bundle, max_batch=1, backend="onnxruntime-cpu")
    post = postprocessor_of(bundle)
    threshold, limit = post.threshold, post.max_components
    capture = cv2.VideoCapture(str(video))
    counts, found, boxes, sizes = [], [], [], []
    started = time.monotonic()
    for k in range(frames):
        ok, image = capture.read()
        if not ok:
            break
        result = runtime.infer([Frame(image)])
        prob = next(iter(result.outputs.values()))[0, 0]
        n, c = components_of(prob, threshold, limit)
        counts.append(n)
        found.append(c)
        box = result.letterboxes[0]
        boxes.append([box.scale_x, box.scale_y, box.pad_x, box.pad_y])
        sizes.append(image.shape[:2])
        if k % 50 == 49:
            print(f"  model: {k + 1} frames ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    runtime.close()
    counts = np.array(counts, np.int32)
    found = np.stack(found)[:, :max(1, int(counts.max()))]  # the rows past every frame's count are unused: the
    #                                                         cache is a few MB, not the GPU buffer's 26
    arrays = {"counts": counts, "components": found,
              "letterboxes": np.array(boxes, np.float64), "sizes": np.array(sizes, np.int64)}
    tmp = cache.with_name(cache.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.rename(cache)
    return arrays


@dataclass
class Box:  # a letterbox as the runtime reports it (geometry.Letterbox's fields the finish reads)
    scale_x: float
    scale_y: float
    pad_x: float
    pad_y: float


@dataclass
class Packet:  # what the steps read of a queued frame (ingest.batcher.QueuedFrame)
    stream: int
    frame_no: int
    t_capture: float
    frame: Frame
    pts: float

    def as_read(self):
        return self.frame

    def release(self) -> None:
        pass


def batches(arrays: dict, streams: int, rounds: int, batch: int):
    """The replay's batches: (packets, outputs, letterboxes, sizes), each stream starting at another frame of the
    video, a frame of every stream a round, `batch` frames of different streams a batch."""
    total = len(arrays["counts"])
    height, width = (int(v) for v in arrays["sizes"][0])
    picture = Frame(np.zeros((height * 3 // 2, width), np.uint8), "nv12")  # the steps read only its size
    queue = []
    for r in range(rounds):
        for s in range(streams):
            k = (s * 37 + r) % total
            queue.append((Packet(s, r, 1.8e9 + r / FPS, picture, r / FPS), k))
    for a in range(0, len(queue), batch):
        part = queue[a:a + batch]
        index = [k for _, k in part]
        outputs = {"counts": arrays["counts"][index], "components": arrays["components"][index]}
        boxes = [Box(*arrays["letterboxes"][k]) for k in index]
        sizes = [tuple(int(v) for v in arrays["sizes"][k]) for k in index]
        yield [p for p, _ in part], outputs, boxes, sizes


def postprocessor_of(bundle: Path):
    """The bundle's task's postprocessing, as the daemon makes it (Pipeline.__init__)."""
    from jetpipe import bundle as bundles
    from jetpipe.tasks.registry import for_bundle

    task, options = for_bundle(bundles.read_manifest(bundle), None)
    return task.postprocessor(options)


def replay(bundle: Path, arrays: dict, args, out: Path) -> dict:
    from jetpipe.cli import _serve_config, build_parser

    parsed = build_parser().parse_args(["serve", "--bundle", str(bundle), *["--source", "synthetic:64x64@30"] * 2,
                                        *RULES, "--metrics", ""])
    config = _serve_config(parsed)
    post = postprocessor_of(bundle)
    bus = RecordBus()
    sink = JsonlSink(f"jsonl:{out}")
    bus.subscribe(sink.write, None)  # the writer thread's work, timed apart below
    steps = build_steps(config, args.streams, None, lambda slot: slot, RecordBus())
    step_of = {step.name: step for step in steps}
    events = step_of["events"]
    published: list = []
    events.publish = lambda record, frame=None: published.append(record)
    cpu = dict.fromkeys(PHASES, 0.0)
    tracked = detected = frames = 0
    for packets, outputs, boxes, sizes in batches(arrays, args.streams, args.rounds, args.batch):
        t = time.thread_time()
        results = finish_detections(post, outputs, boxes, sizes, reduced=True)
        t1 = time.thread_time()
        step_of["tracker"].run(packets, results)
        t2 = time.thread_time()
        events.run(packets, results)
        t3 = time.thread_time()
        records = []
        batch_json = BatchJson(results)  # as the daemon's emit: the batch's results JSON made together
        for place, (packet, found) in enumerate(zip(packets, results)):
            record = FrameRecord(packet.stream, "words.mp4", packet.frame_no, round(packet.pts, 6),
                                 round(packet.t_capture, 6), round(time.time(), 6),
                                 {"queue": 1.0, "gpu": 2.0, "post": 3.0, "total": 6.0}, "text-detection", found)
            record.batch_json = (batch_json, place)
            records.append(record)
        t4 = time.thread_time()
        for record in [*records, *published]:
            sink.write(record)
        published.clear()
        t5 = time.thread_time()
        for phase, spent in zip(PHASES, (t1 - t, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            cpu[phase] += spent
        frames += len(packets)
        detected += sum(len(found) for found in results)
        tracked += sum(int(np.count_nonzero(found.tracker_id != NO_TRACK)) for found in results
                       if found.tracker_id is not None)
    t = time.thread_time()
    events.flush()
    cpu["events"] += time.thread_time() - t
    for record in published:
        sink.write(record)
    sink.close()
    per = {phase: round(1e6 * s / max(tracked, 1), 2) for phase, s in cpu.items()}
    return {"frames": frames, "tracked_per_frame": round(tracked / frames, 1),
            "detected_per_frame": round(detected / frames, 1), "us_per_object": per,
            "serving_us_per_object": round(sum(per.values()), 2), "cpu_s": {k: round(v, 3) for k, v in cpu.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--video", type=Path, help="an H.264 file of the scene (default: made with --words)")
    parser.add_argument("--words", type=int, default=200, help="words in a frame of the made video")
    parser.add_argument("--frames", type=int, default=300, help="the video's frames through the model")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=300, help="frames of each stream replayed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", type=Path, help="a cProfile of the last repeat")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.video is not None and not args.video.is_file():
        parser.error(f"--video {args.video}: no such file (leave --video out to make one with --words)")
    with tempfile.TemporaryDirectory() as tmp:
        video = args.video
        if video is None:
            video = Path(tempfile.gettempdir()) / f"jetpipe-words{args.words}.mp4"
            if not video.exists():
                made = Path(tmp) / video.name
                make_video(made, args.frames / FPS + 1, args.words)
                made.replace(video)
        cache = video.with_name(f"{video.stem}.{args.bundle.resolve().name}.{args.frames}.components.npz")
        arrays = model_outputs(args.bundle, video, args.frames, cache)
        rows = []
        for repeat in range(args.repeats):
            profiler = cProfile.Profile() if args.profile and repeat == args.repeats - 1 else None
            if profiler:
                profiler.enable()
            row = replay(args.bundle, arrays, args, Path(tmp) / f"records{repeat}.jsonl")
            if profiler:
                profiler.disable()
                profiler.dump_stats(args.profile)
            rows.append({"repeat": repeat + 1, **row})
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"streams": args.streams, "batch": args.batch, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
