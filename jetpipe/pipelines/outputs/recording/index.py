"""The recording's index: its segments, and the events, clips and snapshots of the run, in SQLite (WAL mode).

    segments(id, stream, source, path, start, end, t0, t1, bytes, packets, open, held)
        path: relative to the recording's folder (stream{ID}/{YYYY-MM-DD}/{HH-MM-SS.mmm}.mp4, UTC); start, end:
        wall clock (Unix seconds) of its time 0 and past its last frame; t0, t1: the same on the stream's own
        clock, the frames' pts (NULL where the row was rebuilt from the file alone); open: 1 while written;
        held: 1 where an event lies within the clips' pre- and post-roll of it (kept longer: events_max_age),
        judged on the stream's clock (a file read faster than real time has no other) where both have one
    events(id, stream, time, pts, type, rule, label, track, record)    record: the event's JSON line
    media(path, kind, stream, time, end, bytes, events)                kind: clip | snapshot; events: JSON list
    media_events(event, path)          each event's media, looked up by event (the events list's clip and snapshot)
    meta(key, value)                                                   schema: its version

One connection, the recorder's thread's (opened, checked and repaired before serving starts). A row is written
before its file is made and finished after the file is closed, so a killed process leaves rows that still say
open=1: `repair` finishes them from the files (cut after their last whole fragment), drops rows whose file is
gone, and adopts segment files no row names (a row lost with a damaged index: the index is then rebuilt from
the files). WAL with synchronous=NORMAL: a committed row survives the process being killed.
"""

from __future__ import annotations

import calendar
import contextlib
import json
import logging
import os
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from jetpipe.pipelines.config import ConfigError
from jetpipe.pipelines.outputs.recording.segments import repair

log = logging.getLogger(__name__)

INDEX_NAME = "index.sqlite3"
SCHEMA = "1"
STREAM_FOLDER = re.compile(r"stream(\d+)")
DAY_FOLDER = re.compile(r"\d{4}-\d{2}-\d{2}")
SEGMENT_NAME = re.compile(r"(\d{2})-(\d{2})-(\d{2})\.(\d{3})(?:-\d+)?\.mp4")
WAL_PAGES = 256  # the write-ahead log is folded back into the index at about 1 MB (it counts in the budget)

_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS segments (id INTEGER PRIMARY KEY, stream INTEGER NOT NULL, source TEXT NOT NULL,
    path TEXT NOT NULL UNIQUE, start REAL NOT NULL, end REAL NOT NULL, t0 REAL, t1 REAL, bytes INTEGER NOT NULL,
    packets INTEGER NOT NULL, open INTEGER NOT NULL, held INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS segments_by_stream ON segments (stream, start);
CREATE INDEX IF NOT EXISTS segments_by_age ON segments (held, open, start);
CREATE TABLE IF NOT EXISTS events (id TEXT PRIMARY KEY, stream INTEGER NOT NULL, time REAL NOT NULL, pts REAL,
    type TEXT NOT NULL, rule TEXT, label TEXT, track INTEGER, record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_by_stream ON events (stream, time);
CREATE INDEX IF NOT EXISTS events_by_pts ON events (stream, pts);
CREATE INDEX IF NOT EXISTS events_by_time ON events (time);
CREATE TABLE IF NOT EXISTS media (path TEXT PRIMARY KEY, kind TEXT NOT NULL, stream INTEGER NOT NULL,
    time REAL NOT NULL, end REAL, bytes INTEGER NOT NULL, events TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS media_by_time ON media (time);
CREATE TABLE IF NOT EXISTS media_events (event TEXT NOT NULL, path TEXT NOT NULL, PRIMARY KEY (event, path))
    WITHOUT ROWID;
"""


def _fill_media_events(db: sqlite3.Connection) -> None:
    """media_events for the media rows that have none (an index made before the table, or written by a jetpipe
    that did not fill it): from their events lists."""
    rows = db.execute("SELECT path, events FROM media WHERE path NOT IN (SELECT path FROM media_events)").fetchall()
    pairs = []
    for path, events in rows:
        try:
            pairs += [(str(event), path) for event in json.loads(events)]
        except (ValueError, TypeError):  # not a list: nothing to look up by
            continue
    if pairs:
        db.executemany("INSERT OR IGNORE INTO media_events VALUES (?, ?)", pairs)


EVENT_STREAM, EVENT_TIME, EVENT_PTS = 1, 2, 3  # an event row's places (event_row)


def event_row(event) -> tuple:
    """An event record's row of the events table (its JSON line is the sinks' own, made once)."""
    return (event.event_id, event.stream, event.time, event.pts, event.type, event.rule, event.label,
            event.track_id, event.json())


@dataclass
class Segment:
    id: int
    stream: int
    path: str
    start: float
    end: float
    bytes: int


def segment_path(stream: int, start: float, attempt: int = 0) -> str:
    """stream3/2026-11-28/17-49-03.120.mp4 (UTC), '-N' added where that name was taken."""
    whole = time.gmtime(start)
    millis = int(round((start - int(start)) * 1000)) % 1000
    suffix = f"-{attempt}" if attempt else ""
    return (f"stream{stream}/{time.strftime('%Y-%m-%d', whole)}/"
            f"{time.strftime('%H-%M-%S', whole)}.{millis:03d}{suffix}.mp4")


def start_of(path: str) -> float | None:
    """A segment name's wall clock (segment_path's inverse); None where it is not one of ours."""
    parts = path.split("/")
    if len(parts) != 3 or not STREAM_FOLDER.fullmatch(parts[0]) or not DAY_FOLDER.fullmatch(parts[1]):
        return None
    found = SEGMENT_NAME.fullmatch(parts[2])
    if found is None:
        return None
    hour, minute, second, millis = (int(g) for g in found.groups())
    try:
        day = time.strptime(parts[1], "%Y-%m-%d")
    except ValueError:
        return None
    return calendar.timegm(day) + hour * 3600 + minute * 60 + second + millis / 1000


class RecordIndex:
    def __init__(self, folder: Path):
        """The index of the recording in `folder`, opened (made where missing). A damaged index is set aside
        (index.sqlite3.damaged-TIME) and a new one rebuilt from the files by repair()."""
        self.folder = folder
        self.path = folder / INDEX_NAME
        for name in (INDEX_NAME, INDEX_NAME + "-wal", INDEX_NAME + "-shm"):
            if os.path.islink(folder / name):
                raise ConfigError(f"{folder / name} is a symbolic link: the recording's index is never written "
                                  "through a link; remove it")
        try:
            self.db = self._open()
        except sqlite3.DatabaseError as exc:
            aside = self.path.with_name(f"{INDEX_NAME}.damaged-{int(time.time())}")
            log.warning("recording index %s is damaged (%s): set aside as %s, rebuilt from the segment files",
                        self.path, exc, aside.name)
            self.path.rename(aside)
            for name in (INDEX_NAME + "-wal", INDEX_NAME + "-shm"):
                (folder / name).unlink(missing_ok=True)
            self.db = self._open()

    def _open(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10)
        except sqlite3.OperationalError as exc:
            raise ConfigError(f"recording index {self.path}: {exc}: name a folder this user can write") from None
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
            db.execute(f"PRAGMA journal_size_limit={WAL_PAGES * 4096}")
            if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("quick_check failed")
            db.executescript(_TABLES)
            found = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if found is None:
                db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA,))
            elif found[0] != SCHEMA:
                raise ConfigError(f"recording index {self.path} has schema {found[0]}, this jetpipe reads {SCHEMA}: "
                                  "record into another folder")
            _fill_media_events(db)
        except BaseException:
            db.close()
            raise
        return db

    # -- at start ----------------------------------------------------------------------------------------------
    def repair(self) -> dict:
        """Rows left open finished from their files, rows whose file is gone dropped, segment files no row
        names adopted. What it did, counted."""
        done = {"finished": 0, "dropped": 0, "adopted": 0}
        for row_id, path, start in self.db.execute("SELECT id, path, start FROM segments WHERE open = 1").fetchall():
            probed = repair(self.folder / path) if self._ours(path) else None
            if probed is None:  # nothing of it plays (its file, where ours, goes with the row)
                if self._ours(path):
                    (self.folder / path).unlink()
                self.forget_row(row_id)
                done["dropped"] += 1
            else:
                self.db.execute("UPDATE segments SET open = 0, end = ?, t1 = t0 + ?, bytes = ?, packets = ? "
                                "WHERE id = ?", (start + probed.seconds, probed.seconds,
                                                 (self.folder / path).stat().st_size, probed.packets, row_id))
                done["finished"] += 1
        known = set()
        for row_id, path in self.db.execute("SELECT id, path FROM segments").fetchall():
            if self._ours(path):
                known.add(path)
            else:
                self.forget_row(row_id)
                done["dropped"] += 1
        for path in self._segment_files():
            if path not in known:
                done["adopted"] += self._adopt(path)
        if any(done.values()):
            log.warning("recording index %s repaired: %d segment(s) left open finished, %d row(s) without a "
                        "playable file dropped, %d file(s) without a row adopted", self.path, done["finished"],
                        done["dropped"], done["adopted"])
        return done

    def _segment_files(self):
        """Relative paths of the folder's segment files (by name; links are never ours)."""
        for stream in sorted(self.folder.iterdir()):
            if not (STREAM_FOLDER.fullmatch(stream.name) and stream.is_dir() and not stream.is_symlink()):
                continue
            for day in sorted(stream.iterdir()):
                if not (DAY_FOLDER.fullmatch(day.name) and day.is_dir() and not day.is_symlink()):
                    continue
                for entry in os.scandir(day):
                    if SEGMENT_NAME.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                        yield f"{stream.name}/{day.name}/{entry.name}"

    def _adopt(self, path: str) -> int:
        start = start_of(path)
        probed = repair(self.folder / path) if start is not None else None
        if probed is None:
            return 0
        stream = int(STREAM_FOLDER.fullmatch(path.split("/")[0]).group(1))
        self.db.execute("INSERT INTO segments (stream, source, path, start, end, t0, bytes, packets, open) "
                        "VALUES (?, '', ?, ?, ?, NULL, ?, ?, 0)",
                        (stream, path, start, start + probed.seconds, (self.folder / path).stat().st_size,
                         probed.packets))
        return 1

    def _ours(self, path: str) -> bool:
        """A row's file is there as a regular file (a link in its place is someone else's: never read, cut or
        removed)."""
        file = self.folder / path
        return file.is_file() and not file.is_symlink()

    # -- while recording ---------------------------------------------------------------------------------------
    def begin(self, stream: int, source: str, path: str, start: float, t0: float) -> int:
        """The row of a segment about to be made (open = 1)."""
        return self.db.execute("INSERT INTO segments (stream, source, path, start, end, t0, bytes, packets, open) "
                               "VALUES (?, ?, ?, ?, ?, ?, 0, 0, 1)", (stream, source, path, start, start, t0)).lastrowid

    def forget_row(self, row_id: int) -> None:
        """A row gone (its file could not be made, or is gone, or was removed)."""
        self.db.execute("DELETE FROM segments WHERE id = ?", (row_id,))

    def finish(self, row_id: int, end: float, t1: float, size: int, packets: int, held: bool) -> None:
        self.db.execute("UPDATE segments SET open = 0, end = ?, t1 = ?, bytes = ?, packets = ?, held = ? "
                        "WHERE id = ?", (end, t1, size, packets, int(held), row_id))

    def drop(self, segment: Segment) -> None:
        """The segment's file and row removed (retention); its day's folder too once empty."""
        file = self.folder / segment.path
        file.unlink(missing_ok=True)
        self.forget_row(segment.id)
        try:
            file.parent.rmdir()  # only where empty: another segment of the day keeps it
        except OSError:
            pass

    def oldest(self, held: bool) -> Segment | None:
        """The oldest closed segment, held by an event or not."""
        row = self.db.execute("SELECT id, stream, path, start, end, bytes FROM segments WHERE held = ? AND open = 0 "
                              "ORDER BY start LIMIT 1", (int(held),)).fetchone()
        return None if row is None else Segment(*row)

    def ended_before(self, wall: float, held: bool, stream: int | None = None) -> list[Segment]:
        """Closed segments that ended before `wall` (of one stream, or all)."""
        query = "SELECT id, stream, path, start, end, bytes FROM segments WHERE held = ? AND open = 0 AND end < ?"
        args = [int(held), wall]
        if stream is not None:
            query, args = query + " AND stream = ?", args + [stream]
        return [Segment(*row) for row in self.db.execute(query + " ORDER BY start LIMIT 1000", args)]

    def closed_bytes(self, block: int = 1) -> int:
        """The closed segments' bytes, each rounded up to whole blocks of `block` bytes."""
        return self.db.execute("SELECT COALESCE(SUM((bytes + ? - 1) / ? * ?), 0) FROM segments WHERE open = 0",
                               (block, block, block)).fetchone()[0]

    def add_events(self, events: list) -> None:
        """Event records (events.record.EventRecord) in one transaction."""
        self.add_event_rows([event_row(e) for e in events])

    def add_event_rows(self, rows: list[tuple]) -> None:
        """Events' rows (event_row) in one transaction (the connection commits each statement on its own
        otherwise: 85 us an event, most of what indexing a busy run's events cost)."""
        with self.transaction():
            self.db.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)

    @contextlib.contextmanager
    def transaction(self):
        """What is written inside, committed at once (or not at all)."""
        self.db.execute("BEGIN")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def add_media(self, kind: str, path: str, stream: int, at: float, end: float | None, size: int,
                  events: list) -> None:
        with self.transaction():
            self.db.execute("INSERT OR REPLACE INTO media VALUES (?, ?, ?, ?, ?, ?, ?)",
                            (path, kind, stream, at, end, size, json.dumps(events)))
            self.db.executemany("INSERT OR IGNORE INTO media_events VALUES (?, ?)",
                                [(str(event), path) for event in events])

    def hold(self, stream: int, on_clock: tuple | None, on_wall: tuple | None) -> None:
        """The stream's closed segments that overlap a span of events with their pre- and post-roll are held:
        on_clock (from, to) on the stream's clock (the segments with a t0), on_wall (from, to) on the wall
        clock (events without a pts: every segment; with one: the segments rebuilt without a t0)."""
        if on_clock is not None:
            self.db.execute("UPDATE segments SET held = 1 WHERE stream = ? AND held = 0 AND t0 IS NOT NULL AND "
                            "t0 <= ? AND t1 >= ?", (stream, on_clock[1], on_clock[0]))
        if on_wall is not None:
            self.db.execute(f"UPDATE segments SET held = 1 WHERE stream = ? AND held = 0 AND "
                            f"{'t0 IS NULL AND ' if on_clock is not None else ''}start <= ? AND end >= ?",
                            (stream, on_wall[1], on_wall[0]))

    def event_near(self, stream: int, t0: float, t1: float, before_s: float, after_s: float) -> bool:
        """Whether an event of the stream lies within [t0 - after_s, t1 + before_s] on its clock (a segment
        that holds it)."""
        return self.db.execute("SELECT 1 FROM events WHERE stream = ? AND pts BETWEEN ? AND ? LIMIT 1",
                               (stream, t0 - after_s, t1 + before_s)).fetchone() is not None

    def forget_before(self, wall: float) -> None:
        """Events and media rows older than every kept segment (their recording went)."""
        self.db.execute("DELETE FROM events WHERE time < ?", (wall,))
        self.db.execute("DELETE FROM media_events WHERE path IN (SELECT path FROM media WHERE time < ?)", (wall,))
        self.db.execute("DELETE FROM media WHERE time < ?", (wall,))

    def oldest_start(self) -> float | None:
        return self.db.execute("SELECT MIN(start) FROM segments").fetchone()[0]

    def files_bytes(self) -> int:
        """The index's own files on disk (it, its write-ahead log and shared memory)."""
        total = 0
        for name in (INDEX_NAME, INDEX_NAME + "-wal", INDEX_NAME + "-shm"):
            try:
                info = (self.folder / name).lstat()
            except FileNotFoundError:
                continue
            total += max(info.st_size, info.st_blocks * 512)  # as du counts it (whole blocks)
        return total

    def close(self) -> None:
        try:
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self.db.close()
