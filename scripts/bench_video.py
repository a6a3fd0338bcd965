#!/usr/bin/env python3
"""Real encoded video through `jetpipe serve`'s pipeline, per decoder path, side by side in one run.

  python scripts/bench_video.py [--streams 8,16] [--codecs h264,hevc] [--seconds 10] [--json out.json]

1080p30 H.264 and HEVC files are encoded with ffmpeg at run time (testsrc2, 10 s).
For each codec and stream count, each path runs in its own process (so CPU time
and RSS are its own): jetpipe's NVDEC path (PyNvVideoCodec, NV12 in device
memory), jetpipe's FFmpeg path (raw YUV: files decoded in-process by PyAV;
`ffmpeg-pipe` forces the ffmpeg subprocess writing to a pipe that network streams
use; `ffmpeg-cuda`, not run by default, is the in-process path with `--hwaccel
cuda`), and the old OpenCV path (BGR on the CPU); files loop and are offered as
fast as they go (every frame processed: saturated throughput). Then N streams paced at 30 fps (--realtime,
NVDEC): drops and latency against two batch periods. And the engine alone
(ONNX Runtime CUDA EP on device buffers, batch 8). Model: PP-OCRv4 det 640x640
FP32 (the built-in), postprocessing included (what users run); every path is
also run with `task raw` (no DB postprocessing), which leaves decoding, upload,
preprocessing and inference: the decoders' own CPU cost side by side.
Reported: frames/s, CPU cores used (process + decoder subprocess CPU time / wall),
CPU ms per frame, peak RSS, dropped, p50/p99 latency.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root), str(root / "scripts")]

from children import last_json  # noqa: E402

BATCH = 8
PATHS = ("nvdec", "ffmpeg", "ffmpeg-pipe", "opencv")


def encode(folder: Path, codec: str, seconds: float) -> Path:
    path = folder / f"{codec}-1080p30.mp4"
    encoder = {"h264": ["-c:v", "libx264", "-preset", "veryfast"],
               "hevc": ["-c:v", "libx265", "-preset", "veryfast", "-x265-params", "log-level=error"]}[codec]
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=s=1920x1080:r=30", "-t", str(seconds),
                    *encoder, "-pix_fmt", "yuv420p", str(path)], check=True)
    return path


def child(args) -> None:
    """One pipeline run in this process; prints one JSON line."""
    import time

    from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
    from jetpipe.pipelines.ingest.sources import pyav
    from jetpipe.pipelines.service.daemon import Pipeline

    decoder = args.decoder
    if decoder == "ffmpeg-pipe":  # files as network streams are decoded: by an ffmpeg process, through a pipe
        pyav.missing = lambda: "ffmpeg-pipe row of the benchmark"
        decoder = "ffmpeg"
    hwaccel = decoder.removeprefix("ffmpeg-") if decoder.startswith("ffmpeg-") else ""  # ffmpeg-cuda: --hwaccel
    decoder = "ffmpeg" if hwaccel else decoder
    sources = [SourceConfig(args.clip, loop=True, realtime=args.realtime, decoder=decoder, hwaccel=hwaccel)
               for _ in range(args.streams)]
    config = validate(PipelineConfig(bundle=Path(args.bundle), sources=sources, duration=args.seconds,
                                     max_batch=BATCH, backend=args.backend, metrics_listen="",
                                     log_every_s=1e9, batch_timeout_ms=args.batch_timeout_ms, queue_depth=4,
                                     task=args.task))
    pipeline = Pipeline(config)  # start-up (allocation, warm-up, decoder probes) is not timed
    paths = sorted({s.describe().rsplit("(", 1)[-1].rstrip(")") for s in pipeline.sources})
    before, wall = os.times(), time.perf_counter()
    summary = pipeline.run()
    after, wall = os.times(), time.perf_counter() - wall
    cpu = sum(getattr(after, k) - getattr(before, k) for k in ("user", "system", "children_user", "children_system"))
    processed = sum(summary["processed"])
    total = summary["latency_ms"]["total"]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({
        "decoder": args.decoder, "paths": paths, "streams": args.streams, "realtime": args.realtime,
        "task": args.task or "text-detection", "fps": processed / wall, "processed": processed,
        "dropped": sum(summary["dropped"]), "failed": sum(summary["failed"]),
        "decode_errors": sum(summary["decode_errors"]), "cpu_cores": cpu / wall,
        "cpu_ms_per_frame": 1000 * cpu / max(processed, 1), "rss_mb": rss, "decoder_rss_mb_max": child_rss,
        "p50_ms": total.get("0.5"), "p99_ms": total.get("0.99"), "seconds": wall,
        "batch_timeout_ms": args.batch_timeout_ms,
        "stage_p99_ms": {s: summary["latency_ms"][s].get("0.99") for s in ("queue", "gpu", "post")},
        "frame_bytes_uploaded": getattr(pipeline.runtime, "frame_bytes_uploaded", None)}), flush=True)


def run_child(bundle: Path, clip: Path, streams: int, decoder: str, seconds: float, realtime=False,
              task=None, batch_timeout_ms: float = 20) -> dict:
    argv = [sys.executable, __file__, "child", "--bundle", str(bundle), "--clip", str(clip), "--streams",
            str(streams), "--decoder", decoder, "--seconds", str(seconds), "--batch-timeout-ms", str(batch_timeout_ms)]
    argv += ["--realtime"] if realtime else []
    argv += ["--task", task] if task else []
    return last_json(argv, {"decoder": decoder, "streams": streams}, timeout=600)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="what")
    c = sub.add_parser("child")
    c.add_argument("--bundle", required=True)
    c.add_argument("--clip", required=True)
    c.add_argument("--streams", type=int, required=True)
    c.add_argument("--decoder", required=True)
    c.add_argument("--seconds", type=float, required=True)
    c.add_argument("--realtime", action="store_true")
    c.add_argument("--task")
    c.add_argument("--backend", default="onnxruntime-cuda")
    c.add_argument("--batch-timeout-ms", type=float, default=20)
    parser.add_argument("--streams", default="8,16")
    parser.add_argument("--codecs", default="h264,hevc")
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--modes", default="saturated,raw,realtime",
                        help="saturated (with postprocessing), raw (without), realtime (NVDEC only)")
    parser.add_argument("--batch-timeouts", default="20",
                        help="batch timeouts (ms) for the real-time rows, e.g. 20,5,0: one row each")
    args = parser.parse_args()
    if args.what == "child":
        child(args)
        return
    run_all(args)


def run_all(args) -> None:
    from bench_runtime import bare_backend, make_bundles

    from jetpipe import bundle as bundle_io

    rows, streams = [], [int(n) for n in args.streams.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        bundle = next(iter(make_bundles(Path(tmp), resnet=False).values()))
        sample = (3, *bundle_io.read_manifest(bundle)["input_size"])
        engine_fps = BATCH * 1000 / bare_backend(str(bundle / "model.onnx"), sample, BATCH, 200)
        print(json.dumps({"engine_only_fps": engine_fps, "batch": BATCH}), flush=True)
        for codec in args.codecs.split(","):
            clip = encode(Path(tmp), codec, 10)
            for n in streams:
                modes, paths = args.modes.split(","), args.paths.split(",")
                runs = [(path, {}) for path in paths] if "saturated" in modes else []
                runs += [(path, {"task": "raw"}) for path in paths] if "raw" in modes else []
                if "realtime" in modes and "nvdec" in paths:
                    runs += [("nvdec", {"realtime": True, "batch_timeout_ms": float(t)})
                             for t in args.batch_timeouts.split(",")]
                for path, options in runs:
                    rows.append({"codec": codec, **run_child(bundle, clip, n, path, args.seconds, **options)})
                    print(json.dumps(rows[-1]), flush=True)
    report(rows, engine_fps)
    if args.json:
        args.json.write_text(json.dumps({"engine_only_fps": engine_fps, "rows": rows}, indent=2))


def report(rows: list[dict], engine_fps: float) -> None:
    print(f"\nengine alone (ORT CUDA EP, batch {BATCH}): {engine_fps:.0f} frames/s")
    print("| codec | streams | path | mode | frames/s | % of engine | CPU cores | CPU ms/frame | RSS MB | dropped "
          "| p50 ms | p99 ms | 2 batch periods ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['codec']} | {r['streams']} | {r['decoder']} | | error: {r['error'][:80]} |")
            continue
        mode = (f"real time (batch timeout {r.get('batch_timeout_ms', 20):g} ms)" if r["realtime"] else
                "saturated, no postprocess" if r["task"] == "raw" else "saturated")
        period = 2 * 1000 * BATCH / (30 * r["streams"])
        print(f"| {r['codec']} | {r['streams']} | {'+'.join(r['paths'])} | {mode} | {r['fps']:.0f} | "
              f"{100 * r['fps'] / engine_fps:.0f} % | {r['cpu_cores']:.2f} | {r['cpu_ms_per_frame']:.2f} | "
              f"{r['rss_mb']:.0f} | {r['dropped']} | {r['p50_ms'] or 0:.1f} | {r['p99_ms'] or 0:.1f} | "
              f"{period:.0f} |")


if __name__ == "__main__":
    main()
