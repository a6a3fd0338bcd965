"""Continuous recording (`--record DIR`, [record]): every stream's own packets written as segments
(segments.py), indexed with the run's events, clips and snapshots (index.py), within a budget of size, age and
free space (budget.py).

One thread writes: every POLL_S it indexes the records that came (events hold the segments around them),
then writes each stream's whole GOPs (stream.py), and every RETAIN_S removes what is past its age (and, for a
stream recorded in `events` mode, the segments no event holds once no event can still come for them). The
sources' threads only copy packets; nothing here decodes or encodes. One recorder writes a folder at a time
(lock.py).

A serve runs it in the recording process (process.py, child.py), from that process's rings, filled from the
arenas the sources copy their packets into (ingest/packet_arena.py); the tests drive it in their own process
too, from the sources' rings.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from pathlib import Path

from jetpipe.pipelines.ingest.packet_ring import shared_ring
from jetpipe.pipelines.outputs.recording.budget import Budget, Room
from jetpipe.pipelines.outputs.recording.index import EVENT_PTS, EVENT_STREAM, EVENT_TIME, RecordIndex, event_row
from jetpipe.pipelines.outputs.recording.lock import hold_folder, release_folder
from jetpipe.pipelines.outputs.recording.stream import StreamRecording

log = logging.getLogger(__name__)

POLL_S = 0.5
RETAIN_S = 5.0
EVENT_LAG_S = 15.0   # an event reaches the recorder at most this long after its frame was captured (events mode)
KEEP_S = 4.0         # the ring keeps at least this much for the recorder (it follows a GOP behind, every POLL_S)
CLOSE_WAIT_S = 10.0  # at the stop, the last GOPs are written within this
INDEXED = ("clip_ready", "snapshot_ready")  # with the event types: the records the index keeps
NO_ROOM = "recording: no room on its disk or in its budget, stretches not recorded"  # health()
THREAD_STOPPED = "recording: its thread stopped"


class Recorder:
    def __init__(self, config, before_s: float, after_s: float, ring_mb: float, media_reserve: int = 0):
        """config: RecordConfig (checked: sizes in bytes, ages in seconds); before_s, after_s: the pre- and
        post-roll around an event ([clips]); ring_mb: a stream's packets kept at most while not yet written;
        media_reserve: the bytes of max_size the clips and snapshots may hold (config.media_reserve). The
        index is opened and repaired here, before serving starts (ConfigError where it cannot be)."""
        self.config, self.before_s, self.after_s = config, before_s, after_s
        self.ring_bytes = int(ring_mb * 1e6)
        self.segment_s = config.segment_s
        self.folder = Path(config.folder)
        self.lock = hold_folder(self.folder)  # before the repair: another recording's open segments are its own
        try:
            self.index = RecordIndex(self.folder)
            self.repaired = self.index.repair()
        except BaseException:
            release_folder(self.lock)
            raise
        self.max_bytes = config.max_size - media_reserve  # the segments' and the index's share
        self.budget = Budget(self.index, self.max_bytes, config.min_free)
        self.gap_s = 0.5  # a jump in the stream's clock beyond this between GOPs is a gap
        self.streams: dict[int, StreamRecording] = {}
        self.gone: list[StreamRecording] = []  # removed streams (their counts stay in the summary)
        self.inbox: deque = deque()   # the index's entries of records (indexed_entry), as they come
        self.room = Room(config, self.max_bytes)
        self.cond = threading.Condition()
        self.closing = False
        self.cpu_s = 0.0
        self._retained_at = 0.0
        self.thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self.thread.start()

    # -- streams ------------------------------------------------------------------------------------------------
    def attach(self, stream_id: int, source, mode: str, at_start: bool = True) -> None:
        """Record the stream's packets (mode all | events | off). A budget that cannot hold two segments of
        the streams at their bit rates (one written, one kept): one line at start-up (ConfigError)."""
        if recordable(stream_id, source, mode, self.room, at_start):
            self.follow(stream_id, source.describe(), shared_ring(source, KEEP_S, self.ring_bytes), mode)

    def follow(self, stream_id: int, described: str, ring, mode: str) -> None:
        """Write what the ring holds (the source's, or the recording process's copy of it)."""
        recording = StreamRecording(stream_id, described, ring, mode)
        with self.cond:
            self.streams[stream_id] = recording
        log.info("stream %d: recorded (%s) into %s, %g-s segments", stream_id, mode, self.folder, self.segment_s)

    def removed(self, stream_id: int) -> None:
        """The stream was removed: what its ring holds is written, then it is forgotten (the thread)."""
        recording = self.streams.get(stream_id)
        if recording is not None:
            recording.ring.end()
            recording.removed = True

    # -- the thread ---------------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    if not self.closing:
                        self.cond.wait(timeout=POLL_S)
                    closing = self.closing
                self._pass(last_too=closing)
                if closing:
                    return
        except Exception:
            log.exception("recording stopped: the recorder's thread failed (serving goes on)")
        finally:
            self._end()
            self.cpu_s = time.thread_time()

    def _pass(self, last_too: bool) -> None:
        self._index_records()
        for stream_id, recording in list(self.streams.items()):
            recording.follow(self, last_too or recording.ring.ended)
            if recording.removed and recording.ring.ended:
                recording.close(self)
                recording.end()
                with self.cond:
                    self.gone.append(self.streams.pop(stream_id))
        if time.monotonic() - self._retained_at >= RETAIN_S:
            self._retained_at = time.monotonic()
            self._retain()

    def _index_records(self) -> None:
        events = []
        for _ in range(len(self.inbox)):
            entry = self.inbox.popleft()
            if entry[0] == "clip":
                _, path, stream, start, end, size, of = entry
                offset = self._offset(stream)
                self.index.add_media("clip", path, stream, start + offset, end + offset, size, of)
            elif entry[0] == "snapshot":
                _, path, stream, pts, size, of = entry
                at = (pts + self._offset(stream)) if pts is not None else time.time()
                self.index.add_media("snapshot", path, stream, at, None, size, of)
            else:
                events.append(entry[1])
        if events:
            self.index.add_event_rows(events)
            self._hold(events)

    def _hold(self, events: list[tuple]) -> None:
        """The segments around the events (their rows) held: one span a stream (a pass's events of a stream lie
        within about POLL_S of each other; 255 events a second in a busy run cost 510 updates a second one by
        one)."""
        by_stream: dict[int, list] = {}
        for event in events:
            by_stream.setdefault(event[EVENT_STREAM], []).append(event)
        for stream, some in by_stream.items():
            clock = [e[EVENT_PTS] for e in some if e[EVENT_PTS] is not None]
            wall = [e[EVENT_TIME] for e in some]
            self.index.hold(stream, (min(clock) - self.before_s, max(clock) + self.after_s) if clock else None,
                            (min(wall) - self.before_s, max(wall) + self.after_s))

    def _offset(self, stream_id: int) -> float:
        recording = self.streams.get(stream_id)
        if recording is None:
            return 0.0
        for found in (recording.offset, recording.seen_offset):
            if found is not None:
                return found
        return 0.0

    def _retain(self) -> None:
        """Segments past their age, and in events mode those no event holds once none can still come."""
        now, config = time.time(), self.config
        if config.max_age:
            self._drop(self.index.ended_before(now - config.max_age, held=False))
        if config.events_max_age:
            self._drop(self.index.ended_before(now - config.events_max_age, held=True))
        for recording in [r for r in self.streams.values() if r.mode == "events"]:
            self._drop(self.index.ended_before(now - self.before_s - EVENT_LAG_S, held=False, stream=recording.stream))
        oldest = self.index.oldest_start()
        if oldest is not None:  # the events and media rows of recordings that went
            self.index.forget_before(oldest - self.before_s - self.after_s)

    def _drop(self, segments) -> None:
        for segment in segments:
            self.budget.drop(segment)

    def _end(self) -> None:
        """Every segment closed; in events mode, those no event holds go (every event of the run has come)."""
        try:
            for recording in self.streams.values():
                try:
                    recording.close(self)
                finally:
                    recording.end()
            self._index_records()
            for recording in [r for r in self.streams.values() if r.mode == "events"]:
                self._drop(self.index.ended_before(float("inf"), held=False, stream=recording.stream))
        finally:
            try:
                self.index.close()
            finally:
                release_folder(self.lock)

    # -- the run ------------------------------------------------------------------------------------------------
    def health(self) -> str | None:
        """Why recording is degraded now (None: it is not)."""
        if self.budget.degraded():
            return NO_ROOM
        if not self.thread.is_alive() and not self.closing:
            return THREAD_STOPPED
        return None

    def summary(self) -> dict:
        streams = [*self.streams.values(), *self.gone]
        # keeping the packets (the sources' threads, where no clips keep them anyway) and writing them (this thread)
        kept = sum(r.ring.cpu_s for r in streams)
        return {"folder": str(self.folder), "segments": sum(r.written for r in streams),
                "failed": sum(r.failed for r in streams), "lost_gops": sum(r.lost for r in streams),
                "refused_gops": self.budget.refused, "removed_for_room": self.budget.removed,
                "bytes": self.budget.closed, "max_bytes": self.config.max_size,
                "for_clips_and_snapshots": self.config.max_size - self.max_bytes, "repaired": self.repaired,
                "cpu_s": round(self.cpu_s + kept, 3), "writing_s": round(self.cpu_s, 3), "rings_s": round(kept, 3)}

    def close(self) -> None:
        """The GOPs the rings hold written, the segments closed, the index checkpointed (bounded)."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        self.thread.join(timeout=CLOSE_WAIT_S)
        if self.thread.is_alive():
            log.warning("recording: the last segments were not closed within %.0f s (they are repaired at the next "
                        "start)", CLOSE_WAIT_S)


def recordable(stream_id: int, source, mode: str, room: Room, at_start: bool) -> bool:
    """Whether the stream is recorded: its mode is not off, its source keeps the compressed packets, and the
    budget has room for two of its segments (Room.take: one line at start-up where it has not)."""
    if mode == "off":
        return False
    if not source.keeps_packets:
        log.warning("stream %d (%s): not recorded: its frames come decoded, without the compressed packets a "
                    "recording is made of", stream_id, source.describe())
        return False
    room.take(stream_id, source.bit_rate, at_start)
    return True


def indexed_entry(record) -> tuple:
    """What the index keeps of an event, clip_ready or snapshot_ready record: ("event", its row), ("clip", path,
    stream, start, end, bytes, events) or ("snapshot", path, stream, pts, bytes, events) (the stream's clock)."""
    if record.type == "clip_ready":
        return ("clip", record.path, record.stream, record.start, record.end, record.bytes, record.events)
    if record.type == "snapshot_ready":
        return ("snapshot", record.path, record.stream, record.pts, record.bytes, record.events)
    return ("event", event_row(record))
