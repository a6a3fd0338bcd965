"""The recording in a process of its own (`--record DIR`): each stream's source copies its packets into an
arena the recording process maps too (ingest/packet_arena.py), and every POLL_S the serving process hands over
what is new in one message: the packets' places in the arenas, the index's entries of the records that came
(events, clips, snapshots) and the streams' clocks against the wall clock. The recording process (child.py)
copies the packets out into its own ring of each stream and writes the segments, the index and the budget with
the same Recorder a one-process recording used. A stream whose packets pass through a process of its own (an
NVDEC network camera's remux ffmpeg) has them written a second time to a pipe of the recording process instead,
and no arena (teed.py): this process never touches them.

Why a process: muxing, writing and indexing 16 busy 1080p30 streams took 3.9 % of the serving process's CPU,
inside its GIL, beside the frames (issue 67 asks for 1 %), and a slow disk's writes waited there. Handing a
pass over costs a tuple of seven numbers a packet and one pipe write.

The recording process dies with the serving process (kill -9 included: the index is repaired at the next start,
as before); a stop asks it to write what the rings hold and waits for it within CLOSE_WAIT_S.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.reduction import send_handle
from pathlib import Path

from jetpipe.pipelines.config import EVENT_TYPES, ConfigError, media_reserve
from jetpipe.pipelines.ingest.packet_arena import PacketArena, arena_bytes, link_arena
from jetpipe.pipelines.ingest.sources import packet_tap
from jetpipe.pipelines.outputs.recording.budget import Room
from jetpipe.pipelines.outputs.recording.child import HEALTH, recording_main
from jetpipe.pipelines.outputs.recording.recorder import (
    CLOSE_WAIT_S,
    INDEXED,
    POLL_S,
    indexed_entry,
    recordable,
)
from jetpipe.pipelines.outputs.recording.teed import TeePipe

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # the process is spawned (imports) and opens and repairs the index within this


@dataclass
class Forwarded:
    arena: PacketArena | None  # the stream's: its source copies the packets in (None: they are teed)
    source: object          # (its ring, the arena or a clips ring beside it, has the time base)
    removed: bool = False


class RecordingProcess:
    def __init__(self, config, before_s: float, after_s: float, ring_mb: float, media_reserve: int = 0):
        """As recorder.Recorder: the index opened and repaired (by the process) before serving starts;
        ConfigError where it cannot be."""
        self.folder = Path(config.folder)
        self.ring_bytes = int(ring_mb * 1e6)
        self.room = Room(config, config.max_size - media_reserve)
        context = multiprocessing.get_context("spawn")  # the serving process has CUDA: it cannot be forked
        self.state = context.Value("b", 0, lock=False)  # the process's health (child.HEALTH)
        self.conn, child = context.Pipe(duplex=True)
        self.process = context.Process(
            target=recording_main, name="jetpipe-recording", daemon=True,
            args=(child, config, before_s, after_s, ring_mb, media_reserve, self.state, os.getpid(),
                  logging.getLogger().getEffectiveLevel()))
        self.process.start()
        child.close()
        reply = self._reply(START_TIMEOUT_S)
        if reply is None or reply[0] != "ready":
            self._end_process()
            raise ConfigError(reply[1] if reply is not None else
                              f"record folder {self.folder}: the recording process did not start (its log says why)")
        self.repaired = reply[1]
        self.forwarded: dict[int, Forwarded] = {}
        self.inbox: deque = deque()     # records from the bus (appended in the producers' threads)
        self.offsets: dict[int, float] = {}  # a stream's wall clock - its clock, from its newest frame
        self.send_lock = threading.Lock()
        self.cond = threading.Condition()
        self.closing = False
        self.forwarding_s = 0.0         # the forwarding thread's CPU time, when it ended
        self.forgotten_rings_s = 0.0    # removed streams' arenas' CPU time
        self.forgotten_unkept = 0       # and the packets they did not keep
        self.teed = 0                   # streams attached whose packets never passed through this process
        self.written: dict | None = None  # the process's summary, at the stop
        self.tees: list[TeePipe] = []   # each teed stream's pipe (its last connection's read end kept: watch)
        self.tees_lock = threading.Lock()
        self.gone = False               # the process ended: the tees' pipes are drained here
        self.thread = threading.Thread(target=self._run, name="recording-forward", daemon=True)
        self.thread.start()
        threading.Thread(target=self._watch_process, name="recording-watch", daemon=True).start()

    # -- streams (the serving process's threads) ----------------------------------------------------------------
    def attach(self, stream_id: int, source, mode: str, at_start: bool = True) -> None:
        """Record the stream: its packets teed to the recording process by the process that receives them where
        its source can (teed.py), else copied by its source into an arena."""
        if not recordable(stream_id, source, mode, self.room, at_start):
            return
        arena = None
        try:
            with self.send_lock:  # the attach before a connection's pipe (the tee's), and the arena right after it
                teed = packet_tap.missing() is None and source.tee_packets(TeePipe(self, stream_id))
                if not teed:
                    arena = PacketArena(arena_bytes(source.bit_rate, self.ring_bytes))
                self.conn.send(("attach", stream_id, source.describe(), mode, source.source_uri.location,
                                0 if teed else arena.capacity))
                if arena is not None:
                    send_handle(self.conn, arena.fd, self.process.pid)
        finally:
            if arena is not None:
                arena.handed_over()
        if arena is not None:
            link_arena(source, arena)
        with self.cond:
            self.forwarded[stream_id] = Forwarded(arena, source)
        self.teed += arena is None

    def watch(self, tee: TeePipe) -> None:
        """A teed connection's read end is kept by `tee`: drained here once the process is gone (now, if it is),
        so that the process writing the copy never fails on it."""
        with self.tees_lock:
            if tee not in self.tees:
                self.tees.append(tee)
            if self.gone:
                tee.drain()

    def _watch_process(self) -> None:
        multiprocessing.connection.wait([self.process.sentinel])
        with self.tees_lock:
            self.gone = True
            for tee in self.tees:
                tee.drain()

    def removed(self, stream_id: int) -> None:
        """The stream was removed: what its arena holds is handed over, then it is forgotten (the thread)."""
        forwarded = self.forwarded.get(stream_id)
        if forwarded is not None:
            if forwarded.arena is not None:
                forwarded.arena.stop()
            forwarded.removed = True

    def on_frame(self, record) -> None:
        """A frame's record: the stream's clock against the wall clock (one store a frame)."""
        if record.pts is not None and record.stream in self.forwarded:
            self.offsets[record.stream] = record.t_capture - record.pts

    def on_record(self, record) -> None:
        """An event, clip_ready or snapshot_ready record: its index entry goes with the next pass."""
        self.inbox.append(record)

    # -- the forwarding thread ----------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    if not self.closing:
                        self.cond.wait(timeout=POLL_S)
                    closing = self.closing
                self._forward(last_too=closing)
                if closing:
                    self._send(("close",))
                    return
        except (OSError, EOFError, ValueError) as exc:  # the process went: health() says so
            log.warning("recording: the recording process cannot be reached (%s); serving goes on", exc)
        except Exception:
            log.exception("recording stopped: its forwarding thread failed (serving goes on)")
        finally:
            self.forwarding_s = time.thread_time()

    def _forward(self, last_too: bool) -> None:
        """What is new since the last pass, in one message: each stream's packets (their places in its arena),
        and whether its last GOP is whole (its stream ended, or was removed, or the stop); the records'
        entries; the clocks' offsets; the removed streams (handed over to their end)."""
        streams, ended = [], []
        for stream_id, forwarded in list(self.forwarded.items()):
            arena = forwarded.arena
            if arena is None:  # teed: only whether its last GOP is whole
                if last_too or forwarded.removed:
                    streams.append((stream_id, None, None, [], True))
            else:
                packets, last = arena.take()
                last = last or last_too or forwarded.removed
                if packets or last:
                    ring = forwarded.source.packet_ring or arena
                    streams.append((stream_id, ring.time_base, ring.annexb, packets, last))
            if forwarded.removed:
                if arena is not None:
                    self.forgotten_rings_s += arena.cpu_s
                    self.forgotten_unkept += arena.lost
                ended.append(stream_id)
                with self.cond:
                    del self.forwarded[stream_id]
        entries = [indexed_entry(self.inbox.popleft()) for _ in range(len(self.inbox))]
        self._send(("pass", streams, entries, dict(self.offsets), ended))

    def _send(self, message: tuple) -> None:
        with self.send_lock:
            self.conn.send(message)

    def _reply(self, timeout: float):
        """The process's next message, None where none came within timeout or it went."""
        try:
            return self.conn.recv() if self.conn.poll(timeout) else None
        except (OSError, EOFError):
            return None

    # -- the run ------------------------------------------------------------------------------------------------
    def health(self) -> str | None:
        """Why recording is degraded now (None: it is not)."""
        if self.closing:
            return None
        if not self.process.is_alive():
            return "recording: its process stopped"
        if not self.thread.is_alive():
            return "recording: its forwarding thread stopped"
        return HEALTH.get(self.state.value)

    def summary(self) -> dict:
        """The process's counts (at the stop), with the CPU time recording cost: the serving process's part
        (copying packets into the arenas, and handing them over) apart."""
        written = dict(self.written or {"folder": str(self.folder), "segments": 0, "failed": 0, "lost_gops": 0,
                                        "refused_gops": 0, "removed_for_room": 0, "bytes": 0,
                                        "process_exited": self.process.exitcode is not None})
        written.setdefault("repaired", self.repaired)
        process_s = written.pop("process_s", 0.0)
        for key in ("cpu_s", "writing_s", "rings_s"):
            written.pop(key, None)
        arenas = [f.arena for f in list(self.forwarded.values()) if f.arena is not None]
        kept = sum(a.cpu_s for a in arenas) + self.forgotten_rings_s
        serving = kept + self.forwarding_s
        return {**written, "teed_streams": self.teed,
                "unkept_packets": sum(a.lost for a in arenas) + self.forgotten_unkept,
                "cpu_s": round(process_s + serving, 3), "serving_process_s": round(serving, 3),
                "rings_s": round(kept, 3), "forwarding_s": round(self.forwarding_s, 3),
                "recording_process_s": round(process_s, 3)}

    def process_cpu_s(self) -> float:
        """The recording process's CPU time since it was ready, as it said at the stop."""
        return (self.written or {}).get("process_s", 0.0)

    def close(self) -> None:
        """The rings' last GOPs handed over; the process writes them, closes the segments and the index, and
        says its counts; all within CLOSE_WAIT_S (then it is killed: its open segments are repaired at the next
        start)."""
        deadline = time.monotonic() + CLOSE_WAIT_S + 2.0
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        self.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        reply = self._reply(max(0.0, deadline - time.monotonic())) if not self.thread.is_alive() else None
        if reply is not None and reply[0] == "summary":
            self.written = reply[1]
        else:
            log.warning("recording: the last segments were not closed within %.0f s (they are repaired at the next "
                        "start)", CLOSE_WAIT_S)
        self._end_process()

    def _end_process(self) -> None:
        self.process.join(timeout=2.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=2.0)
        self.conn.close()


def open_recorder(config, bus, streams, closers: list):
    """The recording where [record] folder is set (None elsewhere), in a process of its own (process.py): the
    configured streams attached, its close among the closers, the frames' records (the wall clock) and the
    events, clips and snapshots (the index) subscribed to."""
    if not config.record.folder:
        return None
    recorder = RecordingProcess(config.record, config.clips.before_s, config.clips.after_s, config.clips.ring_mb,
                                media_reserve(config))
    closers.append(recorder.close)
    for stream in streams:
        recorder.attach(stream.id, stream.source, stream.spec.record or config.record.mode)
    bus.subscribe(recorder.on_frame, types=[None])
    bus.subscribe(recorder.on_record, types=[*EVENT_TYPES, *INDEXED])
    return recorder
