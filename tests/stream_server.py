"""A network camera for the tests: MPEG-TS bytes served over TCP on 127.0.0.1, read as a `tcp://` URI.

Each client gets the file from its start, over and over (once=True: one pass, then the connection closes
and the stream ends for the client), in 16 KB pieces 2 ms apart. hang=True accepts connections and
never sends a byte (a camera whose connect hangs). unplug() takes the camera away; a new server on the
same port brings it back.
"""

from __future__ import annotations

import socketserver
import threading
import time

CHUNK = 16384


class StreamServer:
    def __init__(self, ts_bytes: bytes = b"", port: int = 0, once: bool = False, hang: bool = False):
        data = ts_bytes

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                try:
                    while not server.closing:
                        if hang:
                            time.sleep(0.05)
                            continue
                        for at in range(0, len(data), CHUNK):
                            self.request.sendall(data[at:at + CHUNK])
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
