"""The recording process (process.py spawns it): a Recorder (recorder.py) writing from its own ring of each
stream, filled with the packets the serving process's passes describe in the stream's arena.

Messages from the serving process: ("attach", stream, described, mode, template, capacity) and the arena's file
descriptor after it (capacity 0: no arena, the stream's packets are teed: teed.py), ("tee", stream,
from_first_key) and a connection's pipe after it, ("pass", streams, entries, offsets, ended), ("close",). To it:
("ready", repaired) or ("refused", one line) at the start, ("summary", counts) at the end. Its health goes
through a shared byte (HEALTH), read by the serving process's /healthz.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time
from collections import deque
from multiprocessing.reduction import recv_handle

from jetpipe.pipelines.config import ConfigError
from jetpipe.pipelines.ingest.packet_arena import ArenaReader
from jetpipe.pipelines.ingest.packet_ring import BACKWARDS_S, Gop
from jetpipe.pipelines.outputs.recording.recorder import NO_ROOM, THREAD_STOPPED, Recorder
from jetpipe.pipelines.outputs.recording.teed import TeedPackets
from jetpipe.video import Packet

log = logging.getLogger(__name__)

HEALTH = {1: NO_ROOM, 2: THREAD_STOPPED}
CODES = {why: code for code, why in HEALTH.items()}  # recorder.health()'s answer -> the shared byte
PR_SET_PDEATHSIG = 1


class ForwardedRing:
    """A stream's packets as the serving process handed them over, in GOPs: one is whole once the next
    keyframe came, or its stream ended (close_gop). The passes of the stream's clock (it went back: a looped
    file, a camera's reset) are kept apart (`generation`), each written to its end. What the recording wrote
    goes (pin); what waits is held up to max_bytes (the oldest go first: a gap the recording counts)."""

    def __init__(self, template: str, max_bytes: int):
        self.template, self.max_bytes = template, max_bytes
        self.time_base = None
        self.annexb = None
        self.lock = threading.Lock()
        self.adding = threading.Lock()  # add() and close_gop(): this process's main thread or a tee's reader
        self.gops: deque[tuple[int, Gop]] = deque()  # whole
        self.bytes = 0
        self.open: Gop | None = None  # the GOP packets are still coming for (under `adding`)
        self.passes = 0               # the stream's clock went back this many times
        self.newest = float("-inf")
        self.generation = -1          # the pass being followed
        self.ended = False
        self.cpu_s = 0.0  # (this process's time is counted whole)

    def add(self, packet: Packet) -> None:
        if packet.t < self.newest - BACKWARDS_S:  # a new pass: the last one's GOP is whole
            self.close_gop()
            self.passes += 1
            self.newest = float("-inf")
        if packet.key:
            self.close_gop()
            self.open = Gop()
        elif self.open is None:  # before a keyframe (the stream's first, or after packets that were not kept)
            return
        self.open.packets.append(packet)
        self.open.bytes += len(packet.data)
        if packet.t > self.newest:
            self.newest = packet.t

    def close_gop(self) -> None:
        gop, self.open = self.open, None
        if gop is None:
            return
        with self.lock:
            self.gops.append((self.passes, gop))
            self.bytes += gop.bytes
            while self.bytes > self.max_bytes and len(self.gops) > 1:
                self.bytes -= self.gops.popleft()[1].bytes

    def whole_gops_after(self, after: float, last_too: bool = False) -> tuple[int, list[Gop]]:
        """(generation, its GOPs that start after `after`): the oldest pass's first, until all are written."""
        with self.lock:
            if self.gops:
                self.generation = self.gops[0][0]
            return self.generation, [g for n, g in self.gops if n == self.generation and g.start > after]

    def pin(self, key, start: float) -> None:
        """The GOPs of the followed pass through the one starting at `start` were written: they go."""
        with self.lock:
            while self.gops and self.gops[0][0] == self.generation and self.gops[0][1].start <= start:
                self.bytes -= self.gops.popleft()[1].bytes

    def unpin(self, key) -> None:
        pass

    def end(self) -> None:
        with self.lock:
            self.ended = True


def recording_main(conn, config, before_s: float, after_s: float, ring_mb: float, media_reserve: int, state,
                   parent: int, log_level: int) -> None:
    """The process's entry (multiprocessing, spawned)."""
    # Ctrl-C reaches the whole process group, systemd's SIGTERM every process of the unit: the serving process
    # stops serving, then hands over the rest and asks this one to finish (killed with it: prctl)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not _dies_with(parent):
        return
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s recording-%(process)d %(message)s")
    try:
        recorder = Recorder(config, before_s, after_s, ring_mb, media_reserve)
    except ConfigError as exc:
        conn.send(("refused", str(exc)))
        return
    except Exception as exc:
        conn.send(("refused", f"record folder {config.folder}: {type(exc).__name__}: {exc}"))
        return
    started = time.process_time()
    conn.send(("ready", recorder.repaired))
    try:
        asked_to_close = _serve(conn, recorder, state, int(ring_mb * 1e6))
    except BaseException:
        _finish(conn, recorder, started)
        raise
    if not asked_to_close:
        # the serving process died: prctl's SIGKILL is on its way (its pipe ends first, in the kernel's exit).
        # Closing the segments now would race it; they are left as the kill leaves them, every time, and the
        # worker that takes the part over (or the next start) repairs them
        log.warning("recording: the serving process went without a stop; the open segments are left to the "
                    "next start's repair")
        os.kill(os.getpid(), signal.SIGKILL)  # the kill itself, sooner
    _finish(conn, recorder, started)


def _finish(conn, recorder, started: float) -> None:
    """The stop: the rings' GOPs written, the segments closed, the counts said."""
    recorder.close()
    summary = recorder.summary()
    summary["process_s"] = time.process_time() - started
    try:
        conn.send(("summary", summary))
    except OSError:
        pass


def _serve(conn, recorder, state, ring_bytes: int) -> bool:
    """Messages applied until ("close",) (True) or the serving process's end (False)."""
    rings: dict[int, tuple[ForwardedRing, ArenaReader | None]] = {}
    tees: dict[int, TeedPackets] = {}  # a teed stream's current connection's reader
    try:
        while True:
            try:
                message = conn.recv()
                if message[0] == "attach" and message[5]:
                    arena = ArenaReader(recv_handle(conn), message[5])
                elif message[0] == "tee":
                    fd = recv_handle(conn)
            except (EOFError, OSError):
                return False
            if message[0] == "close":
                return True
            if message[0] == "attach":
                _, stream_id, described, mode, template, capacity = message
                rings[stream_id] = (ForwardedRing(template, ring_bytes), arena if capacity else None)
                recorder.follow(stream_id, described, rings[stream_id][0], mode)
            elif message[0] == "tee":
                _tee(rings, tees, message[1], fd, message[2])
            else:
                _apply(recorder, rings, tees, *message[1:])
            state.value = CODES.get(recorder.health(), 0)
    finally:
        for _, arena in rings.values():
            if arena is not None:
                arena.close()


def _tee(rings: dict, tees: dict, stream_id: int, fd: int, from_first_key: bool) -> None:
    """A teed stream's new connection: its packets read from the pipe into the stream's ring (from_first_key:
    counted from its first keyframe, as a decoder process's frames are)."""
    ring, _ = rings.get(stream_id, (None, None))
    if ring is None:  # (removed meanwhile)
        os.close(fd)
        return
    tees[stream_id] = TeedPackets(fd, ring, str(stream_id), before=tees.get(stream_id),
                                  from_first_key=from_first_key)


def _apply(recorder, rings: dict, tees: dict, streams: list, entries: list, offsets: dict, ended: list) -> None:
    for stream_id, time_base, annexb, packets, last in streams:
        ring, arena = rings.get(stream_id, (None, None))
        if ring is None:
            continue
        with ring.adding:
            if arena is not None:
                ring.time_base, ring.annexb = time_base, annexb
                for packet in arena.packets(packets):
                    ring.add(packet)
            if last:
                ring.close_gop()
    recorder.inbox.extend(entries)
    for stream_id, offset in offsets.items():
        recording = recorder.streams.get(stream_id)
        if recording is not None:
            recording.seen_offset = offset
    for stream_id in ended:
        tee = tees.pop(stream_id, None)
        if tee is not None:  # its source was closed: the reader ends at its pipe's end, the last GOP whole
            tee.join()
        recorder.removed(stream_id)
        _, arena = rings.pop(stream_id, (None, None))
        if arena is not None:
            arena.close()


def _dies_with(parent: int) -> bool:
    """This process is killed when the serving process dies (Linux; elsewhere it leaves at the pipe's end, as if
    killed). False: that process died already (before the call)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return True
    return os.getppid() == parent
