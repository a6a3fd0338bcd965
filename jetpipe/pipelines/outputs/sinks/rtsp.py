"""`rtsp://HOST:PORT/PATH`: the frames, results drawn, served as a live H.264 stream any RTSP client or NVR can
open (ffplay, VLC, Frigate, an NVR's "add camera").

The server is GStreamer's gst-rtsp-server (rtsp_server.py, in a process of its own: PyGObject comes from the
system's packages, not from this Python's). With several streams a path gets `-s{stream}` unless it holds
`{stream}` itself; HOST:PORT is where it listens (127.0.0.1: this machine only; 0.0.0.0: every network it is on).
`rtsp://USER@HOST:PORT/PATH?password_env=NAME` makes every client give USER and the password that environment
variable holds (`rtsp://USER:PASSWORD@...` too, but a password in the URI shows in `ps`). A host beyond
loopback without a password is refused unless `?public=1` says it is meant (then said loudly). Options:
`?draw=0` the frames as they came (no results drawn), `?width=W` scaled, `?fps=N` at most N frames a second a
stream (default 30), `?encoder=` a GStreamer H.264 encoder element (auto: the Jetson's nvv4l2h264enc, NVENC's
nvh264enc where GStreamer has it, else x264enc; said in the log).

Nothing is drawn or encoded for a stream nobody watches (the server says when its first client comes, and its
last goes), but its first frame, which gives the path its size. Frames are drawn in this sink's threads and
written to the server's pipe; a server or client that falls behind costs dropped frames here (counted), never
the pipeline's time: a file's frames never wait for this sink.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import unquote, urlparse

from jetpipe.errors import JetpipeError
from jetpipe.frames import frame_size
from jetpipe.pipelines.ingest.sources import gstreamer
from jetpipe.pipelines.outputs import annotate
from jetpipe.pipelines.outputs.sinks import encoders
from jetpipe.pipelines.outputs.sinks.base import port_of, sink_options
from jetpipe.pipelines.outputs.sinks.frames import FrameSink, positive_option
from jetpipe.uri import is_loopback_host

log = logging.getLogger(__name__)

SERVER = Path(__file__).with_name("rtsp_server.py")
HEADER_FORMAT = "<4sIIIII"  # rtsp_server.HEADER: magic, kind, stream, width, height, bytes
PYTHONS = (sys.executable, "/usr/bin/python3")  # the first with PyGObject's GstRtspServer runs the server
READY_TIMEOUT_S = 15.0
PATH_CHARS = re.compile(r"[A-Za-z0-9._~{}/-]+")
ENCODERS = {  # element -> the fragment that encodes I420 with it (a keyframe a second at 30 fps)
    "nvv4l2h264enc": "nvvidconv ! video/x-raw(memory:NVMM),format=NV12 ! nvv4l2h264enc iframeinterval=30 "
                     "insert-sps-pps=true",
    "nvh264enc": "nvh264enc zerolatency=true gop-size=30",
    "x264enc": "x264enc tune=zerolatency speed-preset=veryfast key-int-max=30",
}
INSTALL = ("apt install python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base gstreamer1.0-plugins-good "
           "gstreamer1.0-plugins-bad gstreamer1.0-plugins-ugly")
_PORTS: dict[tuple[str, int], str] = {}  # (host, port) -> the sink serving there, in this process
_END, _FRAME = 1, 0


def parse(spec: str) -> dict:
    """Where it listens, its path template and options, checked without starting anything."""
    path, options = sink_options(spec, ("draw", "width", "fps", "encoder", "public", "password_env"))
    parsed = urlparse(spec.split("?", 1)[0])
    host, port = parsed.hostname, port_of(parsed, spec, 8554)
    mount = parsed.path
    if not host or not mount or mount == "/" or not PATH_CHARS.fullmatch(mount):
        raise JetpipeError(f"sink {spec}: name where it listens and a path, e.g. rtsp://127.0.0.1:8554/cam "
                           "(letters, digits, . _ ~ - / and {stream})")
    if options.get("draw", "1") not in ("0", "1"):
        raise JetpipeError(f"sink {spec}: draw={options['draw']!r}: 1 (results drawn, the default) or 0")
    encoder = options.get("encoder", "auto")
    if encoder != "auto" and encoder not in ENCODERS:
        raise JetpipeError(f"sink {spec}: encoder {encoder!r}: choose auto, {', '.join(ENCODERS)}")
    user, password = unquote(parsed.username or ""), _password(spec, parsed, options)
    if options.get("public", "0") not in ("0", "1"):
        raise JetpipeError(f"sink {_without_password(spec)}: public={options['public']!r}: 1 (serve beyond this "
                           "machine without a password, on purpose) or 0")
    public = options.get("public", "0") == "1"
    if not password and not public and not is_loopback_host(host):
        raise JetpipeError(f"sink {_without_password(spec)}: {host} serves every client of its networks without a "
                           "password: give one (rtsp://USER@HOST:PORT/PATH?password_env=NAME), listen on 127.0.0.1, "
                           "or add ?public=1 if that is meant")
    return {"host": host, "port": port, "path": mount, "draw": options.get("draw", "1") == "1",
            "encoder": encoder, "user": user, "password": password, "public": public and not password,
            "options": options}


def _password(spec: str, parsed, options: dict) -> str:
    """The clients' password: from ?password_env=NAME (kept out of process lists) or the URI; with a user."""
    name = options.get("password_env")
    shown = _without_password(spec)
    if name is None:
        password = unquote(parsed.password or "")
    elif parsed.password:
        raise JetpipeError(f"sink {shown}: a password in the URI and password_env={name}: give one (password_env)")
    elif not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or not os.environ.get(name):
        raise JetpipeError(f"sink {shown}: password_env={name!r}: that environment variable is not set (or is "
                           "empty): export it with the password the clients give")
    else:
        password = os.environ[name]
    if password and not parsed.username:
        raise JetpipeError(f"sink {shown}: a password needs a user: rtsp://USER@HOST:PORT/PATH?password_env=NAME")
    return password


class RtspSink(FrameSink):
    def __init__(self, spec: str, streams: int, max_batch: int = 8):
        where = parse(spec)
        shown = _without_password(spec)
        self.host, self.port, self.draw = where["host"], where["port"], where["draw"]
        self.width = positive_option(shown, where["options"], "width")
        fps = positive_option(shown, where["options"], "fps", float, 30.0)
        template = where["path"]
        if "{stream}" not in template and streams > 1:
            template = f"{template}-s{{stream}}"
        self.template = template
        taken = _PORTS.get((self.host, self.port))
        if taken is not None:
            raise JetpipeError(f"sink {shown}: {self.host}:{self.port} is served by sink {taken} already: one rtsp "
                               "sink a port (each of its streams gets a path of its own)")
        self.element = _encoder(shown, where["encoder"])
        self.watched: set[int] = set()
        self.first: set[int] = set()  # streams whose first frame (the path's size) was written
        self.pipe_lock = threading.Lock()
        super().__init__(shown, max_batch, max_fps=fps)
        self.server = self._start(shown, where, streams)
        _PORTS[(self.host, self.port)] = shown
        self.url = f"rtsp://{self.host}:{self.port}{template}"
        log.info("sink %s: serving %s (H.264 by %s)", shown, self.url, self.element)
        if where["public"]:
            log.warning("sink %s: serving %s to every client that reaches %s:%d, without a password (?public=1)",
                        shown, self.url, self.host, self.port)

    def _start(self, shown: str, where: dict, streams: int) -> subprocess.Popen:
        python = _gi_python(shown)
        env = {**os.environ, "JETPIPE_RTSP_USER": where["user"], "JETPIPE_RTSP_PASSWORD": where["password"]}
        server = subprocess.Popen([python, str(SERVER), self.host, str(self.port), ENCODERS[self.element],
                                   self.template, *map(str, range(streams))], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        ready = _first_line(server, READY_TIMEOUT_S)
        if ready != "ready":
            server.kill()
            why = ready.removeprefix("error: ") if ready else (server.stderr.read().decode(errors="replace").strip()
                                                               .splitlines() or ["it did not start"])[-1]
            raise JetpipeError(f"sink {shown}: the RTSP server cannot serve: {why}")
        threading.Thread(target=self._listen, args=(server,), name="rtsp-clients", daemon=True).start()
        return server

    def _listen(self, server: subprocess.Popen) -> None:
        """The server's lines: which streams someone watches."""
        for raw in server.stdout:
            words = raw.decode(errors="replace").split()
            if len(words) == 3 and words[0] == "watching":
                stream, on = int(words[1]), words[2] == "1"
                (self.watched.add if on else self.watched.discard)(stream)
                log.info("sink %s: stream %d %s", self.spec, stream, "watched" if on else "no longer watched")

    def wants(self, record) -> bool:
        """A stream's frames while someone watches it, and its first (the path's size)."""
        return record.stream in self.watched or record.stream not in self.first

    def offer(self, stream: int, frame, record, to_host=None, wait: bool = False) -> bool:
        return super().offer(stream, frame, record, to_host, wait=False)  # a viewer never holds up a file

    def consume(self, stream, frame, fmt, record) -> None:
        if self.draw:
            image = annotate.render(frame, fmt, record.detections, self.width, record.scene)
        else:
            image = annotate.to_bgr(frame, fmt, annotate.output_size(frame_size(frame, fmt), self.width))
        self._write(_FRAME, stream, image.shape[1], image.shape[0], image.data)
        self.first.add(stream)

    def finish_stream(self, stream: int) -> None:
        self._write(_END, stream, 0, 0, b"")
        self.first.discard(stream)

    def _write(self, kind: int, stream: int, width: int, height: int, data) -> None:
        header = struct.pack(HEADER_FORMAT, b"JPF1", kind, stream, width, height, len(memoryview(data).cast("B")))
        with self.pipe_lock:  # one stream's frame whole before another's
            self.server.stdin.write(header)
            self.server.stdin.write(data)
            self.server.stdin.flush()

    def finish(self) -> None:
        _PORTS.pop((self.host, self.port), None)
        try:
            self.server.stdin.close()  # the server ends with its input
            self.server.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.server.kill()
            self.server.wait()


def _without_password(spec: str) -> str:
    """The URI as logs and summaries show it: its password never."""
    return re.sub(r"(rtsp://[^:/@]+):[^@]*@", r"\1:***@", spec)


def _encoder(spec: str, requested: str) -> str:
    missing = gstreamer.tools_available()
    if missing:
        raise JetpipeError(f"sink {spec}: serving RTSP needs GStreamer: {missing}")
    if requested != "auto":
        candidates = [requested]
    elif gstreamer.is_jetson():
        candidates = ["nvv4l2h264enc"]
    else:  # nvh264enc: GStreamer registers it only where the GPU has NVENC
        candidates = ["nvh264enc", "x264enc"]
    for element in candidates:
        if encoders.gst_has(element):
            return element
    raise JetpipeError(f"sink {spec}: GStreamer has no {' or '.join(candidates)} here: {INSTALL}")


def _gi_python(spec: str) -> str:
    check = "import gi; gi.require_version('Gst', '1.0'); gi.require_version('GstRtspServer', '1.0')"
    for python in PYTHONS:
        if python and Path(python).exists() and subprocess.run([python, "-c", check],
                                                              capture_output=True).returncode == 0:
            return python
    raise JetpipeError(f"sink {spec}: serving RTSP needs gst-rtsp-server through PyGObject: {INSTALL}")


def _first_line(process: subprocess.Popen, timeout_s: float) -> str:
    """The process's first line of output ("" where it ended or said nothing in time)."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(process.stdout.readline().decode(errors="replace").strip()),
                              daemon=True)
    reader.start()
    reader.join(timeout_s)
    return got[0] if got else ""
