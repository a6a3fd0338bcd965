"""Capture threads that several streams share.

Every frame a capture thread reads gives up the GIL and takes it back a few times (the decode, the copy into
the ring slot, its synchronize): with a thread per stream, 64 NVDEC streams meant ~70 threads queueing for the
GIL, and the GPU stage waited behind them at every call that released it (issue 27: a light model held at
45-67 % of the decoder's rate, ~1.5 cores used, the GPU idle between launches). Streams whose reads never
block for long (files NVDEC decodes, synthetic cameras: `source.shares_thread`) are read in turn by a few
threads instead, one frame a turn; streams that can block (network, ffmpeg pipes, CPU decoders) keep a
thread of their own.

A stream's capture is a generator of steps (the daemon's `_capture_steps`): each step reads at most one frame
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

log = logging.getLogger(__name__)

ROOM = "room"  # a step's answer: my next turn when my stream's queue has room
POLL_S = 0.05  # the longest a group sleeps without looking at a stop or removal


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
