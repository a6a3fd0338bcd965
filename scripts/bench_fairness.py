#!/usr/bin/env python3
"""Load shedding's fairness (issue 49): N live copies of one video (`--loop --realtime`: cameras) through
`jetpipe serve` with a latency budget, overloaded; reported: frames/s, the p99 latency, frames dropped, and how
far each stream's processed frames are from the mean (the spread, per cent).

  python scripts/bench_fairness.py BUNDLE VIDEO [--streams 48,64] [--seconds 30] [--budget-ms 66] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run(bundle: str, video: str, streams: int, seconds: float, budget_ms: float, out: Path,
        extra: tuple[str, ...] = (), live: bool = True) -> tuple[dict, dict]:
    """(the row, the whole summary) of one `jetpipe serve` of `streams` live copies (extra: more flags; live
    False: looping files read as fast as they are taken, saturated)."""
    name = "-".join(extra).replace(",", "_").replace("/", "_") or "plain"
    summary = out / f"summary-{streams}-{name}{'' if live else '-files'}.json"
    command = [sys.executable, "-m", "jetpipe", "serve", "--bundle", bundle, *(["--source", video] * streams),
               "--loop", *(["--realtime"] if live else []), "--duration", str(seconds), "--metrics", "",
               "--summary", str(summary),
               *(["--latency-budget-ms", str(budget_ms)] if budget_ms else []), *extra]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"jetpipe serve failed:\n{done.stderr[-3000:]}")
    s = json.loads(summary.read_text())["summary"]
    processed = s["processed"]
    mean = sum(processed) / len(processed)
    return {"streams": streams, "frames_per_s": s["throughput_fps"], "p50_ms": s["latency_ms"]["total"]["0.5"],
            "p99_ms": s["latency_ms"]["total"]["0.99"], "captured": sum(s["captured"]), "dropped": sum(s["dropped"]),
            "processed_min_mean_max": [min(processed), round(mean, 1), max(processed)],
            "spread_percent": [round(100 * (min(processed) - mean) / mean, 1),
                               round(100 * (max(processed) - mean) / mean, 1)], "cpu_cores": s["cpu_cores"]}, s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("video", help="a 1080p30 video file (bench_events.py makes one)")
    parser.add_argument("--streams", default="48,64")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--budget-ms", type=float, default=66.0)
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench-fair-"))
    rows = []
    for streams in (int(n) for n in args.streams.split(",")):
        rows.append(run(args.bundle, args.video, streams, args.seconds, args.budget_ms, out)[0])
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
