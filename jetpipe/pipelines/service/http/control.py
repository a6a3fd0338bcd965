"""The control API on the metrics server: streams added and removed while serving.

    GET    /streams        every stream in a slot: id, uri, state, fps and counters (+ max_streams)
    POST   /streams        {"uri": ..., "loop", "realtime", "decoder", "hwaccel"}: the keys of a [[source]]
                           table, checked as the config checks them; 201 with the new stream
    GET    /streams/ID     one stream (a removed one with its final counters)
    DELETE /streams/ID     stop its source; 200 once its queued and in-flight frames reached the sinks
                           (202 if that takes longer than 30 s: GET it to see it go)
    POST   /streams/ID/clips  {"before_s": S, "after_s": S} (both optional: the [clips] defaults): a clip of
                           the stream around its newest frame; 202, and a clip_ready record when it is written
    /rules, /rules/NAME    the zones and lines (rule_routes.RuleRoutes)

Errors are JSON {"error": reason}: 400 a malformed request, 401 without the token, 403 a source kind or
file the operator did not allow, 404 no such stream, 409 no free slot, 422 a source that cannot be opened,
503 stopping. The metrics server refuses before this (text): 421 a Host it does not answer to, 403 another
site's Origin, 413 a body over 64 KiB, 415 a body that is not application/json, 408 a body that does not
arrive within 10 s. With a token (required when the server listens beyond loopback) every request carries
`Authorization: Bearer TOKEN`.

What a caller may start is the operator's choice at start-up (SourcePolicy): cameras (csi, v4l2), RTSP
streams and synthetic cameras by default; other schemes (gst: pipelines, http, udp, ...) only when
allowed by name; files only inside the folders named for them.
Requests run in the HTTP server's threads; the pipeline's add/remove hold its stream table's lock.
"""

from __future__ import annotations

import hmac
import json
import os

from jetpipe import uri as uris
from jetpipe.pipelines.config import ConfigError, ControlConfig, SourceConfig, source_from_table
from jetpipe.pipelines.ingest.streams import ControlError
from jetpipe.pipelines.service.http import guard
from jetpipe.pipelines.service.http.rule_routes import RuleRoutes

JSON = "application/json"


class SourcePolicy:
    """Which sources a control API caller may start: the operator's [control] allow_schemes and
    allow_folders (checked and resolved by the config at start-up)."""

    def __init__(self, config: ControlConfig):
        self.schemes = tuple(config.allow_schemes)
        self.folders = tuple(os.path.realpath(f) for f in config.allow_folders)

    def check(self, spec: SourceConfig) -> None:
        """ControlError 403 naming what the operator would allow; 400 for a URI that does not parse."""
        try:
            uri = uris.parse(spec.uri)
        except uris.SourceURIError as exc:
            raise ControlError(400, str(exc)) from None
        if uri.scheme == "file":
            self._check_file(uri)
        elif uri.scheme not in self.schemes:
            raise ControlError(403, f"{uri.scheme} sources are not allowed through the control API (allowed: "
                                    f"{', '.join(self._allowed())}): the operator allows them at start-up with "
                                    f"--control-allow {uri.scheme} ([control] allow_schemes)")

    def _check_file(self, uri: uris.SourceURI) -> None:
        if not self.folders:
            raise ControlError(403, "files are not served through the control API: the operator names the folders "
                                    "they may come from at start-up with --control-folder DIR ([control] "
                                    "allow_folders)")
        real = os.path.realpath(uri.location)  # links resolved: a link inside a folder may point anywhere
        if not any(os.path.commonpath((real, folder)) == folder for folder in self.folders):
            raise ControlError(403, f"{uri.location[:200]}: files are served through the control API only from "
                                    f"{', '.join(self.folders)} (--control-folder)")

    def _allowed(self) -> list[str]:
        return [*self.schemes, *(["files under " + ", ".join(self.folders)] if self.folders else [])]


class Control:
    def __init__(self, pipeline, config: ControlConfig):
        self.pipeline, self.token = pipeline, config.token
        self.policy = SourcePolicy(config)
        self.rules = RuleRoutes(pipeline.events, pipeline.labels, pipeline.class_count,
                                {c.stream: c for c in pipeline.config.calibrations})

    def handles(self, path: str) -> bool:
        return path == "/streams" or path.startswith("/streams/") or self.rules.handles(path)

    def handle(self, method: str, path: str, authorization: str, body: bytes) -> tuple[int, str, str]:
        """(status, JSON body, content type) for a request to /streams or /streams/ID."""
        refusal = unauthorized(self.token, authorization)
        if refusal is not None:
            return refusal
        try:
            return self._route(method, path, body)
        except ControlError as exc:
            return error(exc.status, str(exc))
        except ConfigError as exc:
            return error(400, str(exc))

    def _route(self, method: str, path: str, body: bytes) -> tuple[int, str, str]:
        if self.rules.handles(path):
            return ok(*self.rules.route(method, path, json_body(body, path) if method in ("POST", "PUT") else None))
        if path == "/streams":
            if method == "GET":
                return ok(200, self.pipeline.list_streams())
            if method == "POST":
                spec = source_from_table(json_body(body, path), "POST /streams")
                self.policy.check(spec)
                return ok(201, self.pipeline.add_stream(spec))
            return error(405, f"{method} /streams: use GET (list) or POST (add)")
        if path.endswith("/clips"):
            if method != "POST":
                return error(405, f"{method} {path}: use POST (a clip of the stream around now)")
            asked = json_body(body, path) if body.strip() else {}
            return ok(202, self.pipeline.request_clip(_stream_id(path.removesuffix("/clips")), asked))
        stream_id = _stream_id(path)
        if method == "GET":
            return ok(200, self.pipeline.describe_stream(stream_id))
        if method == "DELETE":
            status, stream = self.pipeline.remove_stream(stream_id)
            return ok(status, stream)
        return error(405, f"{method} {path}: use GET or DELETE")


def _stream_id(path: str) -> int:
    text = path[len("/streams/"):]
    if not text.isdigit() or len(text) > 9:
        raise ControlError(404, f"{path}: a stream is /streams/ID with the number GET /streams gives")
    return int(text)


EXAMPLES = {"/streams": '{"uri": "rtsp://camera/stream"}', "/clips": '{"before_s": 10, "after_s": 5}',
            "/rules": '{"kind": "line", "name": "door", "points": [[0.5, 0], [0.5, 1]]}'}


def unauthorized(token: str, authorization: str) -> tuple[int, str, str] | None:
    """The 401 answer where a token is set and the request's Authorization does not carry it; None: go on."""
    given = guard.bearer_token(authorization)
    if token and not hmac.compare_digest(given.encode(), token.encode()):
        return error(401, "the control API needs Authorization: Bearer TOKEN (the daemon's control token)")
    return None


def json_body(body: bytes, path: str):
    """A request's JSON body (ControlError 400 naming what to send where it is not JSON or nests too deep)."""
    example = EXAMPLES["/rules" if path.startswith("/rules") else "/clips" if path.endswith("/clips") else "/streams"]
    if guard.json_depth(body) > guard.MAX_JSON_DEPTH:
        raise ControlError(400, f"{path[:100]}: the body nests deeper than {guard.MAX_JSON_DEPTH} levels: send "
                                f"one object, e.g. {example}")
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ControlError(400, f"{path[:100]}: the body is not JSON ({exc}): send {example}") from None


def ok(status: int, value) -> tuple[int, str, str]:
    return status, json.dumps(value) + "\n", JSON


def error(status: int, reason: str) -> tuple[int, str, str]:
    return status, json.dumps({"error": reason}) + "\n", JSON
