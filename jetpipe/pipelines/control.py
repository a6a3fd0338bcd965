"""The control API on the metrics server: streams added and removed while serving.

    GET    /streams        every stream in a slot: id, uri, state, fps and counters (+ max_streams)
    POST   /streams        {"uri": ..., "loop", "realtime", "decoder", "hwaccel"}: the keys of a [[source]]
                           table, checked as the config checks them; 201 with the new stream
    GET    /streams/ID     one stream (a removed one with its final counters)
    DELETE /streams/ID     stop its source; 200 once its queued and in-flight frames reached the sinks
                           (202 if that takes longer than 30 s: GET it to see it go)

Errors are JSON {"error": reason}: 400 a malformed request, 401 without the token, 404 no such stream,
409 no free slot, 422 a source that cannot be opened, 503 stopping (413, text: a body over 64 KiB, refused
unread). With a token (required when the server listens beyond loopback) every request carries
`Authorization: Bearer TOKEN`.
Requests run in the HTTP server's threads; the pipeline's add/remove hold its stream table's lock.
"""

from __future__ import annotations

import hmac
import json

from jetpipe.pipelines.config import ConfigError, source_from_table
from jetpipe.pipelines.streams import ControlError

JSON = "application/json"


class Control:
    def __init__(self, pipeline, token: str = ""):
        self.pipeline, self.token = pipeline, token

    def handles(self, path: str) -> bool:
        return path == "/streams" or path.startswith("/streams/")

    def handle(self, method: str, path: str, authorization: str, body: bytes) -> tuple[int, str, str]:
        """(status, JSON body, content type) for a request to /streams or /streams/ID."""
        if self.token and not hmac.compare_digest(authorization.encode(), f"Bearer {self.token}".encode()):
            return _error(401, "the control API needs Authorization: Bearer TOKEN (the daemon's control token)")
        try:
            return self._route(method, path, body)
        except ControlError as exc:
            return _error(exc.status, str(exc))
        except ConfigError as exc:
            return _error(400, str(exc))

    def _route(self, method: str, path: str, body: bytes) -> tuple[int, str, str]:
        if path == "/streams":
            if method == "GET":
                return _ok(200, self.pipeline.list_streams())
            if method == "POST":
                spec = source_from_table(_json(body), "POST /streams")
                return _ok(201, self.pipeline.add_stream(spec))
            return _error(405, f"{method} /streams: use GET (list) or POST (add)")
        stream_id = _stream_id(path)
        if method == "GET":
            return _ok(200, self.pipeline.describe_stream(stream_id))
        if method == "DELETE":
            status, stream = self.pipeline.remove_stream(stream_id)
            return _ok(status, stream)
        return _error(405, f"{method} {path}: use GET or DELETE")


def _stream_id(path: str) -> int:
    text = path[len("/streams/"):]
    if not text.isdigit() or len(text) > 9:
        raise ControlError(404, f"{path}: a stream is /streams/ID with the number GET /streams gives")
    return int(text)


def _json(body: bytes):
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ControlError(400, f"POST /streams: the body is not JSON ({exc}): send "
                                '{"uri": "rtsp://camera/stream"}') from None


def _ok(status: int, value) -> tuple[int, str, str]:
    return status, json.dumps(value) + "\n", JSON


def _error(status: int, reason: str) -> tuple[int, str, str]:
    return status, json.dumps({"error": reason}) + "\n", JSON
