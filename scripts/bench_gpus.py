#!/usr/bin/env python3
"""Serving on one GPU against two (issue 53): N live copies of one video (`--loop --realtime`: cameras, NVDEC)
through `jetpipe serve --gpus 0` and `--gpus 0,1`, one after the other for each N; reported per arm: frames/s,
the p99 latency, frames dropped, each stream's processed frames against the mean (the spread, per cent), the
CPU cores of every process (and per GPU), and the two-GPU arm's frames/s over the one-GPU arm's.

  python scripts/bench_gpus.py BUNDLE VIDEO [--streams 16,48,96] [--seconds 30] [--budget-ms 66] [--json OUT]

`--plain` adds a third arm, serve without --gpus (one process, no face): what the face costs on one GPU.
`--files` reads the copies as looping files, as fast as they are taken (saturated; no latency budget): a light
detector's or a chain's rate. `--serve-flags "..."` passes more flags to every serve, e.g. a secondary stage:
`--serve-flags "--secondary rec"`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fairness import run as fairness_run  # noqa: E402


def run(bundle: str, video: str, streams: int, gpus: str | None, seconds: float, budget_ms: float, out: Path,
        files: bool = False, flags: tuple[str, ...] = ()) -> dict:
    extra = (*flags, *(("--gpus", gpus) if gpus else ()))
    row, summary = fairness_run(bundle, video, streams, seconds, 0.0 if files else budget_ms, out, extra,
                                live=not files)
    per_gpu = summary.get("gpus", [])
    return {**row, "gpus": gpus or "plain", "files": files, "flags": " ".join(flags),
            "face_cpu_cores": summary.get("face_cpu_cores"), "per_gpu_fps": [g["throughput_fps"] for g in per_gpu],
            "per_gpu_cpu_cores": [g.get("cpu_cores") for g in per_gpu],
            # where each GPU's files were decoded: in decode processes (serve's decode_processes, auto by default)
            "decode_processes": [("decode_processes" in g.get("cpu_seconds", {})) for g in per_gpu or [summary]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("video", help="a 1080p30 video file (bench_events.py makes one)")
    parser.add_argument("--streams", default="16,48,96")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--budget-ms", type=float, default=66.0, help="0: no latency budget")
    parser.add_argument("--plain", action="store_true", help="also serve without --gpus")
    parser.add_argument("--files", action="store_true", help="looping files, saturated, instead of live copies")
    parser.add_argument("--serve-flags", default="", help="more flags for every serve, e.g. '--secondary rec'")
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args()
    flags = tuple(shlex.split(args.serve_flags))
    out = Path(tempfile.mkdtemp(prefix="bench-gpus-"))
    rows = []
    for streams in (int(n) for n in args.streams.split(",")):
        arms = {}
        for gpus in ([None] if args.plain else []) + ["0", "0,1"]:
            arms[gpus] = run(args.bundle, args.video, streams, gpus, args.seconds, args.budget_ms, out, args.files,
                             flags)
            print(json.dumps(arms[gpus]), flush=True)
        ratio = round(arms["0,1"]["frames_per_s"] / max(arms["0"]["frames_per_s"], 1e-9), 3)
        print(json.dumps({"streams": streams, "two_over_one": ratio}), flush=True)
        rows += [*arms.values(), {"streams": streams, "two_over_one": ratio}]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
