#!/usr/bin/env python3
"""A network camera's demuxing (issue 66: 16 network cameras dropped 7 % where 16 files dropped none; py-spy put
39 % of the GIL's samples in the capture threads' `next()` on the demuxer): PyNvVideoCodec's demuxer reading a
file against one fed through a read callback from a pipe (RemuxFeed.fill's path: DecoderProcess.read_chunk),
the same MPEG-TS bytes. Per arm: the demuxing thread's CPU a packet, the callback's calls (their buffer's size,
the bytes each returned, the CPU inside them), and how far a pure-Python thread counts meanwhile (its share of
the GIL: 1.0 = as far as it counts alone).

  python scripts/diag/demux_callback.py VIDEO.mp4

Needs PyNvVideoCodec (a CUDA driver) and ffmpeg (the MPEG-TS copy made once in /tmp; none for a .ts).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from jetpipe.pipelines.ingest.sources.pipe import DecoderProcess  # noqa: E402


def counting(stop: threading.Event, seconds: list) -> list:
    """A pure-Python loop's count, run beside the demuxing (its rate against its rate alone: the GIL it got)."""
    count = [0]

    def loop():
        n, start = 0, time.perf_counter()
        while not stop.is_set():
            n += 1
        count[0], seconds[0] = n, time.perf_counter() - start

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return count, thread


PACED = ("import sys, time\n"
         "data, rate = open(sys.argv[1], 'rb').read(), float(sys.argv[2])\n"
         "out, start = sys.stdout.buffer, time.monotonic()\n"
         "for at in range(0, len(data), 16384):\n"
         "    time.sleep(max(0.0, start + at / rate - time.monotonic()))\n"
         "    out.write(data[at:at + 16384]); out.flush()\n")


def writer(ts: Path, paced: bool) -> list[str]:
    """A command writing the MPEG-TS to stdout: at once (cat), or 16 KB at a time at its bit rate (a camera's
    bytes as they come)."""
    rate = ts.stat().st_size / (LENGTH_S if paced else 1e-3)
    return [sys.executable, "-c", PACED, str(ts), str(rate)] if paced else ["cat", str(ts)]


LENGTH_S = 20.0      # the video's length (words72: 600 frames at 30 a second)
PACKETS = 150        # a paced arm demuxes this many packets (5 s of the camera)


def demux(arm: str, ts: Path, nvc) -> dict:
    calls, sizes, returned, inside = 0, [], 0, 0.0
    process = fifo = feeding = None
    paced = arm.endswith("paced")
    if arm == "file":
        demuxer = nvc.CreateDemuxer(filename=str(ts))
    elif arm.startswith("fifo"):
        fifo = Path("/tmp/demux_callback.fifo")
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo)
        feeding = subprocess.Popen(f"{shlex.join(writer(ts, paced))} > {fifo}", shell=True)
        demuxer = nvc.CreateDemuxer(filename=str(fifo))
    else:
        process = DecoderProcess(writer(ts, paced), 0, "writer")

        def fill(buffer) -> int:
            nonlocal calls, returned, inside
            start = time.thread_time()
            got = process.read_chunk(buffer)
            inside += time.thread_time() - start
            calls += 1
            sizes.append(len(buffer))
            returned += got
            return got

        demuxer = nvc.CreateDemuxer(fill)
    stop, seconds = threading.Event(), [0.0]
    count, thread = counting(stop, seconds)
    cpu, wall, packets = time.thread_time(), time.perf_counter(), 0
    for packet in demuxer:
        if packet.bsl:
            packets += 1
            if paced and packets >= PACKETS:
                break
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    stop.set()
    thread.join()
    if process is not None:
        process.kill()
        process.close()
    if feeding is not None:
        feeding.kill()
        fifo.unlink()
    return {"arm": arm, "packets": packets, "wall_s": round(wall, 3), "cpu_us_a_packet": round(1e6 * cpu / packets, 1),
            "fill_calls": calls, "fill_buffer_bytes": sorted(set(sizes))[:4], "bytes_a_call": round(returned /
            max(calls, 1)), "cpu_in_fill_us_a_packet": round(1e6 * inside / packets, 1),
            "cpu_us_a_call": round(1e6 * cpu / max(calls, 1)), "counter_rate": count[0] / max(seconds[0], 1e-9)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("video", type=Path)
    args = parser.parse_args()
    import PyNvVideoCodec as nvc
    ts = args.video if args.video.suffix == ".ts" else Path("/tmp") / f"{args.video.stem}.ts"
    if not ts.exists():
        subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(args.video), "-c", "copy", "-f", "mpegts",
                        str(ts)], check=True)
    stop, seconds = threading.Event(), [0.0]
    count, thread = counting(stop, seconds)
    time.sleep(2)
    stop.set()
    thread.join()
    alone = count[0] / seconds[0]
    packet = nvc.PacketData()
    print("PacketData:", [n for n in dir(packet) if not n.startswith("__")], flush=True)
    for arm in ("file", "callback", "callback paced", "fifo paced", "file", "callback", "callback paced"):
        row = demux(arm, ts, nvc)
        row["gil_share_left"] = round(row.pop("counter_rate") / alone, 3)
        print(row, flush=True)


if __name__ == "__main__":
    main()
