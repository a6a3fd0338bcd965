"""Multi-stream batching with bounded queues and drop-oldest when processing falls behind.

Memory cannot grow: each stream's queue holds at most `depth` frames; a new
frame pushes out the stream's oldest (counted as dropped, its ring slot freed).

When to cut a batch: at once when it is full; otherwise when its oldest frame has waited timeout_s, or,
with a latency budget, at the latest moment that still leaves the oldest frame its budget once one more
frame's batch has run (the engine's time per batch size and the frames' arrival rate are measured while
serving: cut_deadline()). A frame not expected before that moment is not waited for. Nor is a batch made
larger than the budget allows: under overload a frame waits for the batch ahead of it to run, then runs in
its own, so a batch whose run, as measured, takes longer than half the budget breaks it however soon it is
cut (an engine that needs 1.4 s for 8 frames and 0.35 s for 2 on the CPU, a budget of 1 s: batches of 2;
budget_batch()). Under overload, a
live frame (camera, --realtime file) that has waited longer than the budget by the time its batch is taken
is dropped (counted), not run: its results would come too late anyway, and running it would make every
frame behind it late too; its stream's next frame runs in that turn. Files without --realtime are never
dropped. Where the runtime times its batches before serving (the CPU runtime: plan()),
the budget is planned from the start, and one a frame's own run makes impossible is said at start-up.

The engine time is what the GPU spent on a batch (CUDA events around its work on the compute stream), not
the time from submission to results: that includes waiting behind the batches already on the GPU, and a
budget cutting earlier whenever the GPU is busy makes smaller batches that keep it busier. Arrivals are
expected per stream (each stream's last frame + its own interval): cameras started together deliver in
bursts, and one average gap over all streams mistook the quiet after a burst for a frame about to come.

A partial batch past its deadline is held while the device has two batches it has not finished (one running,
one waiting behind it: batches_running): a batch cut then could not start any sooner, and the frames that come
meanwhile join it. Cut at its timeout, every partial batch went to the device's queue, as deep as the daemon's
buffer sets: near the engine's rate, cameras out of step (each on its own clock, as free-running cameras are) fill
a batch only over its timeout, and their frames could wait behind three batches. 32 such cameras on an H100: median
latency 35 -> 21 ms (p99 not changed); 32 files in step (full batches at once) and 16 files: unchanged.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field

log = logging.getLogger(__name__)
EMA = 0.2  # weight of the newest measurement in the engine-time and arrival averages
HOLD_POLL_S = 0.001  # a held batch looks at the device this often (frames coming wake it sooner)
HELD_WHILE_RUNNING = 2  # batches the device has not finished that hold a partial batch: one runs, one waits
BACKLOG_TAIL_S = 1.0  # a stream's drops this soon after its last backlog drop are that backlog's tail


@dataclass
class QueuedFrame:
    """A frame waiting in the batcher for its batch (a compressed packet is jetpipe.video.Packet)."""

    stream: int
    frame_no: int
    t_capture: float          # time.time() when the frame was captured
    frame: object             # jetpipe.runtime.api.Frame (a view into a ring slot)
    release: object           # callable freeing the ring slot
    pts: float | None = None  # the frame's time in its stream (seconds), where the source knows it
    t_monotonic: float = field(default_factory=time.monotonic)
    live: bool = False        # a camera or a --realtime file: may be dropped when it is too old to be worth it
    read: object = None       # the frame where the primary's kernel read it, set when its batch is collected (the
    #                           GPU runtime: device memory, held until release; None: `frame` itself)

    def as_read(self):
        """The frame as the primary read it: where `read` says (its crops are cut there, no upload), else
        `frame`."""
        return self.read if self.read is not None else self.frame


def cut_deadline(oldest: float, queued: int, max_batch: int, timeout_s: float, budget_s: float | None,
                 engine_s, next_arrival: float) -> float:
    """When to cut a batch of `queued` frames whose oldest was queued at `oldest` (monotonic seconds): -inf
    (now) when it is full; else oldest + timeout_s, and with a budget no later than the moment that leaves the
    oldest frame its budget after a batch of one more frame ran (engine_s(n): seconds for a batch of n); when
    the next frame is expected after that moment (next_arrival), now: waiting would only add latency."""
    if queued >= max_batch:
        return -math.inf
    deadline = oldest + timeout_s
    if budget_s is not None:
        deadline = min(deadline, oldest + budget_s - engine_s(queued + 1))
        if next_arrival > deadline:
            return -math.inf
    return deadline


def budget_batch(engine_s: list[float], budget_s: float) -> int:
    """The largest batch size whose engine time fits half the budget (the batch ahead's run, then its own),
    at least 1. engine_s[n]: measured seconds for a batch of n (0: not measured). A size not measured is
    estimated from the nearest measured one, scaled by its frames: an engine at most linear in its batch. On a
    GPU, which gains from batching, that overestimates a larger size; the sizes the budget then allows are
    measured, and the cap climbs to what fits."""
    measured = [n for n in range(1, len(engine_s)) if engine_s[n] > 0.0]
    if not measured:
        return len(engine_s) - 1
    for size in range(len(engine_s) - 1, 1, -1):
        at = bisect.bisect_left(measured, size)  # measured[at - 1] < size <= measured[at]
        nearest = min(measured[max(0, at - 1):at + 1], key=lambda n: (abs(n - size), n))
        if engine_s[nearest] * size / nearest <= budget_s / 2:
            return size
    return 1


def catching_up(oldest: QueuedFrame, newest: QueuedFrame) -> bool:
    """Whether a stream whose queue is full delivered its frames at more than twice real time: from the oldest
    queued to the one coming, their capture times span less than half their stream times (pts). Then its drops
    are a backlog coming at once, not processing falling behind: what a camera sent while it was being opened
    (its connection made, its first frame decoded: 0.3-1.9 s each for 32 NVDEC cameras opened together on an
    H100, most of it the first frame's decode, where the driver makes the decoder), or held up behind a network
    stall. A stream without times (pts None) or whose times went back (a looped file) is not."""
    if oldest.pts is None or newest.pts is None:
        return False
    return newest.t_monotonic - oldest.t_monotonic < (newest.pts - oldest.pts) / 2


class Batcher:
    def __init__(self, streams: int, max_batch: int, timeout_s: float, depth: int, budget_s: float | None = None,
                 batches_running=None):
        """budget_s: the latency budget from a frame's capture to its results (None: cut by timeout_s only).
        batches_running(): the batches submitted that the device has not finished (the runtime's; None: never
        held for the device)."""
        self.max_batch, self.timeout_s, self.depth = max_batch, timeout_s, depth
        self.budget_s = budget_s
        self.batches_running = batches_running
        self.held = 0  # partial batches held past their deadline for the device (each once)
        self.engine_s = [0.0] * (max_batch + 1)  # measured seconds per batch size (0: not yet)
        self.batch_cap = max_batch  # the largest batch the budget allows (budget_batch), max_batch without one
        self.interval_s = [0.0] * streams  # per stream: the average time between two of its frames
        self._last_put: list[float | None] = [None] * streams
        self.queues = [deque() for _ in range(streams)]
        self._queued = 0  # frames in all queues: kept, not summed over the streams at every step of a batch
        self.dropped = [0] * streams
        # of those, the frames dropped while a stream delivered faster than real time (catching_up): no overload
        self.dropped_catching_up = [0] * streams
        self._backlog_at = [-math.inf] * streams  # when each stream last dropped a frame of a backlog
        # One lock, two kinds of waiter: the batch taker on _ready, each file's capture thread on its stream's
        # _room. With one condition for both, a new frame's notify() could wake a capture thread instead of
        # the taker (a full batch then waited out its deadline), and each batch taken woke every capture
        # thread at once (64 of them contending for the lock the taker needs next).
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._own_room = [threading.Condition(self._lock) for _ in range(streams)]
        self._room = list(self._own_room)  # whom a frame taken from a stream wakes: its thread, or a shared one's
        self._next_stream = 0
        self.closed = False

    def put(self, packet: QueuedFrame, wait: bool = False) -> None:
        """Queue a frame; when the stream's queue is full, wait for room (files) or drop its oldest (cameras)."""
        with self._lock:
            self._arrived(packet.stream, packet.t_monotonic)
            queue = self.queues[packet.stream]
            while wait and len(queue) >= self.depth and not self.closed:
                self._room[packet.stream].wait(timeout=0.1)
            if len(queue) >= self.depth:
                self._drop_for_room(packet.stream, packet, packet.t_monotonic)
            queue.append(packet)
            self._queued += 1
            self._ready.notify()

    def room_condition(self) -> threading.Condition:
        """A condition on this batcher's lock, for a thread that reads several streams (room_waiter)."""
        return threading.Condition(self._lock)

    def room_waiter(self, stream: int, condition: threading.Condition | None) -> None:
        """Notify `condition` (from room_condition()) when a frame of `stream` is taken; None: the stream's
        own (a thread of its own waiting in put())."""
        with self._lock:
            self._room[stream] = condition if condition is not None else self._own_room[stream]

    def has_room(self, stream: int) -> bool:
        """Whether a frame of `stream` would be queued without waiting or dropping. Exact with the lock held
        (a room condition's); without it, a snapshot (a deque's length is read atomically)."""
        return len(self.queues[stream]) < self.depth

    def drop_oldest(self, stream: int) -> bool:
        """Free the oldest queued frame of a stream (its source needs the slot)."""
        with self._lock:
            queue = self.queues[stream]
            if not queue:
                return False
            self._drop_for_room(stream, queue[-1], time.monotonic())
            return True

    def _drop(self, stream: int) -> None:
        old = self.queues[stream].popleft()
        self._queued -= 1
        old.release()
        self.dropped[stream] += 1

    def _drop_for_room(self, stream: int, newest: QueuedFrame, at: float) -> None:
        """The oldest frame of a full queue dropped for `newest` (coming, or the queue's last) at monotonic time
        `at`, counted as catching up where the queue's frames came at once (catching_up), or within
        BACKLOG_TAIL_S after such a drop: a backlog's last frames come nearer real time, yet still after the rest
        of it (32 cameras opened together on an H100: 1 of 549 start drops was otherwise an overload's). Only a
        backlog's own drops extend that: an overload's drops go on, and are said as one after it. Frames shed
        for the budget, or at a stop, are not classed (_drop)."""
        backlog = catching_up(self.queues[stream][0], newest)
        self._drop(stream)
        if backlog:
            self._backlog_at[stream] = at
        if backlog or at - self._backlog_at[stream] < BACKLOG_TAIL_S:
            self.dropped_catching_up[stream] += 1

    def _arrived(self, stream: int, now: float) -> None:
        last = self._last_put[stream]
        if last is not None:
            gap, known = max(0.0, now - last), self.interval_s[stream]
            self.interval_s[stream] = gap if known == 0.0 else known + EMA * (gap - known)
        self._last_put[stream] = now

    def _next_arrival(self, now: float) -> float:
        """When the next frame is expected: the soonest of each stream's last frame + its interval (inf before
        any stream's interval is known). A stream overdue by a whole interval more is not counted on (ended,
        stalled or removed): it would hold every batch to its deadline."""
        due = [last + gap for last, gap in zip(self._last_put, self.interval_s)
               if last is not None and gap > 0 and last + 2 * gap >= now]
        return min(due, default=math.inf)

    def record_batch(self, size: int, seconds: float) -> None:
        """A batch of `size` frames took the engine `seconds` (the GPU's time on it where the runtime measures
        that, else from submission to results): the budget's engine time."""
        with self._lock:
            known = self.engine_s[size]
            self.engine_s[size] = seconds if known == 0.0 else known + EMA * (seconds - known)
            if self.budget_s is not None:
                self.batch_cap = budget_batch(self.engine_s, self.budget_s)

    def plan(self, engine_s: dict[int, float]) -> str | None:
        """Engine seconds measured before serving (the runtime's engine_times) taken as the batches' own; with a
        budget, why it cannot be held where one frame's run is over half of it (said in the log; None: it can
        be)."""
        for size, seconds in sorted(engine_s.items()):
            self.record_batch(size, seconds)
        one = self._engine(1)
        if self.budget_s is None or not one or one <= self.budget_s / 2:
            return None
        why = (f"the latency budget of {self.budget_s * 1e3:.0f} ms cannot be held: one frame takes the model "
               f"{one * 1e3:.0f} ms, and a frame may wait for the batch ahead of it, then run in its own; a budget "
               f"of at least {2 * one * 1e3:.0f} ms, a smaller input, a lighter model or the GPU would hold it")
        log.warning(why)
        return why

    def _engine(self, size: int) -> float:
        """Measured seconds for a batch of `size`, else of the nearest larger size measured, else of the largest
        smaller one (0 before any batch ran)."""
        size = min(size, self.max_batch)
        larger = [t for t in self.engine_s[size:] if t > 0.0]
        smaller = [t for t in self.engine_s[:size] if t > 0.0]
        return larger[0] if larger else (smaller[-1] if smaller else 0.0)

    def reset(self, stream: int) -> None:
        """A new stream takes this queue (the control API reuses a slot): its drops count from zero, its
        arrival rate is learnt anew."""
        with self._lock:
            self.dropped[stream] = self.dropped_catching_up[stream] = 0
            self._backlog_at[stream] = -math.inf
            self._last_put[stream], self.interval_s[stream] = None, 0.0

    def drop_counts(self) -> tuple[list[int], list[int]]:
        """Each stream's dropped frames, and of those the ones dropped catching up (copies)."""
        with self._lock:
            return list(self.dropped), list(self.dropped_catching_up)

    def depths(self) -> list[int]:
        with self._lock:
            return [len(q) for q in self.queues]

    def abort(self) -> int:
        """Drop every queued frame (slots freed, counted as dropped) and close: a second Ctrl-C ends the
        drain. Returns how many were dropped."""
        with self._lock:
            dropped = 0
            for stream, queue in enumerate(self.queues):
                while queue:
                    self._drop(stream)
                    dropped += 1
            self._close()
            return dropped

    def close(self) -> None:
        """No more frames will come: next_batch drains what is queued, then returns []."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        self.closed = True
        self._ready.notify_all()
        for room in {id(r): r for r in self._room}.values():
            room.notify_all()

    def next_batch(self, poll_s: float = 0.1) -> list[QueuedFrame] | None:
        """Up to max_batch frames, round robin over streams; waits for a full batch until the oldest queued
        frame has waited timeout_s (counted from its capture: a frame that queued while the GPU was busy has
        used up its wait already; counting from now added a whole timeout to the latency tail).

        Returns [] when nothing arrived within poll_s (caller checks for shutdown),
        None when closed and drained."""
        with self._lock:
            if not self._ready.wait_for(lambda: self._queued > 0 or self.closed, timeout=poll_s):
                return []
            if self._queued == 0:
                return None
            holding = False
            while not self.closed:
                remaining = self._deadline() - time.monotonic()
                if remaining <= 0:
                    if not self._device_behind():
                        break
                    self.held += not holding
                    holding, remaining = True, HOLD_POLL_S
                self._ready.wait(timeout=remaining)  # a frame came, or the time: the cut is looked at again
            return self._take()

    def _device_behind(self) -> bool:
        """A partial batch cut now would wait behind a batch the device has not started yet."""
        return (self._queued < self.batch_cap and self.batches_running is not None
                and self.batches_running() >= HELD_WHILE_RUNNING)

    def _deadline(self) -> float:
        if self._queued >= self.batch_cap:  # full: cut now, without a pass over every stream (64 at every frame)
            return -math.inf
        oldest = min(q[0].t_monotonic for q in self.queues if q)
        return cut_deadline(oldest, self._queued, self.batch_cap, self.timeout_s, self.budget_s, self._engine,
                            self._next_arrival(time.monotonic()))

    def _take(self) -> list[QueuedFrame]:
        batch, streams = [], len(self.queues)
        stale = time.monotonic() - self.budget_s if self.budget_s is not None else -math.inf
        while len(batch) < self.batch_cap and self._queued > 0:
            stream = self._next_stream
            queue = self.queues[stream]
            if queue:
                # shed what cannot make its budget, and the stream's next frame takes its turn: a turn lost with
                # the shed frame starved the streams whose frames came just after another's (2 cameras, a model
                # slower than their period: 89 frames run of one, 5 of the other)
                while queue and queue[0].live and queue[0].t_monotonic < stale:
                    self._drop(stream)
                if queue:
                    batch.append(queue.popleft())
                    self._queued -= 1
                self._room[stream].notify()  # its capture thread, if it waits for room (files)
            self._next_stream = (stream + 1) % streams
        return batch
