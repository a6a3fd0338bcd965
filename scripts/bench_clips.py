#!/usr/bin/env python3
"""What clips cost (issue 52): `jetpipe serve` on N live 1080p30 H.264 files decoded in-process by FFmpeg
(PyAV: the path that keeps packets), with the same rules in every run, once without clips and once with
`--clips` (each stream's packets kept in a ring, an MP4 remuxed around each event), alternately, --repeats
times. Reported: the process's CPU seconds per 1,000 frames, frames dropped, clips written and their bytes.

  python scripts/bench_clips.py BUNDLE [--streams 16] [--seconds 20] [--repeats 2]
                                [--decoder ffmpeg|nvdec|ffmpeg-process] [--decode-processes N]
                                [--sources-only | --rings-only] [--video FILE] [--json OUT]

--decoder ffmpeg-process serves network cameras (MPEG-TS over TCP, real time) that an ffmpeg process decodes,
its CPU counted with serve's. --sources-only reads the sources alone (those cameras, or with --decoder nvdec the
file looped through NVDEC in this process), without the model: what keeping the packets costs beside decoding
them. --rings-only adds an arm with the rings kept but no clip cut (clips asked only for loiter events, which
these rules never give): what the rings cost apart from cutting. The summary splits the clips' own CPU the same
way (rings_s, cutting_s). --decode-processes N (with --decoder nvdec): NVDEC decodes in N processes of its own,
which send the packets to this process's rings.

The video is bench_events.py's words panning past the text detector (made with ffmpeg where --video is not
there yet), so the rules see crossings and zone visits: the clips' arm cuts clips while it runs.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root), str(root / "scripts")]

from bench_events import RULES, alternate, make_video, paired  # noqa: E402


def serve(bundle: str, video: Path, streams: int, seconds: float, clips: Path | None, out: Path,
          decoder: str = "ffmpeg", cut: bool = True, decode_processes: int = 0) -> dict:
    """The run's summary, with `children_cpu_s`: the CPU of serve and of every process it ran (its ffmpegs).
    cut=False: the rings kept, but clips only on loiter events, which these rules never give (no clip cut)."""
    summary = out / f"summary-{time.monotonic_ns()}.json"
    config = []  # cut=False: a config whose clips come only on loiter events (its bundle and source: the flags')
    if not cut:
        config = [str(out / "rings-only.toml")]
        Path(config[0]).write_text(f'[pipeline]\nbundle = {json.dumps(str(Path(bundle).resolve()))}\n'
                                   f'[[source]]\nuri = {json.dumps(str(video.resolve()))}\n[clips]\non = ["loiter"]\n')
    cameras = Cameras(video, streams) if decoder == "ffmpeg-process" else None
    sources = cameras.urls if cameras else [str(video)] * streams
    pacing = ["--realtime"] if cameras else ["--decoder", decoder, "--loop", "--realtime"]
    if decode_processes:
        pacing += ["--decode-processes", str(decode_processes)]
    command = [sys.executable, "-m", "jetpipe", "serve", *config, "--bundle", bundle,
               *[arg for url in sources for arg in ("--source", url)], *pacing, "--duration", str(seconds),
               "--metrics", "", "--tracker", "bytetrack", "--summary", str(summary), *RULES,
               *(["--clips", str(clips), "--clip-before", "3", "--clip-after", "2"] if clips else [])]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        done = subprocess.run(command, capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        if cameras:
            cameras.close()
    if done.returncode != 0:
        raise SystemExit(f"jetpipe serve failed:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {**json.loads(summary.read_text())["summary"], "children_cpu_s": cpu}


class Cameras:
    """N network cameras sending the video as MPEG-TS over TCP on loopback (the tests' camera: each client gets
    the stream from its start), read in real time (`--realtime`: ffmpeg's -re): live streams an ffmpeg process
    decodes. Runs no longer than the video: past its end the stream starts again, faster than real time."""

    def __init__(self, video: Path, count: int):
        from tests.stream_server import StreamServer

        ts = video.with_suffix(".ts")
        if not ts.exists():
            subprocess.run(["ffmpeg", "-v", "error", "-i", str(video), "-c", "copy", "-f", "mpegts", str(ts)],
                           check=True)
        self.servers = [StreamServer(ts.read_bytes()) for _ in range(count)]
        self.urls = [server.url for server in self.servers]

    def close(self) -> None:
        for server in self.servers:
            server.unplug()


def read_cameras(label: str, video: Path, streams: int, seconds: float, keep: bool) -> dict:
    """The cameras read alone (no model, nothing queued): an ffmpeg process decoding each in real time, read in
    a thread each for `seconds`, with the clips' ring fed (keep) or not. Reported: the CPU of this process and
    of the ffmpegs per 1,000 frames, and the tap's own thread time."""
    import threading

    import numpy as np

    from jetpipe import uri as uris
    from jetpipe.frames import frame_shape
    from jetpipe.pipelines.ingest.packet_ring import PacketRing
    from jetpipe.pipelines.ingest.sources import FFmpegSource

    cameras = Cameras(video, streams)
    sources = [FFmpegSource(uris.parse(url), realtime=True) for url in cameras.urls]
    for source in sources if keep else []:
        source.packet_ring = PacketRing(10.0, 64 << 20, source.uri, None)
    counts, end = [0] * streams, time.monotonic() + seconds

    def read(i: int) -> None:
        info = sources[i].open()
        slot = np.empty(frame_shape(info.format, info.height, info.width), np.uint8)
        while time.monotonic() < end:
            sources[i].read_into(slot)
            counts[i] += 1

    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    threads = [threading.Thread(target=read, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for source in sources:
        source.close()  # the ffmpegs reaped: their CPU in RUSAGE_CHILDREN
    cameras.close()
    cpu = sum(now.ru_utime + now.ru_stime - then.ru_utime - then.ru_stime for now, then in
              zip([resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)], usage))
    frames = sum(counts)
    return {"run": label, "frames": frames, "cpu_s_per_1000_frames": round(1000 * cpu / max(1, frames), 3),
            "tap_cpu_s": round(sum(s.packet_ring.cpu_s for s in sources if s.packet_ring is not None), 3)}


def read_nvdec(label: str, video: Path, streams: int, seconds: float, keep: bool) -> dict:
    """The file looped N times through NVDEC alone (no model, nothing queued), in real time, a thread each, with
    the clips' ring fed by NVDEC's demuxer (keep) or not. Reported: this process's CPU per 1,000 frames and the
    rings' own thread time (a packet's copy and its place in the ring), per packet."""
    import threading

    from jetpipe import uri as uris
    from jetpipe.pipelines.ingest.packet_ring import PacketRing
    from jetpipe.runtime.cuda import CudaDevice
    from jetpipe.runtime.nvdec import import_nvdec, open_nvdec
    from jetpipe.runtime.ring import DeviceSlot

    if import_nvdec() is None:
        raise SystemExit("--decoder nvdec --sources-only needs PyNvVideoCodec (pip install pynvvideocodec)")
    device = CudaDevice(0)
    sources = [open_nvdec(device, uris.parse(str(video)), loop=True, realtime=True) for _ in range(streams)]
    for source in sources if keep else []:
        source.packet_ring = PacketRing(10.0, 64 << 20, source.uri, None)
    counts, end = [0] * streams, time.monotonic() + seconds

    def read(i: int) -> None:
        info = sources[i].open()
        with device.active():
            memory = device.alloc(info.height * info.width * 3 // 2)
        slot = DeviceSlot(int(memory), info.height * info.width * 3 // 2, "nv12", info.height, info.width)
        while time.monotonic() < end:
            sources[i].read_into(slot)
            counts[i] += 1

    before = resource.getrusage(resource.RUSAGE_SELF)
    threads = [threading.Thread(target=read, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = resource.getrusage(resource.RUSAGE_SELF)
    rings = [s.packet_ring for s in sources if s.packet_ring is not None]
    for source in sources:
        source.close()
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    frames = sum(counts)
    ring_s = sum(ring.cpu_s for ring in rings)
    return {"run": label, "frames": frames, "cpu_s_per_1000_frames": round(1000 * cpu / max(1, frames), 3),
            "tap_cpu_s": round(ring_s, 3), "ring_us_per_frame": round(1e6 * ring_s / max(1, frames), 1) if rings
            else None}


def row(label: str, s: dict, clips: Path | None) -> dict:
    processed = sum(s["processed"])

    def share(key: str) -> float:
        return round(100 * (s.get("clips") or {}).get(key, 0.0) / max(1e-9, s["cpu_seconds"]["process"]), 2)

    written = sorted(clips.glob("*.mp4")) if clips else []
    return {"run": label, "frames_per_s": s["throughput_fps"], "dropped": sum(s["dropped"]),
            "cpu_s_per_1000_frames": round(1000 * s["cpu_seconds"]["process"] / max(1, processed), 3),
            # serve's and its decoders' (ffmpeg processes): what the ffmpeg-process path's clips cost is in both
            "cpu_s_per_1000_frames_with_decoders": round(1000 * s["children_cpu_s"] / max(1, processed), 3),
            "cpu_cores": s["cpu_cores"], "cpu_seconds": s["cpu_seconds"], "p99_ms": s["latency_ms"]["total"]["0.99"],
            "clips": s.get("clips"), "clip_mb": round(sum(p.stat().st_size for p in written) / 1e6, 1),
            # the clips' own CPU, a share of the process's: all, the rings' (sources' threads), the cutting thread's
            "clips_cpu_share_percent": share("cpu_s"), "rings_share_percent": share("rings_s"),
            "cutting_share_percent": share("cutting_s")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("--video", help="a 1080p30 H.264 file (made there if it is not)")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--decoder", default="ffmpeg", choices=("ffmpeg", "nvdec", "ffmpeg-process"),
                        help="ffmpeg: decoded in-process by PyAV (the container's packets kept); nvdec: by NVDEC in "
                             "this process (its demuxer's Annex B packets kept); ffmpeg-process: network cameras "
                             "(MPEG-TS over TCP, real time) decoded by an ffmpeg process each, which also copies "
                             "their packets to a pipe")
    parser.add_argument("--decode-processes", type=int, default=0, metavar="N",
                        help="with --decoder nvdec: decoded in N processes of their own (default 0: in this one)")
    parser.add_argument("--sources-only", action="store_true",
                        help="with --decoder ffmpeg-process or nvdec: the sources read alone, no model (what keeping "
                             "the packets costs beside decoding)")
    parser.add_argument("--rings-only", action="store_true",
                        help="a third arm: the rings kept, no clip cut (clips asked for only on loiter events, "
                             "which the rules never give): what the rings cost apart from cutting")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    if args.sources_only and args.decoder == "ffmpeg":
        parser.error("--sources-only reads --decoder nvdec or ffmpeg-process sources")
    if args.sources_only and (args.rings_only or args.decode_processes):
        parser.error("--sources-only reads the sources in this process, with their rings: it takes neither "
                     "--rings-only nor --decode-processes")
    if args.decode_processes and args.decoder != "nvdec":
        parser.error("--decode-processes is NVDEC's: add --decoder nvdec")
    out = Path(tempfile.mkdtemp(prefix="bench-clips-"))
    video = Path(args.video) if args.video else out / "words1080.mp4"
    if not video.exists():
        make_video(video, 20.0, 72)
    def run(label: str, on: bool, k: int) -> dict:
        if args.sources_only:
            read = read_nvdec if args.decoder == "nvdec" else read_cameras
            return read(label, video, args.streams, args.seconds, on)
        clips = out / f"clips-{label.replace(' ', '-').replace('#', '')}" if on else None
        return row(label, serve(args.bundle, video, args.streams, args.seconds, clips, out, args.decoder,
                                cut=on != "rings", decode_processes=args.decode_processes), clips)

    arms = [("no clips", False), ("clips", True)]
    if args.rings_only:
        arms.insert(1, ("rings", "rings"))
    rows = alternate(args.repeats, arms, run)
    if len(arms) == 3:
        print(f"process CPU per frame, rings kept (no clip cut) against none: {paired(rows, 'no clips', 'rings')[2]} %")
    off, on, difference = paired(rows, "no clips", "clips")
    if args.decoder == "ffmpeg-process" and not args.sources_only:
        total = paired(rows, "no clips", "clips", "cpu_s_per_1000_frames_with_decoders")[2]
        print(f"serve's and its ffmpegs' CPU per frame, clips against none: {total} %")
    share = [r.get("clips_cpu_share_percent") for r in rows if r["run"].startswith("clips")]
    print(f"process CPU per frame, clips against none (each pair back to back): {difference} %; mean of the arms: "
          f"{round(100 * (sum(on) - sum(off)) / sum(off), 2)} %; the clips' own share of the process's CPU: {share} %")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "difference_percent": difference,
                                               "streams": args.streams, "seconds": args.seconds}, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
