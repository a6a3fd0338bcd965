#!/usr/bin/env python3
"""A network camera's start (issue 66: 16 network cameras dropped frames only in their first seconds): how long
after the connection its first frame comes out of jetpipe's ffmpeg commands, how many come out faster than the
camera sends them (the frames it had held: more than a stream's queue, 4 frames by default, are dropped as if the
pipeline were overloaded), and how far behind the camera its frames are once the start is over.

A frame-paced MPEG-TS camera over TCP on 127.0.0.1 (bench_busy.py's), read two ways:
  remux:  NVDEC's feed: the remux ffmpeg (sources.ffmpeg.remux_command) demuxed by runtime.nvdec_pipe.PipeDemuxer
  decode: the FFmpeg source's ffprobe (timed apart), then its decoding ffmpeg (FFmpegSource.command), with --threads
          decoder threads (default: FFmpeg's, a thread a core, as serve gives a lone camera)
--join-at N: the camera's stream starts at its frame N (a connection between keyframes).
--without FLAG (repeatable; the remux arm alone): the remux command less that flag, to see what each one does;
--rate-frames N: PipeDemuxer's frames for the rate.

  python scripts/diag/camera_start.py VIDEO.mp4 [--join-at 47] [--repeats 3] [--threads 8]
                                      [--without -omit_video_pes_length] [--rate-frames 20]
  PYTHONPATH=OLD_TREE python scripts/diag/camera_start.py ...   # another checkout's commands (before/after)

Needs ffmpeg that reads sockets (Debian's; not the GPU machines' static one) and PyAV.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# jetpipe first, from PYTHONPATH or as installed (bench_busy puts this checkout first on the path)
from jetpipe.pipelines.ingest.sources.ffmpeg import FFmpegSource, remux_command
from jetpipe.runtime import nvdec_pipe
from jetpipe.runtime.nvdec_pipe import PipeDemuxer
from jetpipe.uri import parse

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_busy import Cameras, camera_stream  # noqa: E402

FASTER_S = 1 / 60  # a frame out sooner than this after the one before came faster than the camera sends (30/s)
FRAMES = 200  # read of each connection: past the 150 frames FFmpeg's analysis held before (5 s)
STEADY = 50  # the last of them: how far behind the camera a frame is once the start is over


class PacketData:  # PyNvVideoCodec's fields, for PipeDemuxer without a GPU
    bsl_data = bsl = pts = dts = duration = key = 0


class CodecIds:
    H264 = HEVC = "codec"


def remux(url: str, without: list[str]) -> tuple[float, list[float]]:
    """Seconds from starting the remux ffmpeg (its command less each flag in `without`, with its value) to the
    demuxer's open, and the time.monotonic() of each of its first packets."""
    argv = remux_command(parse(url))
    for flag in without:
        at = argv.index(flag)
        del argv[at:at + 2]
    started = time.monotonic()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, bufsize=0)

    class Feed:
        def fill(self, buffer) -> int:
            return process.stdout.readinto(buffer) or 0

    try:
        demuxer = PipeDemuxer(Feed(), PacketData, CodecIds)
        opened, times = time.monotonic() - started, []
        for _ in demuxer:
            times.append(time.monotonic())
            if len(times) == FRAMES:
                break
        demuxer.close()
        return opened, times
    finally:
        process.kill()
        process.wait()


def decode(url: str, threads: int | None) -> tuple[float, list[float]]:
    """Seconds from starting the decoding ffmpeg (after its source's ffprobe) to its first frame, and the
    time.monotonic() of each of its first frames."""
    source = FFmpegSource(parse(url), threads=threads)
    probing = time.monotonic()
    info = source.info = source.probe()
    print(f"decode: ffprobe {(time.monotonic() - probing) * 1e3:.0f} ms (its own connection, before)", flush=True)
    size = info.height * info.width * 3 // 2
    started = time.monotonic()
    process = subprocess.Popen(source.command(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
    times = []
    try:
        while len(times) < FRAMES:
            got = 0
            while got < size:
                chunk = process.stdout.read(size - got)
                if not chunk:
                    return float("nan"), times
                got += len(chunk)
            times.append(time.monotonic())
        return times[0] - started, times
    finally:
        process.kill()
        process.wait()


def read_camera(ts: bytes, schedule: list, read) -> tuple[float, list[float], float]:
    """A camera sending `ts` on `schedule`, read once by read(url) -> (opened, times): those two, and when the
    reading connection started (time.monotonic(); the last connection: the decode arm's ffprobe connects before)."""
    cameras = Cameras(ts, schedule, 1)
    try:
        opened, times = read(cameras.urls[0])
    finally:
        cameras.close()
    return opened, times, cameras.connected[-1]


def steady_behind(times: list[float], schedule: list, sent: float) -> list[float]:
    """Seconds from the camera's send to each of the last STEADY frames out, sorted (the frames matched to the
    camera's by their order: a camera joined at its first frame)."""
    return sorted(t - (sent + at) for t, (at, _) in list(zip(times, schedule))[-STEADY:])


def joined(ts: bytes, schedule: list, frame: int) -> tuple[bytes, list]:
    """The camera's stream from its frame `frame` on (its bytes and schedule shifted)."""
    if frame == 0:
        return ts, schedule
    offset, at = schedule[frame - 1][1], schedule[frame][0]
    return ts[offset:], [(t - at, upto - offset) for t, upto in schedule[frame:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("video", type=Path)
    parser.add_argument("--join-at", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="the decode arm's decoder threads (default: FFmpeg's)")
    parser.add_argument("--without", action="append", default=[], metavar="FLAG",
                        help="the remux arm only, its command less FLAG and its value (e.g. -analyzeduration)")
    parser.add_argument("--rate-frames", type=int, help="frames PipeDemuxer reads for the rate (default: its own)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        ts, schedule = joined(*camera_stream(args.video, Path(folder), 5.0), args.join_at)
    import jetpipe

    print(f"jetpipe from {Path(jetpipe.__file__).parent}, the camera joined at frame {args.join_at}")
    if args.rate_frames:
        nvdec_pipe.RATE_FRAMES = args.rate_frames
    arms = [("remux", lambda url: remux(url, args.without))]
    if not args.without:
        arms.append(("decode", lambda url: decode(url, args.threads)))
    for arm, read in arms:
        for _ in range(args.repeats):
            opened, times, sent = read_camera(ts, schedule, read)
            gaps = [b - a for a, b in zip(times, times[1:])]
            burst = 1 + next((i for i, gap in enumerate(gaps) if gap >= FASTER_S), len(gaps))
            said = (f"{arm}: opened {opened * 1e3:.0f} ms, first frame {(times[0] - sent) * 1e3:.0f} ms after the "
                    f"connection, the first {burst} faster than the camera sends")
            # joined between keyframes, the frames before the next keyframe never come out, so the frames cannot be
            # matched to the camera's by their order
            if args.join_at == 0:
                behind = steady_behind(times, schedule, sent)
                said += (f"; then a frame out {behind[len(behind) // 2] * 1e3:.0f} ms (median of the last {STEADY}; "
                         f"least {behind[0] * 1e3:.0f}) after the camera sent it")
            print(said, flush=True)


if __name__ == "__main__":
    main()
