"""The daemon's one HTTP server: /metrics, /healthz, the preview pages and the control API.

Every request passes guard's checks first (who may be answered: Host, Origin, a JSON body for a change);
control.Control answers /streams, pages.PreviewPages the preview, the daemon's callbacks /metrics and
/healthz.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.service.http import guard

log = logging.getLogger(__name__)


class MetricsServer:
    """/metrics and /healthz on host:port (127.0.0.1 unless configured otherwise); `pages(path)` may answer
    other paths with (status, body bytes, content type), or None (404); `control` (control.Control) answers
    /streams and /streams/ID. Every request passes guard's checks first: a Host this server is meant to
    be reached by (`hosts`: names beyond the defaults; "*" any), and for a mutating call a JSON body and no
    other site's Origin."""

    def __init__(self, listen: str, render, healthy, pages=None, control=None, hosts: tuple[str, ...] = (),
                 review=None):
        """review: review.Review, where a recording is kept (/review)."""
        host, _, port = listen.rpartition(":")
        handler = _handler(render, healthy, pages or (lambda path: None), control, guard.host_check(listen, hosts),
                           review)
        try:
            self.server = _Server((host or "127.0.0.1", int(port)), handler)
        except OSError as exc:  # in use (a second daemon on the default port), a host this machine is not
            raise JetpipeError(f"metrics listen = {listen!r}: cannot listen there ({exc.strerror or exc}): choose "
                               "another HOST:PORT (--metrics), or '' to turn the metrics server off") from None
        self.server.daemon_threads = True  # a DELETE waiting for its stream's frames never holds up the exit
        self.address = f"{self.server.server_address[0]}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="metrics", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


MAX_BODY = 64 * 1024  # bytes of a control request's body (a source spec)
REQUEST_TIMEOUT_S = 10.0  # a request's headers and body arrive within this, or the connection is closed


MAX_HANDLERS = 4  # requests answered at once; those beyond wait their turn (the frames' threads keep the GIL)
MAX_WAITING = 4096  # connections waiting for a handler; one beyond is answered 503 with Retry-After at once
REAP_EVERY_S = 0.2  # how often overdue requests are looked for
LISTEN_BACKLOG = 1024  # connections the kernel holds before accept (socketserver's 5 reset 654 of 1,000)


class _Server(ThreadingHTTPServer):
    """At most MAX_HANDLERS threads answer, each taking the next waiting connection when done: 1,000 callers at
    once are answered in turn instead of 1,000 threads fighting the frames' threads for the GIL (a 2 fps camera's
    p99 rose to 14.9 s so), and none is reset by a full listen backlog."""

    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address, handler):
        self._lock = threading.Lock()
        self._waiting: deque = deque()
        self._handlers = 0
        self._reading: dict = {}  # connection -> when its request's line and headers are due
        self._closed = threading.Event()
        self.shed = 0  # connections answered 503 because MAX_WAITING were waiting
        super().__init__(address, handler)
        self._reaper = threading.Thread(target=self._reap, name="http-reaper", daemon=True)
        self._reaper.start()

    def watch(self, connection, seconds: float) -> None:
        with self._lock:
            self._reading[connection] = time.monotonic() + seconds

    def unwatch(self, connection) -> None:
        with self._lock:
            self._reading.pop(connection, None)

    def _reap(self) -> None:
        """Connections whose request is overdue, shut (the handler's read ends, its thread goes to the next)."""
        while not self._closed.wait(REAP_EVERY_S):
            now = time.monotonic()
            with self._lock:
                overdue = [c for c, due in self._reading.items() if now > due]
                for connection in overdue:
                    del self._reading[connection]
            for connection in overdue:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def process_request(self, request, client_address):
        with self._lock:
            if self._handlers < MAX_HANDLERS:
                self._handlers += 1
                threading.Thread(target=self._answer, args=(request, client_address), name="http",
                                 daemon=True).start()
                return
            if len(self._waiting) < MAX_WAITING:
                self._waiting.append((request, client_address))
                return
            self.shed += 1
        _shed(request)
        self.shutdown_request(request)

    def _answer(self, request, client_address) -> None:
        """One handler thread: this connection, then the waiting ones, until none waits."""
        while True:
            try:
                self.finish_request(request, client_address)
            except Exception:  # noqa: BLE001 - said by handle_error, as socketserver does
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)
            with self._lock:
                if not self._waiting:
                    self._handlers -= 1
                    return
                request, client_address = self._waiting.popleft()

    def server_close(self) -> None:
        self._closed.set()
        super().server_close()
        with self._lock:
            waiting, self._waiting = list(self._waiting), deque()
        for request, _ in waiting:  # never answered: the run is ending
            self.shutdown_request(request)

    def handle_error(self, request, client_address):
        """A client that went away or was too slow is no error of ours: one debug line, no traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            log.debug("metrics server: client %s: %s", client_address[0], error)
        else:
            log.exception("metrics server: a request from %s failed", client_address[0])


def _no_follow(path, flags):
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)


SHED = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: text/plain\r\nContent-Length: 28\r\n"
        b"Connection: close\r\n\r\nbusy: try again in a second\n")


def _shed(request) -> None:
    """A connection beyond what waits: 503 with Retry-After, written at once (the accepting thread's)."""
    try:
        request.settimeout(0.2)
        request.sendall(SHED)
    except OSError:
        pass


def _handler(render, healthy, pages, control, allows_host, review=None):
    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S  # the socket's: a silent client does not hold a thread for ever

        def handle_one_request(self):
            """A request's line and headers arrive within REQUEST_TIMEOUT_S in all (the server's reaper cuts the
            connection then): a client trickling them a byte at a time, each within the socket's timeout, would
            hold one of the few handlers for ever."""
            self.server.watch(self.connection, REQUEST_TIMEOUT_S)
            try:
                super().handle_one_request()
            finally:
                self.server.unwatch(self.connection)

        def do_GET(self):  # noqa: N802 (http.server's name)
            self.server.unwatch(self.connection)  # its headers are in: what it asks may take its time
            if not self._guarded("GET"):
                return
            path = self.path.split("?", 1)[0]
            if self.path == "/metrics":
                self._reply(200, render(), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                ok, why = healthy()
                self._reply(200 if ok else 503, why + "\n", "text/plain")
            elif control is not None and control.handles(path):
                self._control("GET", path, b"")
            elif review is not None and review.handles(path):
                self._review()
            elif (answer := pages(path)) is not None:
                self._reply(*answer)
            else:
                self._reply(404, "try /, /metrics or /healthz\n", "text/plain")

        def do_POST(self):  # noqa: N802
            self._write_method("POST")

        def do_PUT(self):  # noqa: N802
            self._write_method("PUT")

        def do_DELETE(self):  # noqa: N802
            self._write_method("DELETE")

        def _guarded(self, method: str) -> bool:
            """The checks before any answer (guard): False when a refusal was sent."""
            host = self.headers.get("Host")
            if not allows_host(host):
                self.close_connection = True
                self._reply(421, f"Host {str(host)[:80]!r} is not a name this server answers to: use its IP address "
                                 "or add the name with --metrics-host NAME ([metrics] hosts)\n", "text/plain")
                return False
            why = guard.cross_site(method, self.headers.get("Origin"), self.headers.get("Sec-Fetch-Site"), host)
            if why:
                self.close_connection = True
                self._reply(403, f"refused: a request from another site ({why})\n", "text/plain")
                return False
            return True

        def _write_method(self, method: str) -> None:
            self.server.unwatch(self.connection)  # its headers are in; its body has a deadline of its own
            if not self._guarded(method):
                return
            path = self.path.split("?", 1)[0]
            if control is None or not control.handles(path):
                self._reply(404 if control is None else 405,
                            "no control API here (serve --control turns it on)\n" if control is None
                            else f"{method} is for /streams and /rules\n", "text/plain")
                return
            length = self.headers.get("Content-Length", "0")
            if not length.isdigit() or int(length) > MAX_BODY:  # refused unread: nothing of it is kept
                self.close_connection = True
                self._reply(413, f"a body of at most {MAX_BODY} bytes with its Content-Length\n", "text/plain")
                return
            if int(length) and not guard.is_json(self.headers.get("Content-Type")):
                self.close_connection = True  # unread: a browser sends text/plain cross-site without asking
                self._reply(415, "send the body as JSON with Content-Type: application/json\n", "text/plain")
                return
            body = self._read_body(int(length))
            if body is not None:
                self._control(method, path, body)

        def _read_body(self, length: int) -> bytes | None:
            """The body, read within REQUEST_TIMEOUT_S in all (a client trickling it byte by byte is cut off);
            None when it did not come (answered 408, or the client went away)."""
            deadline = time.monotonic() + REQUEST_TIMEOUT_S
            chunks, left = [], length
            try:
                while left:
                    self.connection.settimeout(max(0.001, deadline - time.monotonic()))
                    chunk = self.rfile.read1(left)
                    if not chunk:
                        raise ConnectionResetError("the client closed the connection mid-body")
                    chunks.append(chunk)
                    left -= len(chunk)
            except TimeoutError:
                self.close_connection = True
                self._reply(408, f"the body did not arrive within {REQUEST_TIMEOUT_S:g} s\n", "text/plain")
                return None
            except ConnectionError:
                self.close_connection = True
                return None
            return b"".join(chunks)

        def _control(self, method: str, path: str, body: bytes) -> None:
            status, text, ctype = control.handle(method, path, self.headers.get("Authorization", ""), body)
            extra = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
            self._reply(status, text, ctype, extra)

        def _review(self) -> None:
            reply = review.answer(self.path, self.headers)
            if reply.file is None:
                self._reply(reply.status, reply.body, reply.ctype, reply.headers)
                return
            try:
                self._send_file(reply)
            finally:
                if reply.remove_after:  # an export's temporary file and folder
                    reply.file.unlink(missing_ok=True)
                    reply.file.parent.rmdir()

        def _send_file(self, reply) -> None:
            """A file's span, by the kernel (sendfile): a recording's segment, a clip, an export."""
            offset, length = reply.span
            try:
                with open(reply.file, "rb", opener=_no_follow) as f:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.ctype)
                    self.send_header("Content-Length", str(length))
                    self.send_header("X-Content-Type-Options", "nosniff")
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    if length:
                        self.connection.sendfile(f, offset, length)
            except (ConnectionError, TimeoutError):
                self.close_connection = True
            except OSError:  # gone between the answer's look and the read (retention): the client sees it cut
                self.close_connection = True

        def _reply(self, code, body, ctype, headers=None):
            data = body if isinstance(body, bytes) else body.encode()
            try:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("X-Content-Type-Options", "nosniff")
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)
            except (ConnectionError, TimeoutError):  # the client left before the answer: nothing to tell it
                self.close_connection = True

        def log_message(self, *args):
            pass

    return Handler
