#!/usr/bin/env python3
"""What a network camera's feed holds when serving starts (issue 66: the frames dropped in the cameras' first 2 s).

  python scripts/diag/open_backlog.py VIDEO [--cameras 32] [--one-after-another] [--nvdec] [--remux-shim]

N frame-paced MPEG-TS cameras over TCP (bench_busy.py's, each on a clock of its own) are opened as `serve` opens
NVDEC cameras, each in its own capture thread, all at once (--one-after-another: in turn, for contrast): the remux
ffmpeg started (sources.ffmpeg.RemuxFeed), the MPEG-TS demuxed by PyAV (runtime.nvdec_pipe.PipeDemuxer, with
stand-ins for PyNvVideoCodec's packet and codec types: no GPU, so no decoder is made) up to the first packet. Then
each feed is read as serving would: the packets that come out at once (within 5 ms of the one before) are the
backlog its connection gathered before it was read; each frame of it is a frame the stream's queue (4 deep) drops
or runs late. Reported: each camera's open time and backlog in frames, and the longest the main thread waited for
the GIL meanwhile (a thread that sleeps 1 ms at a time: `stall_ms`).

--nvdec (a GPU machine): each camera opened as NvdecSource opens it (runtime.nvdec.open_nvdec with the remux feed:
the decoder made and the first frame decoded), the backlog counted in frames decoded at once. --remux-shim: where
ffmpeg cannot read a socket (the GPU machines' static one), scripts/socket_remux.py stands in (bench_busy.py's).
With --nvdec each camera's line says where its open went (ms): demux (the feed started, demuxed to its first
packet), create (CreateDecoder), first_frame (decoded: the driver's decoder is made at the first sequence header);
--decoder-first makes each camera's decoder before its feed starts (create_first), as a fix would.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

root = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(root / "scripts"), str(root)]

from bench_busy import Cameras, camera_stream, remux_shim  # noqa: E402

from jetpipe import uri as uris  # noqa: E402
from jetpipe.pipelines.ingest.sources.ffmpeg import RemuxFeed  # noqa: E402
from jetpipe.runtime.nvdec_pipe import PipeDemuxer  # noqa: E402

AT_ONCE_S = 0.005


class Packet(SimpleNamespace):  # PyNvVideoCodec's PacketData: fields set by the demuxer
    pass


def open_camera(url: str):
    """A camera's feed and demuxer up to its first packet (NvdecSource._start before its decoder): the packets'
    iterator, the seconds it took."""
    start = time.monotonic()
    feed = RemuxFeed(uris.parse(url))
    feed.start()
    demuxer = PipeDemuxer(feed, Packet, SimpleNamespace(h264="h264", hevc="hevc"))
    packets = iter(demuxer)
    next(packets)
    return feed, demuxer, packets, time.monotonic() - start


def at_once(step) -> int:
    """How many step() calls, from now, each return within AT_ONCE_S of the one before (step() False: the end)."""
    count, last = 0, time.monotonic()
    while step():
        now = time.monotonic()
        if now - last > AT_ONCE_S:
            break
        count, last = count + 1, now
    return count


def backlog(packets) -> int:
    """Packets that come out at once, now (an empty one: the feed's end)."""
    return at_once(lambda: next(packets).bsl != 0)


def open_and_read(url: str):
    """A camera opened, then read at once, as its capture thread does: its feed, demuxer, open time, backlog."""
    feed, demuxer, packets, took = open_camera(url)
    return feed, demuxer, took, backlog(packets)


class Phases:
    """Where each NVDEC open's time went, per camera thread: the feed started and demuxed to its first packet,
    PyNvVideoCodec's CreateDecoder, and the first frame decoded (where the driver's decoder is made: at the
    stream's first sequence header). --decoder-first: CreateDecoder called before the feed starts, its decoder
    the one the source's open asks for (H.264 assumed: the cameras' codec)."""

    def __init__(self, nvc, device, decoder_first: bool):
        self.nvc, self.device, self.decoder_first = nvc, device, decoder_first
        self.create = nvc.CreateDecoder
        self.local = threading.local()
        nvc.CreateDecoder = self._create

    def _create(self, **kwargs):
        made = getattr(self.local, "made", None)
        if made is not None:
            self.local.made = None
            return made
        start = time.monotonic()
        try:
            return self.create(**kwargs)
        finally:
            self.local.times["create"] = time.monotonic() - start

    def begin(self) -> dict:
        """This thread's times; with --decoder-first, its decoder made now."""
        self.local.times = times = {}
        self.local.made = None
        if self.decoder_first:
            from jetpipe.runtime.nvdec import display_latency

            start = time.monotonic()
            with self.device.active():
                stream = self.device.stream()
                self.local.made = self.create(gpuid=self.device.ordinal, codec=self.nvc.cudaVideoCodec.H264,
                                              cudacontext=self.device.context.handle, cudastream=stream.handle,
                                              usedevicememory=True, **display_latency(self.nvc, True))
            times["create_first"] = time.monotonic() - start
        return times

    def timed(self, source, name: str, key: str, first_only: bool = False) -> None:
        call, times = getattr(source, name), self.local.times

        def wrapper(*args, **kwargs):
            start = time.monotonic()
            try:
                return call(*args, **kwargs)
            finally:
                if not (first_only and key in times):
                    times[key] = time.monotonic() - start

        setattr(source, name, wrapper)


def nvdec_open_and_read(device, phases: Phases, url: str):
    """The same through NVDEC: NvdecSource opened (its decoder made, its first frame decoded), then the frames it
    decodes at once (its read loop's decode, without the copy into a ring)."""
    from jetpipe.runtime.nvdec import open_nvdec

    uri = uris.parse(url)
    start = time.monotonic()
    times = phases.begin()
    source = open_nvdec(device, uri, feed=RemuxFeed(uri))
    phases.timed(source, "_demux", "demux")
    phases.timed(source, "_next_frame", "first_frame", first_only=True)
    source.open()
    took = time.monotonic() - start
    source.phases = dict(times)
    return source, None, took, at_once(lambda: source._next_frame() is not None)  # noqa: SLF001 (the decode alone)


class Heartbeat:
    """A thread that sleeps 1 ms at a time: the longest it waited beyond that (the GIL held elsewhere)."""

    def __init__(self):
        self.longest, self.running = 0.0, True
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        last = time.monotonic()
        while self.running:
            time.sleep(0.001)
            now = time.monotonic()
            self.longest, last = max(self.longest, now - last - 0.001), now

    def stop(self) -> float:
        self.running = False
        self.thread.join()
        return self.longest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("video", type=Path)
    parser.add_argument("--cameras", type=int, default=32)
    parser.add_argument("--one-after-another", dest="parallel", action="store_false")
    parser.add_argument("--nvdec", action="store_true", help="open each as NvdecSource does (a GPU machine)")
    parser.add_argument("--decoder-first", action="store_true",
                        help="--nvdec: each camera's decoder made before its feed starts")
    parser.add_argument("--remux-shim", action="store_true", help="scripts/socket_remux.py as the remux ffmpeg")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.remux_shim:
            os.environ.update(remux_shim(Path(tmp)))
        cameras = Cameras(*camera_stream(args.video, Path(tmp), 30.0), args.cameras, "random")
        opener = open_and_read
        if args.nvdec:
            from jetpipe.runtime.cuda import CudaDevice
            from jetpipe.runtime.nvdec import import_nvdec

            device = CudaDevice(0)
            opener = functools.partial(nvdec_open_and_read, device, Phases(import_nvdec(), device,
                                                                           args.decoder_first))
        heartbeat = Heartbeat()
        started = time.monotonic()
        if args.parallel:
            with ThreadPoolExecutor(args.cameras) as pool:
                opened = list(pool.map(opener, cameras.urls))
        else:  # opened in turn, then read together
            first = [open_camera(url) for url in cameras.urls]
            with ThreadPoolExecutor(args.cameras) as pool:
                counts = list(pool.map(backlog, [packets for _, _, packets, _ in first]))
            opened = [(feed, demuxer, took, count) for (feed, demuxer, _, took), count in zip(first, counts)]
        stall = heartbeat.stop()
        print(f"{args.cameras} cameras opened and read in {time.monotonic() - started:.2f} s "
              f"({'at once' if args.parallel else 'opened one after another'}{', NVDEC' if args.nvdec else ''}); "
              f"stall_ms {stall * 1e3:.0f}")
        for k, (feed, demuxer, took, count) in enumerate(opened):
            times = getattr(feed, "phases", None)
            said = "".join(f", {key} {value * 1e3:4.0f}" for key, value in (times or {}).items())
            print(f"camera {k:2d}: opened in {took * 1e3:4.0f} ms, {count:3d} frames at once when read{said}")
            if demuxer is not None:
                demuxer.close()
                feed.interrupt()
            else:
                feed.close()  # the NvdecSource (its feed's ffmpeg with it)
        counts = [count for *_, count in opened]
        print(f"backlog: {sum(counts)} frames in all, {sum(c > 4 for c in counts)} cameras over a queue of 4")
        cameras.close()


if __name__ == "__main__":
    main()
