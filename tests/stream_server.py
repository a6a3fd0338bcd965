"""A network camera for the tests: MPEG-TS bytes served over TCP on 127.0.0.1, read as a `tcp://` URI.

Each client gets the file from its start, over and over (once=True: one pass, then the connection closes
and the stream ends for the client), in 16 KB pieces 2 ms apart (or, given its length, in real time).
hang=True accepts connections and never sends a byte (a camera whose connect hangs). unplug() takes the
camera away; a new server on the same port brings it back.
"""

from __future__ import annotations

import socketserver
import threading
import time
from pathlib import Path

CHUNK = 16384


class StreamServer:
    def __init__(self, ts_bytes: bytes = b"", port: int = 0, once: bool = False, hang: bool = False,
                 stall_after: int = 0, stall_connection: int = 1, seconds: float = 0.0):
        """stall_after: connection number `stall_connection` (1: the first) gets that many bytes, then nothing
        more on a connection left open (a camera that stops sending); the others get the stream as usual.
        seconds: the stream's length: its bytes are sent in real time (evenly over it) rather than at once."""
        data = ts_bytes
        connections = iter(range(1, 1 << 30))

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                stall = stall_after and next(connections) == stall_connection
                try:
                    while not server.closing:
                        if hang:
                            time.sleep(0.05)
                            continue
                        started = time.monotonic()
                        for at in range(0, len(data), CHUNK):
                            if stall and at >= stall_after:
                                while not server.closing:  # silent, but connected
                                    time.sleep(0.05)
                                return
                            # in real time, a piece goes once its last byte is due (never ahead of its time)
                            end = min(at + CHUNK, len(data))
                            time.sleep(max(0.0, started + end * seconds / len(data) - time.monotonic()))
                            self.request.sendall(data[at:end])
                            time.sleep(0.002)
                        if once:
                            return
                except OSError:
                    pass

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        server = socketserver.ThreadingTCPServer(("127.0.0.1", port), Handler)
        server.daemon_threads, server.closing = True, False
        self.server, self.port = server, server.server_address[1]
        self.url = f"tcp://127.0.0.1:{self.port}"
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def unplug(self) -> None:
        self.server.closing = True
        self.server.shutdown()
        self.server.server_close()


def frame_offset(ts: Path, frame: int) -> int:
    """Where the `frame`-th video frame's packet starts in an MPEG-TS file (StreamServer's stall_after: a camera
    that sends the frames before it, then nothing)."""
    import av

    with av.open(str(ts)) as container:
        starts = [p.pos for p in container.demux(container.streams.video[0]) if p.size]
    return starts[frame]


# The static ffmpeg on the GPU machines dies (SIGSEGV) on socket input: there the remux command is run by
# scripts/socket_remux.py, which copies the socket's bytes to its pipe, and to the recording's copy where it has one
# (the test streams are MPEG-TS already). The remux itself runs in the CPU tests, with Debian's ffmpeg.
SOCKET_REMUX = Path(__file__).resolve().parents[1] / "scripts" / "socket_remux.py"


def remux_or_stand_in(monkeypatch, ts_bytes: bytes) -> str:
    """"ffmpeg" where this machine's remux command reads a socket, else "socket copy" (remux_command's argv run by
    scripts/socket_remux.py)."""
    import subprocess
    import sys

    from jetpipe import uri as uris
    from jetpipe.pipelines.ingest.sources import ffmpeg

    server = StreamServer(ts_bytes, once=True)
    trial = subprocess.run(ffmpeg.remux_command(uris.parse(server.url)), capture_output=True, timeout=30)
    server.unplug()
    if trial.returncode == 0 and trial.stdout:
        return "ffmpeg"
    remux = ffmpeg.remux_command
    monkeypatch.setattr(ffmpeg, "remux_command",
                        lambda uri, copy_fd=None: [sys.executable, str(SOCKET_REMUX), *remux(uri, copy_fd)[1:]])
    return "socket copy"
