"""Capture: each stream read into its ring and its frames queued for the batcher (Capture), in threads that
several streams share (CaptureGroup) or a thread of its own.

Every frame a capture thread reads gives up the GIL and takes it back a few times (the decode, the copy into
the ring slot, its synchronize): with a thread per stream, 64 NVDEC streams meant ~70 threads queueing for the
GIL, and the GPU stage waited behind them at every call that released it (issue 27: a light model held at
45-67 % of the decoder's rate, ~1.5 cores used, the GPU idle between launches). Streams whose reads never
block for long (files NVDEC decodes, synthetic cameras: `source.shares_thread`) are read in turn by a few
threads instead, one frame a turn; streams that can block (network, ffmpeg pipes, CPU decoders) keep a
thread of their own.

A stream's capture is a generator of steps (`Capture.steps`): each step reads at most one frame
and then says when the stream wants its next turn: after a delay in seconds (a --realtime pace, a reconnect's
backoff, a ring with no free slot) or, as ROOM, once its batcher queue has room (a file keeps every frame).
The group waits on a condition of the batcher's lock that the batcher notifies when it takes one of these
streams' frames, so a file waiting for room is woken by the batch that makes it, not found by polling.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass

from jetpipe.pipelines.ingest.batcher import QueuedFrame
from jetpipe.pipelines.ingest.sources import EndOfStream

log = logging.getLogger(__name__)

ROOM = "room"  # a step's answer: my next turn when my stream's queue has room
POLL_S = 0.05  # the longest a group sleeps without looking at a stop or removal
STALL_MIN_S = 5.0  # a live stream is stalled after max(this, 10 frame periods) without a frame
# and one still opening (no first frame yet) is ended after this at least (stall_timeout_s auto): FFmpeg reads an
# MPEG-TS stream (udp, tcp, srt, http) for its analyzeduration, 5 s, before it says what the stream holds, since
# more programs may come; sent in real time, that is 5 s of waiting, twice on the FFmpeg path (ffprobe, then the
# decoder: 5.5 s each on a TCP camera), which the 5-s stall timeout cut off, connection after connection. (tcp, udp,
# srt and RTSP are now read with the analysis ended at the codec, sources.ffmpeg.streaming_args; HTTP is not, and a
# camera joined between keyframes opens at the next one, seconds away where its keyframes are.)
OPEN_MIN_S = 15.0


def capture_threads(asked: int) -> int:
    """How many shared capture threads: as asked, or (0) half the cores."""
    return asked if asked > 0 else max(1, (os.cpu_count() or 2) // 2)


@dataclass
class _Member:
    handle: object   # the daemon's Stream: .slot, .stop
    steps: object    # its capture generator
    due: float = 0.0  # monotonic time of its next turn
    wants_room: bool = False


class CaptureGroup:
    """One thread reading several streams in turn, round robin among those whose turn has come."""

    def __init__(self, name: str, room: threading.Condition, has_room, stopping: threading.Event, start_thread):
        """room: a condition on the batcher's lock, notified when a frame of a member's stream is taken;
        has_room(slot): whether the stream's queue has room (called with that lock held);
        start_thread(target, name): a started thread running target (the daemon's, which counts its CPU)."""
        self.name = name
        self.room, self._has_room, self._stopping = room, has_room, stopping
        self._start_thread = start_thread
        self._members: list[_Member] = []
        self._running = False
        self._turn = 0

    def __len__(self) -> int:
        return len(self._members)

    def add(self, handle, steps) -> None:
        """Read this stream's steps in the group's thread (started again if it had ended with its last member)."""
        with self.room:
            self._members.append(_Member(handle, steps))
            self.room.notify()
            if not self._running:
                self._running = True
                self._start_thread(self._run, self.name)

    def wake(self) -> None:
        """Look at the members now (a stop or a removal was asked)."""
        with self.room:
            self.room.notify()

    def _run(self) -> None:
        while True:
            with self.room:
                member = self._next_turn()
                if member is None:  # its last member ended: the thread ends, add() starts another
                    self._running = False
                    return
            self._step(member)  # outside the lock: a step queues its frame under it

    def _next_turn(self) -> _Member | None:
        """The next member whose turn has come (a stopping one at once: its steps end), waiting until one has;
        None when there is none left. Called with the lock held."""
        while self._members:
            now, soonest, count = time.monotonic(), math.inf, len(self._members)
            for k in range(count):
                index = (self._turn + k) % count
                member = self._members[index]
                stopping = self._stopping.is_set() or member.handle.stop.is_set()
                if stopping or (member.wants_room and self._has_room(member.handle.slot)) or \
                        (not member.wants_room and member.due <= now):
                    self._turn = index + 1
                    return member
                if not member.wants_room:
                    soonest = min(soonest, member.due)
            self.room.wait(timeout=min(max(0.0, soonest - now), POLL_S))
        return None

    def _step(self, member: _Member) -> None:
        try:
            answer = next(member.steps)
        except StopIteration:
            answer = None
        except Exception:  # a fault in the step itself (its source's failures it handles): this stream ends
            log.exception("capture of stream slot %d failed", member.handle.slot)
            answer = None
        if answer is None:
            with self.room:
                self._members.remove(member)
            return
        member.wants_room = answer is ROOM
        member.due = 0.0 if member.wants_room else time.monotonic() + answer


class Capture:
    """Reads each stream into its ring, a frame a step, and queues the frames for the batcher; restarts a live
    stream that went silent (a stall)."""

    def __init__(self, config, streams, batcher, metrics, stopping: threading.Event):
        self.config, self.streams, self.batcher, self.metrics = config, streams, batcher, metrics
        self.stopping = stopping
        self.last_frame: list[float | None] = [None] * streams.capacity  # when each slot's stream last gave a frame
        self.opening = [False] * streams.capacity  # in open(): a silence then is no stall but a failed connection

    def run(self, handle) -> None:
        """A stream's capture in a thread of its own: its steps, sleeping where they ask to."""
        for wait in self.steps(handle, shared=False):
            if wait > 0:
                handle.stop.wait(wait)

    def steps(self, handle, shared: bool):
        """Read the stream into its ring, a frame a step; yield when the next step should run: in seconds, or
        ROOM (shared only: once its queue has room). A source in a shared thread is paced here (its due_in())
        and never waits inside a step; in a thread of its own it waits where it reads."""
        try:
            yield from self._loop(handle, shared)
        finally:
            handle.done.set()

    def _loop(self, handle, shared: bool):
        stream, source, ring, config = handle.slot, handle.source, self.streams.rings[handle.slot], self.config
        backoff, read, info = 0.5, 0, None
        frame_no = self.streams.frame_number(handle, 0)  # a restarted worker's goes on
        running = lambda: not (self.stopping.is_set() or handle.stop.is_set())  # noqa: E731
        while running() and not (config.frames and frame_no is not None and frame_no >= config.frames):
            slot = None
            try:
                if info is None:
                    # the stall timer runs during the open too: a camera that accepts the connection and sends
                    # nothing would otherwise hold this stream in open() until serve is stopped. The opening lasts
                    # until the connection's first frame (queue_frame): a decoder process started by open() may
                    # read the stream for seconds before it decodes (an MPEG-TS camera: FFmpeg's 5 s, OPEN_MIN_S)
                    self.last_frame[stream] = time.monotonic()
                    self.opening[stream] = True
                    try:
                        info = source.open()
                    except BaseException:
                        self.opening[stream] = False
                        raise
                    backoff = 0.5
                    self.last_frame[stream] = time.monotonic()
                if shared:
                    due = source.due_in()
                    if due > 0:
                        yield due
                        continue
                    if not source.live and not self.batcher.has_room(stream):  # files wait for room
                        yield ROOM
                        continue
                slot = self.free_slot(stream, source.live)
                if slot is None:  # every slot is in flight on the GPU: wait briefly
                    yield 0.001
                    continue
                view = ring.view(slot, info.format, info.height, info.width)
                pts, ready = source.read_queued(view)
                if frame_no is None:  # a file's frame delivered by the worker before this one (Streams.resume)
                    ring.release(slot)
                else:  # files wait for room (every frame is processed); cameras push out their oldest frame
                    self.queue_frame(stream, ring, slot, info, frame_no, pts, source.live, wait=not source.live,
                                     ready=ready)
                read += 1
                frame_no = self.streams.frame_number(handle, read)
                if shared:
                    yield 0.0
            except EndOfStream:
                if slot is not None:
                    ring.release(slot)
                log.info("source %d (%s) ended after %d frames, %d decode error(s)", handle.id, source.describe(),
                         read, source.decode_errors)
                source.close()
                handle.state = "ended" if handle.state == "running" else handle.state
                return
            except Exception as exc:  # disconnect, decode error, device gone: back off and reconnect
                if slot is not None:
                    ring.release(slot)
                if not running():  # stop() or a removal interrupted it: an end, not a failure
                    break
                source.close()
                self.metrics.count("failed", stream)
                self.metrics.count("reconnects", stream)
                log.warning("source %d (%s): %s; reconnecting in %.1f s", handle.id, source.describe(), exc,
                            backoff)
                info = None
                yield backoff
                backoff = min(backoff * 2, config.reconnect_max_s)
        # stopped, removed or at its frame limit: the source stays open until its frames are through and is
        # closed then (Ingest.retire, or close() after the drain). Closing a hardware decoder frees its memory
        # with the GIL held, ~10 ms each: at a stop every stream's at once stalled the batches still draining
        # (32 NVDEC streams: the last batches waited 350 ms, the whole process frozen)

    def queue_frame(self, stream: int, ring, slot: int, info, frame_no: int, pts: float | None, live: bool,
                    wait: bool, ready=None) -> None:
        """A frame its source wrote into ring slot `slot`, captured now, to the batcher (wait: for room; ready:
        the event its copy into the slot completes, where the source did not wait for it)."""
        t_capture = time.time()
        frame = ring.frame(slot, info.format, info.height, info.width, info.standard, info.range)
        frame.ready = ready
        self.batcher.put(QueuedFrame(stream, frame_no, t_capture, frame, _releaser(ring, slot), pts=pts, live=live),
                         wait=wait)
        self.metrics.count("captured", stream)
        self.last_frame[stream] = time.monotonic()
        self.opening[stream] = False

    def free_slot(self, stream: int, live: bool):
        """A free ring slot for the stream's next frame; a live stream's oldest queued frame gives up its own."""
        ring = self.streams.rings[stream]
        slot = ring.acquire()
        if slot is None and live and self.batcher.drop_oldest(stream):
            slot = ring.acquire()
        return slot

    def restart_stalled(self) -> None:
        """A live stream connected but silent for its stall timeout (a camera that stopped sending) is a stall:
        logged, counted, and its connection ended so that capture reconnects. One still opening that long (it
        accepted the connection and sent nothing) never connected: its open is ended the same way, and the
        failed open counts as a failure and a reconnect (capture's), not as a stall."""
        now = time.monotonic()
        for stream in self.streams.live():
            slot, source = stream.slot, stream.source
            last, opening = self.last_frame[slot], self.opening[slot]
            if last is None or not source.live or now - last < self._stall_timeout(source, opening):
                continue
            self.last_frame[slot] = None  # once per stall: the next frame (or reconnect) arms it again
            if not opening:
                self.metrics.count("stalls", slot)
            restarted = source.restart()
            log.warning("source %d (%s): %s %.1f s%s", stream.id, source.uri,
                        "not connected after" if opening else "no frame for", now - last,
                        "; reconnecting" if restarted else "; this source cannot be restarted")

    def _stall_timeout(self, source, opening: bool = False) -> float:
        if self.config.stall_timeout_s:
            return self.config.stall_timeout_s
        fps = source.info.fps if source.info is not None and source.info.fps else 0.0
        return max(OPEN_MIN_S if opening else STALL_MIN_S, 10 / fps if fps > 0 else 0.0)


def _releaser(ring, slot):
    return lambda: ring.release(slot)
