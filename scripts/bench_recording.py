#!/usr/bin/env python3
"""Recording soak (issue 67): `jetpipe serve --record DIR --record-max-size SIZE` on N live-paced H.264 streams
(files looped in real time) for S seconds, the folder's size sampled every second as `du` counts it; then, from
the index and the files:

  - the largest size seen, against the budget (never above it);
  - per stream, the kept window (its oldest kept segment's start to its newest's end): recorded seconds / window
    seconds, and the longest gap between consecutive segments (at most one frame interval);
  - every kept segment probed with ffprobe (it plays: its frames decode without error);
  - an export across 5 consecutive segments: one file, its duration against the range (within one GOP).

  python scripts/bench_recording.py BUNDLE [--streams 8] [--seconds 600] [--max-size 50MB] [--json OUT]

The video is a 320x240 30 fps test pattern at 300 kbit/s with a keyframe a second (made with ffmpeg); the model
is whatever BUNDLE is (recording does not depend on it: a small one leaves the cores to the streams). The test
tests/pipelines/outputs/test_recording_soak.py runs the same checks for a shorter time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root)]

FPS, GOP_S = 30, 1.0


def make_video(path: Path, seconds: float = 30.0) -> Path:
    subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-f", "lavfi", "-i", f"testsrc2=size=320x240:rate={FPS}",
                    "-t", str(seconds), "-c:v", "libx264", "-g", str(int(FPS * GOP_S)), "-b:v", "300k", "-pix_fmt",
                    "yuv420p", str(path)], check=True)
    return path


def folder_bytes(folder: Path) -> int:
    """As du counts it: every file's and folder's whole blocks (or its size, where larger)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            try:
                info = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:  # removed meanwhile (retention)
                continue
            total += max(info.st_size if name in filenames else 0, info.st_blocks * 512)
    return total


def soak(bundle: str, video: Path, folder: Path, streams: int, seconds: float, max_size: str,
         segment_s: float = 10.0) -> dict:
    """serve for `seconds` with the recording, the folder sampled each second; what was seen and what was kept."""
    config = folder.parent / "soak.toml"
    sources = "".join(f"[[source]]\nuri = {json.dumps(str(video))}\nloop = true\nrealtime = true\n"
                      for _ in range(streams))
    config.write_text(f"[pipeline]\nbundle = {json.dumps(str(bundle))}\nqueue_depth = 2\n{sources}"
                      f"[record]\nfolder = {json.dumps(str(folder))}\nmax_size = {json.dumps(max_size)}\n"
                      f"segment_s = {segment_s}\nmin_free = 0\n")
    summary = folder.parent / "summary.json"
    run = subprocess.Popen([sys.executable, "-m", "jetpipe", "serve", str(config), "--metrics", "", "--summary",
                            str(summary)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=root)
    sizes, started = [], time.monotonic()
    try:
        while time.monotonic() - started < seconds and run.poll() is None:
            if folder.exists():
                sizes.append(folder_bytes(folder))
            time.sleep(1.0)
    finally:
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=120)
    sizes.append(folder_bytes(folder))
    if run.returncode != 0:
        raise RuntimeError(f"serve failed ({run.returncode}): {err[-2000:]}")
    return {"samples": len(sizes), "max_bytes_seen": max(sizes), "summary": json.loads(summary.read_text())["summary"]}


def kept(folder: Path) -> dict:
    """Per stream: its kept window, the recorded share of it, the longest gap; every segment probed."""
    with sqlite3.connect(folder / "index.sqlite3") as db:
        rows = db.execute("SELECT stream, path, start, end, open FROM segments ORDER BY stream, start").fetchall()
    streams: dict[int, list] = {}
    for stream, path, start, end, still_open in rows:
        streams.setdefault(stream, []).append((path, start, end, still_open))
    report, unplayable = {}, []
    for stream, segments in streams.items():
        window = segments[-1][2] - segments[0][1]
        recorded = sum(end - start for _, start, end, _ in segments)
        gaps = [b[1] - a[2] for a, b in zip(segments, segments[1:])]
        report[stream] = {"segments": len(segments), "window_s": round(window, 3),
                          "recorded_share": round(recorded / window, 6) if window > 0 else None,
                          "longest_gap_s": round(max(gaps, default=0.0), 4),
                          "open": sum(s[3] for s in segments)}
        for path, *_ in segments:
            done = subprocess.run(["ffmpeg", "-v", "error", "-i", str(folder / path), "-f", "null", "-"],
                                  capture_output=True, text=True)
            if done.returncode != 0 or done.stderr.strip():
                unplayable.append(path)
    return {"streams": report, "unplayable": unplayable}


def export_five(folder: Path, out: Path) -> dict:
    """An export from inside the 2nd to inside the 6th kept segment of the first stream: its duration against
    the range (it starts at the keyframe at or before the range's start: within one GOP)."""
    from jetpipe.pipelines.outputs.recording.export import export_range

    with sqlite3.connect(folder / "index.sqlite3") as db:
        stream = db.execute("SELECT MIN(stream) FROM segments").fetchone()[0]
        rows = db.execute("SELECT start, end FROM segments WHERE stream = ? AND open = 0 ORDER BY start",
                          (stream,)).fetchall()
    start, end = rows[1][0] + 0.5, rows[5][1] - 0.5
    done = export_range(folder, stream, start, end, out)
    probed = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0",
                             str(out)], capture_output=True, text=True, check=True)
    duration = float(probed.stdout)
    return {"range_s": round(end - start, 3), "duration_s": duration, "segments": done.segments,
            "within_a_gop": end - start - 1 / FPS <= duration <= end - start + GOP_S + 2 / FPS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--max-size", default="50MB")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from jetpipe.pipelines.amounts import parse_bytes

    work = Path(tempfile.mkdtemp(prefix="bench-recording-"))
    video = make_video(work / "in.mp4")
    seen = soak(args.bundle, video, work / "rec", args.streams, args.seconds, args.max_size)
    result = {"streams": args.streams, "seconds": args.seconds, "max_size": args.max_size,
              "budget_bytes": parse_bytes(args.max_size), **{k: v for k, v in seen.items() if k != "summary"},
              "recording": seen["summary"].get("recording"), **kept(work / "rec"),
              "export": export_five(work / "rec", work / "export.mp4")}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
