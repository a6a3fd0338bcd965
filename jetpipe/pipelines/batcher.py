"""Multi-stream batching with bounded queues and drop-oldest when processing falls behind.

Memory cannot grow: each stream's queue holds at most `depth` frames; a new
frame pushes out the stream's oldest (counted as dropped, its ring slot freed).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field


@dataclass
class Packet:
    stream: int
    frame_no: int
    t_capture: float          # time.time() when the frame was captured
    frame: object             # jetpipe.runtime.api.Frame (a view into a ring slot)
    release: object           # callable freeing the ring slot
    pts: float | None = None  # the frame's time in its stream (seconds), where the source knows it
    t_monotonic: float = field(default_factory=time.monotonic)


class Batcher:
    def __init__(self, streams: int, max_batch: int, timeout_s: float, depth: int):
        self.max_batch, self.timeout_s, self.depth = max_batch, timeout_s, depth
        self.queues = [deque() for _ in range(streams)]
        self.dropped = [0] * streams
        self._cond = threading.Condition()
        self._next_stream = 0
        self.closed = False

    def put(self, packet: Packet, wait: bool = False) -> None:
        """Queue a frame; when the stream's queue is full, wait for room (files) or drop its oldest (cameras)."""
        with self._cond:
            queue = self.queues[packet.stream]
            while wait and len(queue) >= self.depth and not self.closed:
                self._cond.wait(timeout=0.1)
            if len(queue) >= self.depth:
                self._drop(packet.stream)
            queue.append(packet)
            self._cond.notify()

    def drop_oldest(self, stream: int) -> bool:
        """Free the oldest queued frame of a stream (its source needs the slot)."""
        with self._cond:
            if not self.queues[stream]:
                return False
            self._drop(stream)
            return True

    def _drop(self, stream: int) -> None:
        old = self.queues[stream].popleft()
        old.release()
        self.dropped[stream] += 1

    def reset(self, stream: int) -> None:
        """A new stream takes this queue (the control API reuses a slot): its drops count from zero."""
        with self._cond:
            self.dropped[stream] = 0

    def depths(self) -> list[int]:
        with self._cond:
            return [len(q) for q in self.queues]

    def abort(self) -> int:
        """Drop every queued frame (slots freed, counted as dropped) and close: a second Ctrl-C ends the
        drain. Returns how many were dropped."""
        with self._cond:
            dropped = 0
            for stream, queue in enumerate(self.queues):
                while queue:
                    self._drop(stream)
                    dropped += 1
            self.closed = True
            self._cond.notify_all()
            return dropped

    def close(self) -> None:
        """No more frames will come: next_batch drains what is queued, then returns []."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def next_batch(self, poll_s: float = 0.1) -> list[Packet] | None:
        """Up to max_batch frames, round robin over streams; waits for a full batch until the oldest queued
        frame has waited timeout_s (counted from its capture: a frame that queued while the GPU was busy has
        used up its wait already; counting from now added a whole timeout to the latency tail).

        Returns [] when nothing arrived within poll_s (caller checks for shutdown),
        None when closed and drained."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._total() > 0 or self.closed, timeout=poll_s):
                return []
            if self._total() == 0:
                return None
            deadline = min(q[0].t_monotonic for q in self.queues if q) + self.timeout_s
            while self._total() < self.max_batch and not self.closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._cond.wait(timeout=remaining):
                    break
            return self._take()

    def _total(self) -> int:
        return sum(len(q) for q in self.queues)

    def _take(self) -> list[Packet]:
        batch, streams = [], len(self.queues)
        while len(batch) < self.max_batch and self._total() > 0:
            queue = self.queues[self._next_stream]
            if queue:
                batch.append(queue.popleft())
            self._next_stream = (self._next_stream + 1) % streams
        self._cond.notify_all()  # producers waiting for room (files)
        return batch
