#!/usr/bin/env python3
"""N frame-paced TCP cameras (bench_busy.py's Cameras) served on this CPU machine by a tree's `jetpipe serve` (the
FFmpeg source, a tiny model, task raw, a jsonl sink), 15 s: frames/s, dropped, those missing from each camera's
first 2 s (bench_busy.missing_at_start: frame number -> cameras), p99, the first overload warning.

  python cpu_serve.py TREE BUNDLE VIDEO N     # session 56: TREE . and .dev/old (2629e10), the tests' tiny bundle
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[3] / "scripts")]
from bench_busy import Cameras, camera_stream, missing_at_start  # noqa: E402


def main() -> None:
    tree, bundle, video, count = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        cameras = Cameras(*camera_stream(video, out, 20), count)
        sources = [a for url in cameras.urls for a in ("--source", url)]
        try:
            done = subprocess.run([sys.executable, "-m", "jetpipe", "serve", "--bundle", bundle, *sources, "--task",
                                   "raw", "--decoder", "ffmpeg", "--duration", "15", "--metrics", "", "--sink",
                                   f"jsonl:{out}/r.jsonl", "--summary", f"{out}/s.json"],
                                  cwd=tree, env={**os.environ, "PYTHONPATH": tree}, capture_output=True, text=True)
        finally:
            cameras.close()
        summary = json.loads((out / "s.json").read_text())["summary"]
        numbers: dict = {}
        for line in (out / "r.jsonl").open():
            record = json.loads(line)
            if "schema" not in record:
                numbers.setdefault(record["stream"], []).append((record["t_capture"], record["frame"]))
    missing = missing_at_start(numbers)
    said = [line[-150:] for line in done.stderr.splitlines() if "overloaded:" in line][:1]
    print(tree, "fps", summary["throughput_fps"], "dropped", sum(summary["dropped"]), "missing at start",
          sum(missing.values()), "p99", summary["latency_ms"]["total"]["0.99"], "warned", said, flush=True)


if __name__ == "__main__":
    main()
