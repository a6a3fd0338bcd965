"""The RTSP server of an rtsp:// sink: GStreamer's gst-rtsp-server, in a process of its own.

Run by sinks/rtsp.py with a Python that has PyGObject (Debian: python3-gi, gir1.2-gst-rtsp-server-1.0), which
the project's own Python may not: it imports nothing but the standard library and GStreamer.

    python3 rtsp_server.py HOST PORT ENCODER_PIPELINE PATH_TEMPLATE STREAM...

It reads frames on standard input (HEADER, then width x height x 3 bytes of BGR; kind END: the stream ended) and
serves each stream at PATH_TEMPLATE with {stream} replaced, H.264 from ENCODER_PIPELINE (a GStreamer fragment
taking I420: x264enc, nvh264enc, nvv4l2h264enc ...), one encoder a stream however many clients watch (a shared
media), none while nobody watches. A client that stalls never holds up the reader: the stream's appsrc drops
its oldest frame. It writes lines on standard output: "ready" once listening ("error ..." and exit 1 where it
cannot), "watching STREAM 1|0" as a stream's first client comes and its last goes. With JETPIPE_RTSP_USER and
JETPIPE_RTSP_PASSWORD in its environment (never on the command line, which others can read) every client must
give them (HTTP basic authentication, as RTSP has it). It ends when its standard input does.
"""

import os
import struct
import sys
import threading

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

HEADER = struct.Struct("<4sIIIII")  # magic, kind, stream, width, height, bytes that follow
MAGIC, FRAME, END = b"JPF1", 0, 1
ROLE = "viewer"
END_S = 1.0  # at the end of the input, the clients get this long for the last frames
QUEUE_FRAMES = 15  # a stream's frames waiting for its encoder: at most half a second's at 30 fps ...
QUEUE_BYTES = 64 << 20  # ... and 64 MiB (ten 1080p frames, two at 4K)


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Mount:
    """One stream's path: a shared media whose appsrc takes the frames while anybody watches."""

    def __init__(self, stream: int, encode: str, permissions):
        self.stream, self.caps, self.sources = stream, None, []
        self.lock = threading.Lock()
        self.factory = GstRtspServer.RTSPMediaFactory()
        self.factory.set_shared(True)  # every client of the path gets the same encoder's output
        # leaky appsrc: a stalled pipeline (a slow client) drops the oldest frames, never blocks the reader. Its
        # queue is bounded in frames and bytes both: appsrc's default 200 kB held less than one frame, so any pause
        # of the encoder's thread longer than a frame's interval cost frames
        self.factory.set_launch(
            f"( appsrc name=src is-live=true format=time do-timestamp=true block=false max-buffers={QUEUE_FRAMES} "
            f"max-bytes={QUEUE_BYTES} leaky-type=downstream ! videoconvert ! video/x-raw,format=I420 ! {encode} ! "
            "h264parse ! rtph264pay name=pay0 pt=96 config-interval=1 )")
        if permissions is not None:
            self.factory.set_permissions(permissions)
        self.factory.connect("media-configure", self.configure)

    def configure(self, factory, media) -> None:
        source = media.get_element().get_child_by_name("src")
        with self.lock:
            if self.caps is not None:
                source.set_property("caps", self.caps)
            self.sources.append(source)
            first = len(self.sources) == 1
        media.connect("unprepared", self.unprepared, source)
        if first:
            say(f"watching {self.stream} 1")

    def unprepared(self, media, source) -> None:
        with self.lock:
            if source in self.sources:
                self.sources.remove(source)
            last = not self.sources
        if last:
            say(f"watching {self.stream} 0")

    def end(self) -> None:
        with self.lock:
            sources = list(self.sources)
        for source in sources:
            source.emit("end-of-stream")

    def push(self, width: int, height: int, data: bytes) -> None:
        caps = Gst.Caps.from_string(f"video/x-raw,format=BGR,width={width},height={height},framerate=0/1")
        with self.lock:
            if self.caps is None or not self.caps.is_equal(caps):
                self.caps = caps
                for source in self.sources:
                    source.set_property("caps", caps)
            sources = list(self.sources)
        for source in sources:
            source.emit("push-buffer", Gst.Buffer.new_wrapped(data))


def authorize(server):
    """Basic authentication from the environment, and the role every path then asks for; None without it."""
    user, password = os.environ.get("JETPIPE_RTSP_USER"), os.environ.get("JETPIPE_RTSP_PASSWORD")
    if not user:
        return None
    auth = GstRtspServer.RTSPAuth()
    token = GstRtspServer.RTSPToken()
    token.set_string("media.factory.role", ROLE)
    auth.add_basic(GstRtspServer.RTSPAuth.make_basic(user, password or ""), token)
    server.set_auth(auth)
    permissions = GstRtspServer.RTSPPermissions()
    permissions.add_permission_for_role(ROLE, "media.factory.access", True)
    permissions.add_permission_for_role(ROLE, "media.factory.construct", True)
    return permissions


def read_frames(mounts: dict, add, remove) -> None:
    source = sys.stdin.buffer
    while True:
        header = source.read(HEADER.size)
        if len(header) < HEADER.size:
            return
        magic, kind, stream, width, height, size = HEADER.unpack(header)
        if magic != MAGIC:
            say("error: a frame's header is not one jetpipe writes")
            return
        data = source.read(size) if size else b""
        if len(data) < size:
            return
        if kind == END:
            remove(stream)
            continue
        mount = mounts.get(stream) or add(stream)
        mount.push(width, height, data)


def main(host: str, port: str, encode: str, template: str, streams: list[str]) -> None:
    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address(host)
    server.set_service(port)
    permissions = authorize(server)
    points, mounts = server.get_mount_points(), {}

    def add(stream: int) -> Mount:
        mounts[stream] = mount = Mount(stream, encode, permissions)
        points.add_factory(template.replace("{stream}", str(stream)), mount.factory)
        return mount

    def remove(stream: int) -> None:
        if mounts.pop(stream, None) is not None:
            points.remove_factory(template.replace("{stream}", str(stream)))

    for stream in streams:  # the paths of the streams known at start: a client may connect before a frame
        add(int(stream))
    if server.attach(None) == 0:
        say(f"error: cannot listen on {host}:{port} (in use, or an address this machine does not have)")
        sys.exit(1)
    say("ready")
    loop = GLib.MainLoop()

    def serve_frames() -> None:
        try:
            read_frames(mounts, add, remove)
        finally:  # the last frames through the encoders to the clients, then the end
            for mount in list(mounts.values()):
                mount.end()
            GLib.timeout_add(int(1000 * END_S), loop.quit)

    threading.Thread(target=serve_frames, daemon=True).start()
    loop.run()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
