#!/usr/bin/env python3
"""Busy scenes (issue 66): many live cameras of a crowded picture through the whole daemon, trees side by side.

  python scripts/bench_busy.py BUNDLE [--words 200] [--streams 16] [--seconds 20] [--repeats 2]
                               [--tree new=. --tree old=.dev/old] [--variant 'colour=--reid colour']
                               [--no-plain] [--py-spy DIR [--py-spy-all-threads]] [--no-rules]
                               [--network [--remux-shim] [--camera-phases connection,random]] [--json OUT]

N copies of a 1080p30 H.264 file of words panning leftwards past the text detector (scripts/bench_events.py's
video; 200 words in a frame give about 60 lines found and 41 tracked a frame), served live (--loop --realtime) with
the CLI's defaults: the tracker the rules turn on (botsort), 4 rules a stream (two lines, two zones) and a jsonl
sink, for --seconds. Each --tree (NAME=PATH, a checkout of jetpipe) runs in turn, interleaved, --repeats times, the
same video and bundle; each --variant (NAME=FLAGS: more `serve` flags, e.g. looks for the tracker) runs beside the
plain run of each tree, interleaved too (e.g. `--variant 'workers2=--workers-per-gpu 2'`: two serving processes on
the GPU; their CPU is summed). Reported per run: frames/s, dropped (of those, dropped_catching_up: while a
stream's backlog came at once), the frames missing from each stream's first 2 s (missing_at_start: a camera's
connection; by frame number in missing_frame_numbers), latency p50 / p99 (and over each stream's frames after its
first 2 s: steady_p50_ms / steady_p99_ms; steady_tail_ms: the stages the slowest 1 % of those spent their time in,
against every frame's; after its first 5 s, past a camera's catching up at its connection: settled_p99_ms /
settled_tail_ms; the p99 of each 2 s slice of the streams' runs: p99_by_window), frames a batch, the batches held
for the GPU (batches_held), tracked
boxes a frame, with --network how long after the camera sent a frame it was captured (behind_camera_ms: where the
records' pts are the camera's own, as NVDEC's are; before the capture time jetpipe's latency counts from), the
process's CPU cores, the serving side's CPU per tracked object per frame (the post thread: finishing,
tracking, events; the sinks: records and JSON), in microseconds, and where in the frame interval each stream's
frames were captured (arrival_phases: streams in step hand the GPU a round's frames at once). --no-rules serves
with the CLI's defaults (no rules, so no tracker) and the jsonl sink. --py-spy DIR records each tree's first
run's stacks (py-spy record --format raw, the GIL holder's: --gil) into DIR; with --py-spy-all-threads every thread
on CPU, by thread, sampled without stopping the process (--threads --nonblocking: C work that lets the GIL go,
demuxing and decoding, is counted too, under the Python frame that called it; --native stopped the process at each
sample and broke the run).

--network serves each stream as a camera does instead of a looped file: MPEG-TS over TCP from 127.0.0.1 (the video
looped into one stream longer than the run, sent from its start to each connection, each frame's bytes at its
time), which NVDEC takes through its remux ffmpeg (`tcp://` sources, no --loop --realtime). Session 52's first
cameras sent it at its average byte rate, a keyframe's bytes spread over the frames after it; with them 70 % of
the frames were dropped, the GPU 17 % busy; paced by frames, 7 % (16 cameras, H100, session 53).
--camera-phases: the cameras' clocks, one arm each: 'connection' (a camera's frames timed from its connection,
as before: serve connects them together, so they come in step) and/or 'random' (each camera on a clock of its own,
a seeded random place in the frame interval: out of step, as free-running cameras are).
--remux-shim: where this machine's ffmpeg cannot read a socket (the GPU machines' static one),
scripts/socket_remux.py stands in for the remux ffmpeg (the same bytes to the serving process; its own CPU is not
the serving process's). --json also names the host (its CPU model and cores, its GPUs): CPU-bound figures move with
it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import shlex
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

root = Path(__file__).resolve().parents[1]
START_S = 2.0  # a stream's start, for the frames missing then (missing_at_start)
SETTLED_S = 5.0  # past every camera's catching up at its connection (frames up to ~3 s in went missing, session 64)
WINDOW_S = 2.0  # p99_by_window: the latency's p99 over each stream's frames in these slices of its run
sys.path[:0] = [str(root / "scripts"), str(root)]

from bench_events import RULES, make_video  # noqa: E402


class Cameras:
    """`count` network cameras: TCP servers on 127.0.0.1, each sending the MPEG-TS from its start to each
    connection, each frame's bytes at its time (as a camera sends a frame when it is encoded: a keyframe's bytes
    at once, not spread over the frames after it): tcp:// URLs for `serve`.

    phases: "connection": a camera's frame clock starts at each connection (serve connects its cameras together,
    so their frames come in step: all of a round's frames at once); "random": each camera's clock runs from its
    own moment, a seeded random place in the frame interval, and a connection's first frame waits for the
    camera's next tick (as free-running cameras' frames come: out of step)."""

    def __init__(self, ts: bytes, schedule: list[tuple[float, int]], count: int, phases: str = "connection",
                 fps: float = 30.0, seed: int = 0):
        """schedule: (seconds from the stream's start, the byte offset up to which it has been sent then)."""
        self.connected: list[float] = []  # time.monotonic() at each connection's start (its frames' clock)
        self.first_wall: dict[int, float] = {}  # a camera's port -> time.time() of its first connection's start
        connected, first_wall, period = self.connected, self.first_wall, 1.0 / fps
        now, draw = time.monotonic(), random.Random(seed)
        epochs = [None if phases == "connection" else now + draw.uniform(0.0, period) for _ in range(count)]

        class Camera(socketserver.BaseRequestHandler):
            def handle(self):
                started, sent, epoch = time.monotonic(), 0, self.server.epoch
                if epoch is not None:  # the camera's next tick
                    started = epoch + math.ceil((started - epoch) / period) * period
                connected.append(started)
                first_wall.setdefault(self.server.server_address[1], time.time() + started - time.monotonic())
                try:
                    for at, upto in schedule:
                        delay = started + at - time.monotonic()
                        if delay > 0:
                            time.sleep(delay)
                        self.request.sendall(ts[sent:upto])
                        sent = upto
                except OSError:  # the run ended
                    pass

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.servers = [socketserver.ThreadingTCPServer(("127.0.0.1", 0), Camera) for _ in range(count)]
        for server, epoch in zip(self.servers, epochs):
            server.epoch = epoch
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
        self.urls = [f"tcp://127.0.0.1:{s.server_address[1]}" for s in self.servers]

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


def camera_stream(video: Path, out: Path, seconds: float) -> tuple[bytes, list[tuple[float, int]]]:
    """The video looped into one MPEG-TS longer than `seconds` (+ 30 s for the start): its bytes, and when each
    frame's bytes are due (Cameras' schedule: a frame's packet sent whole at its decode time; the TS packets
    before the next frame's with it)."""
    length = float(subprocess.run(["ffprobe", "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0",
                                   str(video)], capture_output=True, text=True, check=True).stdout)
    loops = math.ceil((seconds + 30) / length)
    ts = out / "camera.ts"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-stream_loop", str(loops - 1), "-i", str(video), "-map",
                    "0:v:0", "-c", "copy", "-f", "mpegts", str(ts)], check=True)
    data = ts.read_bytes()
    frames = [(dts, pos) for _, dts, pos in camera_packets(ts) if dts is not None and pos is not None and pos >= 0]
    first = frames[0][0]
    # each frame's bytes go out whole at its time: the bytes up to where the next frame's packet starts
    schedule = [(t - first, following) for (t, _), (_, following) in zip(frames, frames[1:])]
    return data, [*schedule, (schedule[-1][0], len(data))]


def camera_packets(ts: Path) -> list[tuple[float | None, float | None, int | None]]:
    """The camera's MPEG-TS video packets, in order: (pts, dts) in seconds (None: not given) and byte position."""
    import av

    with av.open(str(ts)) as container:
        stream = container.streams.video[0]
        seconds = lambda t: None if t is None else float(t * stream.time_base)  # noqa: E731
        return [(seconds(p.pts), seconds(p.dts), p.pos) for p in container.demux(stream) if p.size]


def send_offsets(ts: Path) -> dict[float, float]:
    """Each frame of the camera's MPEG-TS by its presentation time (seconds, to the millisecond, as records give
    it): when the camera sends it, seconds after the connection (its decoding time against the first's)."""
    times = [(pts, dts) for pts, dts, _ in camera_packets(ts) if pts is not None and dts is not None]
    first = times[0][1]
    return {round(pts, 3): dts - first for pts, dts in times}


def behind_camera(seen: dict[int, list[tuple[float, float | None]]], cameras: Cameras, sent: dict[float, float],
                  seconds: float = START_S) -> dict | None:
    """How long after the camera sent a frame it was captured (the record's t_capture), in ms: the median and the
    90th percentile over every stream's frames after its first `seconds`. Before the capture time jetpipe's
    latency starts from: the remux, the demuxer and the decoder's hold."""
    ports = [int(url.rsplit(":", 1)[1]) for url in cameras.urls]
    stamped = [pts for frames in seen.values() for _, pts in frames]
    if sum(pts is not None and round(pts, 3) in sent for pts in stamped) < 0.9 * len(stamped):
        return None  # the records' pts are not the camera's (a source that counts its own clock)
    behind = []
    for stream, frames in seen.items():
        connected = cameras.first_wall.get(ports[stream])
        behind += [at - connected - sent[round(pts, 3)] for at, pts in after_start(frames, seconds)
                   if connected and pts is not None and round(pts, 3) in sent]
    if not behind:
        return None
    behind.sort()
    return {"p50": round(ranked(behind, 50) * 1e3, 1), "p90": round(ranked(behind, 90) * 1e3, 1),
            "frames": len(behind)}


def after_start(frames: list[tuple[float, object]], seconds: float = START_S) -> list[tuple[float, object]]:
    """A stream's (capture time, value) pairs after its first `seconds` from its first record."""
    start = min(at for at, _ in frames)
    return [(at, value) for at, value in frames if at - start > seconds]


def ranked(ordered: list[float], percent: int) -> float:
    """The value `percent` of the way up a sorted list (its len * percent // 100th)."""
    return ordered[len(ordered) * percent // 100]


def remux_shim(out: Path) -> dict:
    """PATH with scripts/socket_remux.py first as `ffmpeg` (the real one named in JETPIPE_REAL_FFMPEG)."""
    folder = out / "shim"
    folder.mkdir(exist_ok=True)
    shim = folder / "ffmpeg"
    script = shlex.join([sys.executable, str(root / "scripts" / "socket_remux.py")])
    shim.write_text(f'#!/bin/sh\nexec {script} "$@"\n')
    shim.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "JETPIPE_REAL_FFMPEG": shutil.which("ffmpeg")}


def serve(tree: Path, bundle: str, video: Path, args, out: Path, label: str, spy: Path | None,
          flags: tuple = (), phases: str = "connection") -> dict:
    summary, records = out / f"{label}.summary.json", out / f"{label}.jsonl"
    cameras = Cameras(*args.camera, args.streams, phases) if args.network else None
    sources = [a for url in cameras.urls for a in ("--source", url)] if cameras else [
        *(["--source", str(video)] * args.streams), "--loop", "--realtime"]
    command = [sys.executable, "-m", "jetpipe", "serve", "--bundle", bundle, *sources,
               "--duration", str(args.seconds), "--metrics", "", *(RULES if args.rules else ()),
               "--sink", f"jsonl:{records}", "--summary", str(summary), *flags]
    if spy is not None:
        which = ["--threads", "--nonblocking"] if args.py_spy_all_threads else ["--gil"]
        command = ["py-spy", "record", "--format", "raw", *which, "--rate", "100", "-o",
                   str(spy / f"{label}.txt"), "--", *command]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]),
           **args.shim_env}
    try:
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True,
                              timeout=args.seconds + args.serve_timeout)
    except subprocess.TimeoutExpired as exc:  # a hung serve (session 60) must not eat the lease: killed, said
        said = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise SystemExit(f"{label}: jetpipe serve still running {args.serve_timeout:g} s past its duration: "
                         f"killed\n{said[-3000:]}") from None
    finally:
        if cameras is not None:
            cameras.close()
    if done.returncode != 0 or not summary.exists():
        raise SystemExit(f"{label}: jetpipe serve failed ({done.returncode}):\n{done.stderr[-3000:]}")
    s = json.loads(summary.read_text())["summary"]
    frames = tracked = events = 0
    numbers: dict[int, list[tuple[float, int]]] = {}  # per stream: (capture time, frame number) of each record
    stamps: dict[int, list[tuple[float, float | None]]] = {}  # per stream: (capture time, pts) of each record
    totals: dict[int, list[tuple[float, dict]]] = {}  # per stream: (capture time, latency_ms by stage) of each record
    with records.open() as lines:
        for line in lines:
            record = json.loads(line)
            if "schema" in record:
                events += 1
                continue
            frames += 1
            numbers.setdefault(record["stream"], []).append((record["t_capture"], record["frame"]))
            stamps.setdefault(record["stream"], []).append((record["t_capture"], record["pts"]))
            totals.setdefault(record["stream"], []).append((record["t_capture"], record["latency_ms"]))
            tracked += sum(t is not None for t in record["results"].get("track_ids") or ())
    records.unlink()
    cpu = cpu_of(s)
    serving = cpu.get("post", 0.0) + cpu.get("sinks", 0.0)
    total = s["latency_ms"]["total"]
    missing = missing_at_start(numbers)
    return {"run": label, "fps": s["throughput_fps"], "dropped": sum(s["dropped"]), "frames": frames,
            "dropped_by_stream": s["dropped"],  # in the order serve opened them (the configured order)
            # of those, dropped while a stream's backlog came at once (a tree before 2026-12-07 does not say: None)
            "dropped_catching_up": sum(s["dropped_catching_up"]) if "dropped_catching_up" in s else None,
            "missing_at_start": sum(missing.values()), "missing_frame_numbers": missing,
            **({"behind_camera_ms": behind_camera(stamps, cameras, args.sent_at), "camera_phases": phases}
               if cameras else {}),
            "arrival_phases": arrival_phases(stamps),
            "p50_ms": total["0.5"], "p99_ms": total["0.99"], **steady_latency(totals),
            **settled_latency(totals), "p99_by_window": p99_by_window(totals),
            "tracked_per_frame": round(tracked / max(frames, 1), 1),
            "frames_a_batch": round(sum(s["processed"]) / max(1, s["batches"]), 2) if "batches" in s else None,
            "batches_held": s.get("batches_held"),
            "events": events, "cpu_cores": s.get("cpu_cores"), "cpu_seconds": cpu,
            "post_thread_ms_per_batch": s.get("post_thread_ms_per_batch") or [
                g.get("post_thread_ms_per_batch") for g in s.get("gpus", [])],
            "post_thread_busy_share": s.get("post_thread_busy_share") or [
                g.get("post_thread_busy_share") for g in s.get("gpus", [])],
            "gpu_busy_share": s.get("gpu_busy_share") or [g.get("gpu_busy_share") for g in s.get("gpus", [])],
            "events_cpu_s": (s.get("events") or {}).get("cpu_s"),
            "serving_us_per_object": round(serving / max(tracked, 1) * 1e6, 2),
            "process_us_per_object": round(cpu["process"] / max(tracked, 1) * 1e6, 2),
            "serving_processes": len(s.get("gpus", [])) or 1,  # workers behind the face, else this one
            "workers_said": next((line.split("workers_per_gpu auto: ", 1)[1] for line in done.stderr.splitlines()
                                  if "workers_per_gpu auto: " in line), None),
            "instances_said": next((line.split(": ", 2)[-1] for line in done.stderr.splitlines()
                                    if "model_instances auto: " in line or " model instances, " in line), None),
            "overloaded": s.get("overloaded"),
            "overload_said": next((line for line in reversed(done.stderr.splitlines()) if "overloaded:" in line), None),
            **({"reid": s["reid"]} if "reid" in s else {}),
            **({"recording": s["recording"]} if "recording" in s else {})}


def steady_latency(totals: dict[int, list[tuple[float, dict]]], seconds: float = START_S) -> dict:
    """Latency p50 / p99 (ms, from the records) of every stream's frames after its first `seconds`: the run
    without its start (the summary's cover the whole run). steady_tail_ms: where the slowest 1 % of those
    frames spent their time (the mean of each stage over the frames at or past the p99: queue = captured to
    batched, gpu = batched to collected, post = collected to the record), against every frame's."""
    after = [stages for frames in totals.values() for _, stages in after_start(frames, seconds)]
    if not after:
        return {"steady_p50_ms": None, "steady_p99_ms": None, "steady_tail_ms": None}
    ordered = sorted(stages["total"] for stages in after)
    p99 = ranked(ordered, 99)
    tail = [stages for stages in after if stages["total"] >= p99]
    return {"steady_p50_ms": round(ranked(ordered, 50), 2), "steady_p99_ms": round(p99, 2),
            "steady_tail_ms": {which: {stage: round(sum(f.get(stage, 0.0) for f in frames) / len(frames), 2)
                                       for stage in ("queue", "gpu", "post")}
                               for which, frames in (("slowest_1pct", tail), ("all", after))}}


def settled_latency(totals: dict[int, list[tuple[float, dict]]]) -> dict:
    """steady_latency's p99 and slowest 1 %'s stages over each stream's frames after its first SETTLED_S: a
    camera's catching up at its connection left behind (it reached past START_S on network cameras)."""
    settled = steady_latency(totals, SETTLED_S)
    return {"settled_p99_ms": settled["steady_p99_ms"],
            "settled_tail_ms": (settled["steady_tail_ms"] or {}).get("slowest_1pct")}


def p99_by_window(totals: dict[int, list[tuple[float, dict]]], window: float = WINDOW_S) -> list[float | None]:
    """The latency's p99 (ms) over every stream's frames in each WINDOW_S slice of its run, counted from its
    first record: where in the run the slowest frames were (a start, or all along)."""
    slices: dict[int, list[float]] = {}
    for frames in totals.values():
        start = min(at for at, _ in frames)
        for at, stages in frames:
            slices.setdefault(int((at - start) // window), []).append(stages["total"])
    if not slices:
        return []
    return [round(ranked(sorted(slices[i]), 99), 1) if i in slices else None for i in range(max(slices) + 1)]


def arrival_phases(stamps: dict[int, list[tuple[float, float | None]]], fps: float = 30.0,
                   seconds: float = START_S) -> dict:
    """Where in the frame interval each stream's frames were captured (ms: the circular mean of their capture
    times modulo the interval, after each stream's first `seconds`), and the most streams within a quarter
    interval of one another (`densest_quarter`): streams in step hand the GPU a round's frames at once (32 of 32),
    spread evenly a quarter of them (8 of 32)."""
    period, places = 1.0 / fps, []
    for frames in stamps.values():
        angles = [2 * math.pi * (at % period) / period for at, _ in after_start(frames, seconds)]
        if angles:
            mean = math.atan2(sum(map(math.sin, angles)), sum(map(math.cos, angles))) % (2 * math.pi)
            places.append(mean / (2 * math.pi) * period)
    places.sort()
    densest = max((sum((p - q) % period < period / 4 for p in places) for q in places), default=0)
    return {"ms": [round(p * 1e3, 1) for p in places], "densest_quarter": densest}


def missing_at_start(numbers: dict[int, list[tuple[float, int]]], seconds: float = START_S) -> dict[int, int]:
    """Frames with no record (dropped, or not captured) in each stream's first `seconds` from its first record
    (a camera's connection: what its opening gave at once), counted by frame number over the streams."""
    missing: dict[int, int] = {}
    for seen in numbers.values():
        first_time = min(at for at, _ in seen)
        early = {number for at, number in seen if at - first_time <= seconds}
        for number in sorted(set(range(max(early) + 1)) - early):  # numbered from 0
            missing[number] = missing.get(number, 0) + 1
    return missing


def cpu_of(summary: dict) -> dict:
    """The run's CPU seconds by part: one process's, or (behind the face: --gpus, --workers-per-gpu) every
    worker's summed, the face's own added to the process figure."""
    if "cpu_seconds" in summary:
        return summary["cpu_seconds"]
    total: dict[str, float] = {}
    for worker in summary["gpus"]:
        for part, seconds in worker.get("cpu_seconds", {}).items():
            total[part] = total.get(part, 0.0) + seconds
    total["process"] = total.get("process", 0.0) + summary["face_cpu_cores"] * summary["face_seconds"]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle")
    parser.add_argument("--video", help="a 1080p30 file (made there if it is not: words panning, with ffmpeg)")
    parser.add_argument("--words", type=int, default=200)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH of a jetpipe checkout (default: this)")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=FLAGS: more serve flags, run beside the plain run (e.g. 'colour=--reid colour')")
    parser.add_argument("--no-plain", action="store_true", help="run the variants only (not each tree's plain run)")
    parser.add_argument("--py-spy", type=Path, help="record each tree's first run's stacks here")
    parser.add_argument("--py-spy-all-threads", action="store_true",
                        help="sample every thread on CPU (py-spy without --gil): native work that lets the GIL go, "
                             "such as demuxing and decoding, is counted too")
    parser.add_argument("--network", action="store_true", help="each stream a camera: MPEG-TS over TCP, real time")
    parser.add_argument("--remux-shim", action="store_true",
                        help="with --network, where ffmpeg cannot read a socket: scripts/socket_remux.py stands in")
    parser.add_argument("--camera-phases", default="connection",
                        help="with --network, comma-separated arms: 'connection' (each camera's frames timed from "
                             "its connection: in step, as before), 'random' (each camera on its own clock, out of "
                             "step, as free-running cameras are)")
    parser.add_argument("--no-rules", dest="rules", action="store_false",
                        help="serve without the 4 rules (the CLI's defaults: no tracker either); the jsonl sink stays")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--serve-timeout", type=float, default=180.0,
                        help="seconds past --seconds after which a serve run counts as hung: killed, the bench stops")
    args = parser.parse_args()
    phases = args.camera_phases.split(",")
    if not set(phases) <= {"connection", "random"} or (phases != ["connection"] and not args.network):
        parser.error("--camera-phases takes connection and/or random (comma-separated), and only with --network")
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree] or [("this", root)]
    variants = [("", ())] * (not args.no_plain) + [
        (f"+{v.split('=', 1)[0]}", tuple(shlex.split(v.split("=", 1)[1]))) for v in args.variant]
    out = Path(tempfile.mkdtemp(prefix="bench-busy-"))
    video = Path(args.video).resolve() if args.video else out / f"words{args.words}.mp4"  # trees run in their folders
    if not video.exists():
        make_video(video, 20.0, args.words)
    args.camera = camera_stream(video, out, args.seconds) if args.network else None
    args.sent_at = send_offsets(out / "camera.ts") if args.network else None
    args.shim_env = remux_shim(out) if args.remux_shim else {}
    if args.py_spy:
        args.py_spy.mkdir(parents=True, exist_ok=True)
    rows = []
    for k in range(args.repeats):
        for (name, tree), (variant, flags), phase in itertools.product(trees, variants, phases):
            spy = args.py_spy if args.py_spy and k == 0 else None
            arm = f"{name}{variant}{f'@{phase}' if len(phases) > 1 else ''}-{k + 1}"
            row = serve(tree, args.bundle, video, args, out, arm, spy, flags, phase)
            rows.append(row)
            print(json.dumps({key: v for key, v in row.items() if key != "cpu_seconds"}), flush=True)
            time.sleep(2)
    shutil.rmtree(out, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"streams": args.streams, "seconds": args.seconds, "words": args.words,
                                         "host": host(), "rows": rows}, indent=1) + "\n")


def host() -> dict:
    """The machine's CPU (model, cores) and GPUs: the same tree's CPU-bound figures moved ~1.8x between two H100
    hosts in one day (session 59: 32 dense streams at 954 against 474-517 frames/s), so a figure names its host."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), None) if Path("/proc/cpuinfo").exists() else None
    try:
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        gpus = []
    return {"cpu": model, "cores": os.cpu_count(), "gpus": gpus}


if __name__ == "__main__":
    main()
