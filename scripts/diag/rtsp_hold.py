#!/usr/bin/env python3
"""How long a Jetson's RTSP pipeline holds a live camera's frames before they reach jetpipe (rtspsrc's jitter
buffer: `latency=`), measured on any machine with GStreamer (issue 66: a frame's time before the capture time is
not in the latency jetpipe reports).

One live RTSP camera (gst-rtsp-server, a shared media: every client gets the same frames; 30 frames/s of a moving
ball, x264 zerolatency, no B-frames), read at once by one gst-launch client per arm: jetpipe's own command for it
on a Jetson (sources.gstreamer.GstSource.command: its fdsink syncs a live stream to the clock), software elements
in nvv4l2decoder's and nvvidconv's places (as the tests run it), rtspsrc's `latency=` set per arm. Each decoded
frame is hashed; a frame every client got is matched by its bytes, and each arm's arrival is compared with the
earliest arm's: how much longer that arm held it.

  python scripts/diag/rtsp_hold.py [--latencies 200,0,50] [--seconds 8] [--protocols udp]

Needs gst-launch-1.0, openh264dec, x264enc and, for the camera, the system Python's PyGObject with GstRtspServer
(Debian: python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-rtsp gstreamer1.0-plugins-ugly/-bad).
"""

from __future__ import annotations

import argparse
import hashlib
import socket
import statistics
import subprocess
import threading
import time

WIDTH, HEIGHT = 320, 240
SERVER = """
import sys
import gi
gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer
Gst.init(None)
server = GstRtspServer.RTSPServer()
server.set_address("127.0.0.1")
server.set_service(sys.argv[1])
factory = GstRtspServer.RTSPMediaFactory()
factory.set_launch("( videotestsrc is-live=true pattern=ball ! video/x-raw,width=320,height=240,framerate=30/1 ! "
                   "x264enc tune=zerolatency bframes=0 key-int-max=30 ! rtph264pay name=pay0 pt=96 "
                   "config-interval=1 )")
factory.set_shared(True)
server.get_mount_points().add_factory("/live", factory)
server.attach(None)
print("ready", flush=True)
GLib.MainLoop().run()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client_command(url: str, latency: int, protocols: str | None) -> list[str]:
    """jetpipe's own gst-launch command for the camera on a Jetson (GstSource.command: a live stream's fdsink syncs
    to the clock), software elements in the hardware's places, rtspsrc's latency= the arm's."""
    from jetpipe.pipelines.ingest.sources import gstreamer
    from jetpipe.pipelines.ingest.sources.base import FrameInfo
    from jetpipe.uri import parse

    gstreamer.DECODER, gstreamer.TO_NV12 = "openh264dec", "videoconvert"
    argv = gstreamer.GstSource(parse(url), info=FrameInfo("nv12", HEIGHT, WIDTH, fps=30.0)).command()
    ours = next(k for k, token in enumerate(argv) if token.startswith("latency="))
    argv[ours] = f"latency={latency}"
    argv = [t for t in argv if not (protocols and t.startswith("protocols="))]  # the arm's, where given
    ours = argv.index(f"latency={latency}")
    return argv[:ours + 1] + ([f"protocols={protocols}"] if protocols else []) + argv[ours + 1:]


def read_frames(process: subprocess.Popen, seen: dict, stop: threading.Event) -> None:
    size = WIDTH * HEIGHT * 3 // 2
    while not stop.is_set():
        frame = process.stdout.read(size)
        if len(frame) < size:
            return
        digest = hashlib.md5(frame).digest()
        seen[digest] = None if digest in seen else time.monotonic()  # a picture seen twice matches nothing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--latencies", default="200,0,50")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--protocols", help="rtspsrc protocols= for every arm (tcp, udp; default: jetpipe's command's)")
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen(["/usr/bin/python3", "-c", SERVER, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        if server.stdout.readline().strip() != "ready":
            raise SystemExit("the RTSP camera did not start")
        url = f"rtsp://127.0.0.1:{port}/live"
        arms = [int(x) for x in args.latencies.split(",")]
        stop, clients, seen, readers = threading.Event(), [], [], []
        for latency in arms:
            process = subprocess.Popen(client_command(url, latency, args.protocols), stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL)
            clients.append(process)
            seen.append({})
            readers.append(threading.Thread(target=read_frames, args=(process, seen[-1], stop), daemon=True))
            readers[-1].start()
        time.sleep(args.seconds)
        stop.set()
        for process in clients:
            process.kill()
    finally:
        server.kill()
    common = set.intersection(*({h for h, at in s.items() if at is not None} for s in seen))
    protocols = args.protocols or next((t.split("=", 1)[1] for t in client_command(url, 0, None)
                                        if t.startswith("protocols=")), "rtspsrc's default")
    print(f"{len(common)} frames every client got (of {', '.join(str(len(s)) for s in seen)}); protocols {protocols}")
    for latency, arrivals in zip(arms, seen):
        later = sorted(arrivals[h] - min(s[h] for s in seen) for h in common)
        if later:
            print(f"latency={latency}: held {statistics.median(later) * 1e3:.0f} ms longer than the earliest arm "
                  f"(median; p90 {later[len(later) * 9 // 10] * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
