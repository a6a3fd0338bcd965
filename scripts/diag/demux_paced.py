#!/usr/bin/env python3
"""What a network camera's packet costs the thread that demuxes it for NVDEC (issue 66: 16 network cameras' sources
took twice the CPU of the same 16 as files; py-spy put the difference in the feed's pipe read under PyAV).

A frame-paced MPEG-TS camera (bench_busy.py's schedule) written by another process into a pipe, read three ways,
each in this thread, its CPU by time.thread_time():
  bare:   the pipe read alone (readinto a 64 KB buffer, as RemuxFeed.fill), a read a frame as the camera writes
  paced:  runtime.nvdec_pipe.PipeDemuxer over that pipe, as NvdecSource reads a network stream (the thread sleeps in
          the read between frames and runs PyAV's demuxing after each wake)
  memory: PipeDemuxer over the same bytes already in memory (no waits: the demuxing's own price, warm)

  python scripts/diag/demux_paced.py VIDEO.mp4 [--packets 240]

Needs ffmpeg (to make the camera's MPEG-TS) and PyAV; no GPU.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jetpipe.runtime.nvdec_pipe import READ_BYTES, PipeDemuxer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_busy import camera_stream  # noqa: E402

CAMERA = """
import sys, time
data, schedule = open(sys.argv[1], "rb").read(), [tuple(map(float, line.split())) for line in open(sys.argv[2])]
out, start, sent = sys.stdout.buffer, time.monotonic(), 0
for at, upto in schedule:
    time.sleep(max(0.0, start + at - time.monotonic()))
    out.write(data[sent:int(upto)]); out.flush(); sent = int(upto)
"""


class PacketData:  # PyNvVideoCodec's fields, for PipeDemuxer without a GPU
    bsl_data = bsl = pts = dts = duration = key = 0


class CodecIds:
    H264 = HEVC = "codec"


class PipeFeed:
    def __init__(self, process):
        self.process, self.reads = process, 0

    def fill(self, buffer) -> int:
        self.reads += 1
        return self.process.stdout.readinto(buffer) or 0


class MemoryFeed:
    def __init__(self, data: bytes):
        self.data, self.reads = io.BytesIO(data), 0

    def fill(self, buffer) -> int:
        self.reads += 1
        got = self.data.read(len(buffer))
        buffer[:len(got)] = got
        return len(got)


def camera(folder: Path, ts: bytes, schedule: list) -> subprocess.Popen:
    (folder / "camera.bin").write_bytes(ts)
    (folder / "schedule.txt").write_text("".join(f"{at} {upto}\n" for at, upto in schedule))
    return subprocess.Popen([sys.executable, "-c", CAMERA, str(folder / "camera.bin"), str(folder / "schedule.txt")],
                            stdout=subprocess.PIPE, bufsize=0)


def demuxed(feed, packets: int) -> tuple[int, float]:
    """Packets demuxed (up to `packets`, after the opening) and this thread's CPU seconds for them."""
    demuxer = PipeDemuxer(feed, PacketData, CodecIds)
    feed.reads, count, started = 0, 0, time.thread_time()
    for packet in demuxer:
        if not packet.bsl or count == packets:
            break
        count += 1
    return count, time.thread_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("video", type=Path)
    parser.add_argument("--packets", type=int, default=240)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        ts, schedule = camera_stream(args.video, folder, args.packets / 30 + 5)
        sender = camera(folder, ts, schedule)
        buffer = memoryview(bytearray(READ_BYTES))
        sender.stdout.readinto(buffer)
        reads, started = 0, time.thread_time()
        while reads < args.packets and sender.stdout.readinto(buffer):
            reads += 1
        print(f"bare:   {(time.thread_time() - started) / reads * 1e6:.0f} us of CPU a read ({reads} reads)")
        sender.kill()
        sender = camera(folder, ts, schedule)
        feed = PipeFeed(sender)
        count, cpu = demuxed(feed, args.packets)
        print(f"paced:  {cpu / count * 1e6:.0f} us of CPU a packet ({count} packets, {feed.reads} reads)")
        sender.kill()
        feed = MemoryFeed(ts)
        count, cpu = demuxed(feed, 10 ** 9)
        print(f"memory: {cpu / count * 1e6:.1f} us of CPU a packet ({count} packets, {feed.reads} reads)")


if __name__ == "__main__":
    main()
