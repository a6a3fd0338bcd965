"""The review API on the metrics server (read only): what was recorded, the events, and the media themselves.

    GET /review                        the review page (review_page.py)
    GET /review/api/streams            each recorded stream: its first and last recorded time, segments, bytes
    GET /review/api/events             ?stream=&rule=&type=&label=&from=&to=&before=&limit=  newest first, paged
                                       (`before`: the last page's oldest time); each with its snapshot's, clip's
                                       and recording's media URLs
    GET /review/api/recordings         ?stream=&from=&to=  the stream's segments in the range, with their URLs
    GET /review/media/KIND/ID          KIND segment | clip | snapshot, ID what the API gave (a row's number, and
                                       the part's where workers recorded: N.ROW): the file, with HTTP range
                                       requests (a browser's <video> seeks)
    GET /review/export                 ?stream=&from=&to=  one MP4 of the range, remuxed (at most an hour)

A recording made by a daemon's several workers is in parts, one a worker (recording/parts.py): every part is
read, and the answers are merged (events newest first over all of them, a stream's segments in time order).

Times are Unix seconds (or ISO 8601 in from / to). Who may read: the control API's token where one is set
(`Authorization: Bearer TOKEN`); a media or export URL the API gave carries a signature instead (`exp`,
`sig`: HMAC of the token, valid for SIGNED_S), since a <video> element sends no header. No path is ever taken
from a request: media are named by their index rows' numbers, and each file is opened without following a
link, and only inside the folder it belongs to. A request from another site (Sec-Fetch-Site) is refused, so a
web page in the user's browser cannot show the recordings.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import sqlite3
import stat
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlencode

from jetpipe.pipelines.outputs.recording.export import ExportError, export_range, parse_when
from jetpipe.pipelines.outputs.recording.parts import parts_of, read_only
from jetpipe.pipelines.service.http import guard
from jetpipe.pipelines.service.http.review_page import PAGE

SIGNED_S = 3600          # a media URL the API gave is good this long
MAX_EXPORT_S = 3600.0    # an export over HTTP covers at most an hour (`jetpipe export recording`: a day)
MAX_LIMIT, DEFAULT_LIMIT = 500, 100
MAX_TEXT = 200           # a filter's text, at most
MAX_SEGMENTS = 5000      # a recordings answer lists at most this many segments
MEDIA = re.compile(r"/review/media/(segment|clip|snapshot)/(?:(\d{1,3})\.)?(\d{1,18})")
QUERIES = {"/review/api/streams": set(), "/review/api/events": {"stream", "rule", "type", "label", "from", "to",
                                                                 "before", "limit"},
           "/review/api/recordings": {"stream", "from", "to"}, "/review/export": {"stream", "from", "to", "exp",
                                                                                   "sig"}}
TYPES = {"segment": "video/mp4", "clip": "video/mp4", "snapshot": "image/jpeg"}


@dataclass
class Reply:
    status: int
    body: bytes = b""
    ctype: str = "application/json"
    headers: dict = field(default_factory=dict)
    file: Path | None = None     # sent from here: `span` (offset, length) of it
    span: tuple[int, int] = (0, 0)
    remove_after: bool = False   # a temporary file (an export)


class BadRequest(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


class Review:
    def __init__(self, folder: Path, token: str, clips: Path | None, snapshots: Path | None):
        """folder: the recording's ([record] folder); token: the control API's ('' : none, loopback only);
        clips, snapshots: the folders their media must lie in (None: not served)."""
        self.folder, self.token = folder, token
        self.roots = {"segment": folder, "clip": clips, "snapshot": snapshots}
        self.exporting = threading.Lock()  # one export at a time (each reads and writes a range's bytes)

    @staticmethod
    def handles(path: str) -> bool:
        return path == "/review" or path.startswith("/review/")

    def answer(self, target: str, headers) -> Reply:
        """A GET of `target` (path and query); headers: the request's (Authorization, Range, Sec-Fetch-Site)."""
        path, _, query = target.partition("?")
        if path in ("/review", "/review/"):
            return Reply(200, PAGE.encode(), "text/html; charset=utf-8",
                         {"Content-Security-Policy": "default-src 'self'; style-src 'unsafe-inline'; "
                                                     "script-src 'unsafe-inline'; img-src 'self'; media-src 'self'",
                          "Cache-Control": "no-store"})
        fetch_site = headers.get("Sec-Fetch-Site")
        if fetch_site and fetch_site.lower() not in ("same-origin", "none"):
            return _error(403, f"refused: a request from another site (Sec-Fetch-Site: {fetch_site[:40]})")
        try:
            return self._route(path, query, headers)
        except BadRequest as exc:
            return _error(exc.status, str(exc))
        except sqlite3.Error as exc:
            return _error(503, f"the recording's index cannot be read now ({exc}): try again")

    def _route(self, path: str, query: str, headers) -> Reply:
        media = MEDIA.fullmatch(path)
        if media is None and path not in QUERIES:
            raise BadRequest(404, "try /review/api/streams, /review/api/events, /review/api/recordings or /review")
        asked = _query(query, QUERIES.get(path, {"exp", "sig"}))
        if not (self._signed(path, asked) if (media or path == "/review/export") and "sig" in asked
                else self._authorized(headers.get("Authorization", ""))):
            reply = _error(401, "the review API needs Authorization: Bearer TOKEN (the daemon's control token), or "
                                "a media URL the API gave (signed)")
            reply.headers["WWW-Authenticate"] = "Bearer"
            return reply
        if media is not None:
            return self._media(media.group(1), media.group(2) or "", int(media.group(3)), headers.get("Range"))
        if path == "/review/export":
            return self._export(asked)
        with self._index() as parts:
            if path == "/review/api/streams":
                return _json({"streams": _streams(parts)})
            if path == "/review/api/events":
                return _json(self._events(parts, asked))
            return _json(self._recordings(parts, asked))

    # -- who may read ------------------------------------------------------------------------------------------
    def _authorized(self, authorization: str) -> bool:
        return not self.token or hmac.compare_digest(guard.bearer_token(authorization).encode(), self.token.encode())

    def sign(self, path: str, query: dict | None = None) -> str:
        """A URL of `path` good for SIGNED_S without a header (no signature where no token is set)."""
        query = dict(query or {})
        if self.token:
            query["exp"] = str(int(time.time()) // 600 * 600 + SIGNED_S)  # whole 10 minutes: a browser caches it
            query["sig"] = self._signature(path, query)
        return f"{path}?{urlencode(query)}" if query else path

    def _signature(self, path: str, query: dict) -> str:
        signed = "&".join(f"{k}={query[k]}" for k in sorted(query) if k != "sig")
        return hmac.new(self.token.encode(), f"{path}?{signed}".encode(), hashlib.sha256).hexdigest()[:40]

    def _signed(self, path: str, asked: dict) -> bool:
        if not self.token:
            return True
        exp = asked.get("exp", "")
        if not exp.isdigit() or int(exp) < time.time():
            return False
        return hmac.compare_digest(asked["sig"].encode(), self._signature(path, asked).encode())

    # -- the index ---------------------------------------------------------------------------------------------
    def _index(self, tag: str | None = None) -> _ReadOnly:
        """Every part of the recording, open for one request; or only the part `tag` (none where it has none)."""
        parts = parts_of(self.folder)
        if not parts:
            raise BadRequest(503, "the recording's index is not there yet")
        return _ReadOnly([part for part in parts if tag is None or part[0] == tag])

    def _events(self, parts: list, asked: dict) -> dict:
        where, args = [], []
        for key, column in (("stream", "stream"), ("rule", "rule"), ("type", "type"), ("label", "label")):
            if key in asked:
                where.append(f"{column} = ?")
                args.append(_int(asked, key) if key == "stream" else asked[key])
        for key, op in (("from", ">="), ("to", "<="), ("before", "<")):
            if key in asked:
                where.append(f"time {op} ?")
                args.append(_when(asked, key))
        limit = _int(asked, "limit", DEFAULT_LIMIT)
        if not 1 <= limit <= MAX_LIMIT:
            raise BadRequest(400, f"limit = {limit}: from 1 to {MAX_LIMIT}")
        rows = sorted(((part, row) for part in parts for row in part.db.execute(
            "SELECT id, stream, time, pts, type, rule, label, track, record FROM events "
            f"{'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY time DESC LIMIT ?", (*args, limit + 1))),
            key=lambda found: -found[1][2])  # every part's newest, merged
        events = [self._event(part, row) for part, row in rows[:limit]]
        more = len(rows) > limit
        return {"events": events, "next_before": events[-1]["time"] if more else None}

    def _event(self, part, row) -> dict:
        """An event with the URLs of its media and of the segment that holds it, from its own part."""
        event_id, stream, when, pts, kind, rule, label, track, record = row
        db = part.db
        media = {sort: self.sign(f"/review/media/{sort}/{part.id_of(rowid)}") for rowid, sort in db.execute(
            "SELECT media.rowid, media.kind FROM media_events JOIN media ON media.path = media_events.path "
            "WHERE media_events.event = ? AND media.stream = ? ORDER BY media.time", (event_id, stream))}
        # the segment that holds it: on the stream's clock where both have one (a file read faster than real time
        # has no other), else on the wall clock
        found = db.execute("SELECT id, start, CASE WHEN t0 IS NOT NULL AND ?1 IS NOT NULL THEN ?1 - t0 ELSE ?2 - start "
                           "END FROM segments WHERE stream = ?3 AND open = 0 AND CASE WHEN t0 IS NOT NULL AND ?1 IS "
                           "NOT NULL THEN t0 <= ?1 AND t1 > ?1 ELSE start <= ?2 AND end > ?2 END ORDER BY start DESC "
                           "LIMIT 1", (pts, when, stream)).fetchone()
        recording = None if found is None else {"url": self.sign(f"/review/media/segment/{part.id_of(found[0])}"),
                                                "start": found[1], "at": found[2]}
        return {"id": event_id, "stream": stream, "time": when, "pts": pts, "type": kind, "rule": rule,
                "label": label, "track_id": track, "snapshot": media.get("snapshot"), "clip": media.get("clip"),
                "recording": recording, "record": json.loads(record)}

    def _recordings(self, parts: list, asked: dict) -> dict:
        stream = _int(asked, "stream")
        start, end = _when(asked, "from", 0.0), _when(asked, "to", time.time() + 86400)
        rows = sorted(((part, row) for part in parts for row in part.db.execute(
            "SELECT id, start, end, bytes FROM segments WHERE stream = ? AND open = 0 AND start < ? AND end > ? "
            "ORDER BY start LIMIT ?", (stream, end, start, MAX_SEGMENTS))), key=lambda found: found[1][1])
        return {"stream": stream, "segments": [{"start": s, "end": e, "bytes": b,
                                                "url": self.sign(f"/review/media/segment/{part.id_of(i)}")}
                                               for part, (i, s, e, b) in rows[:MAX_SEGMENTS]],
                "export": self.sign("/review/export", {"stream": str(stream), "from": str(start), "to": str(end)})}

    # -- media -------------------------------------------------------------------------------------------------
    def _media(self, kind: str, tag: str, rowid: int, range_header: str | None) -> Reply:
        root = self.roots[kind]
        if root is None:
            raise BadRequest(404, f"no {kind}s are kept by this run")
        found = None
        with self._index(str(int(tag)) if tag else "") as parts:  # the part whose row it is (none: no such part)
            for part in parts:
                if kind == "segment":
                    root = part.folder  # a part's segments lie in it
                    found = part.db.execute("SELECT path FROM segments WHERE id = ?", (rowid,)).fetchone()
                else:
                    found = part.db.execute("SELECT path FROM media WHERE rowid = ? AND kind = ?",
                                            (rowid, kind)).fetchone()
        if found is None:
            raise BadRequest(404, f"no {kind} {rowid} (it may have gone with the recording's retention)")
        path = root / found[0] if kind == "segment" else Path(found[0])
        return _file_reply(_inside(path, root), TYPES[kind], range_header)

    def _export(self, asked: dict) -> Reply:
        stream, start, end = _int(asked, "stream"), _when(asked, "from"), _when(asked, "to")
        if end - start > MAX_EXPORT_S:
            raise BadRequest(400, f"the range is {end - start:.0f} s: export at most {MAX_EXPORT_S:.0f} s here "
                                  "(`jetpipe export recording` takes a day)")
        if not self.exporting.acquire(blocking=False):
            raise BadRequest(429, "an export is being made: try again when it is done")
        try:
            out = Path(tempfile.mkdtemp(prefix="jetpipe-export-")) / f"stream{stream}.mp4"
            try:
                done = export_range(self.folder, stream, start, end, out)
            except ExportError as exc:
                out.parent.rmdir()
                raise BadRequest(404, str(exc)) from None
        finally:
            self.exporting.release()
        name = f"stream{stream}-{int(done.start)}-{int(done.end)}.mp4"
        reply = _file_reply(out, "video/mp4", None)
        reply.remove_after = True
        reply.headers["Content-Disposition"] = f'attachment; filename="{name}"'
        return reply


@dataclass
class _Part:
    """One part of the recording (parts.py), open for one request."""
    tag: str           # "": the recording's own folder; else the worker's number
    folder: Path
    db: sqlite3.Connection

    def id_of(self, rowid: int) -> str:
        """A media ID the API gives: the row's number, after the part's where it is a worker's."""
        return f"{self.tag}.{rowid}" if self.tag else str(rowid)


class _ReadOnly:
    """Read-only connections to every part's index for one request (WAL: they read while the recorders write)."""

    def __init__(self, parts: list[tuple[str, Path]]):
        self.parts: list[_Part] = []
        try:
            for tag, folder in parts:
                self.parts.append(_Part(tag, folder, read_only(folder, timeout=2)))
        except sqlite3.Error:
            self.__exit__()
            raise

    def __enter__(self) -> list[_Part]:
        return self.parts

    def __exit__(self, *exc):
        for part in self.parts:
            part.db.close()


def _streams(parts: list[_Part]) -> list[dict]:
    """Each recorded stream over every part: its first and last recorded time, segments and bytes summed."""
    merged: dict[int, dict] = {}
    for part in parts:
        for s, src, first, last, n, size in part.db.execute(
                "SELECT stream, MAX(source), MIN(start), MAX(end), COUNT(*), SUM(bytes) FROM segments WHERE open = 0 "
                "GROUP BY stream"):
            had = merged.get(s)
            merged[s] = {"stream": s, "source": src, "first": first, "last": last, "segments": n, "bytes": size} \
                if had is None else {**had, "first": min(had["first"], first), "last": max(had["last"], last),
                                     "segments": had["segments"] + n, "bytes": had["bytes"] + size}
    return [merged[s] for s in sorted(merged)]


def _query(query: str, allowed: set) -> dict:
    try:
        parsed = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query), max_num_fields=16)
    except ValueError:
        raise BadRequest(400, "the query does not parse: key=value pairs joined by &") from None
    unknown = set(parsed) - allowed
    if unknown:
        raise BadRequest(400, f"unknown parameter {sorted(unknown)[0][:40]!r}: this path takes "
                              f"{', '.join(sorted(allowed)) or 'none'}")
    for key, values in parsed.items():
        if len(values) != 1 or len(values[0]) > MAX_TEXT or "\x00" in values[0]:
            raise BadRequest(400, f"{key}: give it once, as text of at most {MAX_TEXT} characters")
    return {key: values[0] for key, values in parsed.items()}


def _int(asked: dict, key: str, default: int | None = None) -> int:
    if key not in asked:
        if default is None:
            raise BadRequest(400, f"{key} is required")
        return default
    value = asked[key]
    if not value.isdigit() or len(value) > 9:
        raise BadRequest(400, f"{key} = {value[:40]!r}: a whole number from 0")
    return int(value)


def _when(asked: dict, key: str, default: float | None = None) -> float:
    if key not in asked:
        if default is None:
            raise BadRequest(400, f"{key} is required (Unix seconds, or ISO 8601)")
        return default
    try:
        return parse_when(asked[key], key)
    except ExportError as exc:
        raise BadRequest(400, str(exc)) from None


def _inside(path: Path, root: Path) -> Path:
    """The path, where it lies inside root once every link is resolved (else 404: never served)."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([real, base]) != base:
        raise BadRequest(404, "not a file of this recording")
    return path


def _file_reply(path: Path, ctype: str, range_header: str | None) -> Reply:
    """The file (never through a link) whole, or the one byte range asked (206; 416 where it lies beyond)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise BadRequest(404, "the file is gone (retention) or is not ours") from None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode):
        raise BadRequest(404, "not a file of this recording")
    size = info.st_size
    headers = {"Accept-Ranges": "bytes", "Cache-Control": "private, max-age=600"}
    if not range_header:
        return Reply(200, ctype=ctype, headers=headers, file=path, span=(0, size))
    found = re.fullmatch(r"bytes=(\d*)-(\d*)", range_header.strip())
    if found is None or found.group(1) == found.group(2) == "":
        raise BadRequest(416, "one byte range, e.g. Range: bytes=0-1023")
    first, last = found.groups()
    if first == "":
        start, end = max(0, size - int(last)), size - 1
    else:
        start, end = int(first), min(size - 1, int(last)) if last else size - 1
    if start >= size or start > end:
        reply = _error(416, f"the range lies beyond the file's {size} bytes")
        reply.headers["Content-Range"] = f"bytes */{size}"
        return reply
    headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    return Reply(206, ctype=ctype, headers=headers, file=path, span=(start, end - start + 1))


def _json(value) -> Reply:
    return Reply(200, json.dumps(value, separators=(",", ":")).encode(), headers={"Cache-Control": "no-store"})


def _error(status: int, reason: str) -> Reply:
    return Reply(status, json.dumps({"error": reason}).encode())


def review_of(config) -> Review | None:
    """The review API of a run that records ([record] folder), with the control API's token; None elsewhere."""
    if not config.record.folder:
        return None
    return Review(Path(config.record.folder), config.control.token, Path(config.clips.folder) if config.clips.folder
                  else None, Path(config.snapshots.folder) if config.snapshots.folder else None)
