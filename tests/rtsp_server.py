"""A real RTSP server for the tests: GStreamer's gst-rtsp-server serving an H.264 file at its own pace.

Run with a Python that has PyGObject and GstRtspServer (Debian: python3-gi, gir1.2-gst-rtsp-server-1.0,
gstreamer1.0-plugins-good/-bad): `python3 rtsp_server.py CLIP.mp4 PORT` serves rtsp://127.0.0.1:PORT/live,
prints "ready" once listening, and serves until killed. Each client gets the clip from its start.
"""

import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402


def main(clip: str, port: str) -> None:
    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(port)
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(f'( filesrc location="{clip}" ! qtdemux ! h264parse ! rtph264pay name=pay0 pt=96 '
                       "config-interval=1 )")
    server.get_mount_points().add_factory("/live", factory)
    if server.attach(None) == 0:
        sys.exit(f"cannot listen on 127.0.0.1:{port}")
    print("ready", flush=True)
    GLib.MainLoop().run()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
