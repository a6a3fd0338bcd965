#!/usr/bin/env python3
"""The batcher's cut against a GPU that runs batches one after another, simulated (no threads, no GPU): which
latency the batching itself gives N live streams near the engine's rate, in step or out of step, with and
without holding a partial batch while the GPU has two unfinished (issue 66 target 3, session 58).

  python scripts/diag/batching_sim.py [--streams 32] [--seconds 60] [--fixed-ms 5.6] [--per-frame-ms 0.28]
                                     [--instances 1] [--overlap 1.83] [--spread 0] [--hold-only]

The model: each stream sends a frame every 1/30 s from its phase (in step: within --in-step-ms of one another, as
32 looped files were on an H100; out of step: uniform over the interval, seeded), captured after a jitter of up to
--jitter-ms. The batcher cuts at once when 8 frames wait, else 5 ms after its oldest frame's capture (held past that
while two batches are unfinished, where --hold), and only when one of 4 buffer sets is free. The GPU runs a batch
of n in fixed + n x per-frame ms (the defaults fit the H100's 956 frames/s at 94 % busy with full batches and 920
at 96 % with 7.3 a batch); the post stage takes --post-ms a batch, then frees its set. Latency: capture to the
post stage's end. A stream's queue holds 4 frames (the oldest goes). Reported: p50 / p99 ms, frames a batch,
frames dropped, the GPU's busy share.

--instances 2 (session 60, serve --model-instances): two batches run at once, each --overlap times slower while
both run (SharedGpu); --spread: each batch's GPU time drawn lognormal around the fitted one (session 59: 0.15).
"""

from __future__ import annotations

import argparse
import heapq
import json
import random

PERIOD = 1.0 / 30
MAX_BATCH, TIMEOUT, SETS, DEPTH = 8, 0.005, 4, 4


def simulate(streams: int, seconds: float, in_step: bool, hold: bool, args) -> dict:
    draw = random.Random(args.seed)
    phases = [draw.uniform(0, args.in_step_ms / 1e3) if in_step else draw.uniform(0, PERIOD) for _ in range(streams)]
    arrivals = sorted((phase + k * PERIOD + draw.uniform(0, args.jitter_ms / 1e3), s)
                      for s, phase in enumerate(phases) for k in range(int(seconds / PERIOD)))
    queues: list[list[float]] = [[] for _ in range(streams)]
    posts: list[float] = []  # heap: when a batch's post stage ends and frees its set
    gpu = SharedGpu(args.instances, args.overlap)
    free_sets, latencies, sizes, dropped = SETS, [], [], 0
    next_stream, now, i = 0, 0.0, 0

    def queued() -> int:
        return sum(map(len, queues))

    def try_cut(t: float) -> None:
        nonlocal free_sets, next_stream
        while free_sets and queued():
            oldest = min(q[0] for q in queues if q)
            if queued() < MAX_BATCH and (t < oldest + TIMEOUT or (hold and gpu.unfinished() >= 2)):
                return
            batch = []
            while len(batch) < MAX_BATCH and queued():
                if queues[next_stream]:
                    batch.append(queues[next_stream].pop(0))
                next_stream = (next_stream + 1) % streams
            free_sets -= 1
            sizes.append(len(batch))
            solo = (args.fixed_ms + args.per_frame_ms * len(batch)) / 1e3
            gpu.submit(batch, solo * (draw.lognormvariate(0, args.spread) if args.spread else 1.0))

    while i < len(arrivals) or posts or gpu.unfinished():
        arrival = arrivals[i][0] if i < len(arrivals) else float("inf")
        wake = min(arrival, posts[0] if posts else float("inf"), gpu.next_done(now))
        # a deadline between now and the next event: the batcher wakes for it
        waiting = [q[0] + TIMEOUT for q in queues if q]
        if waiting and now < min(waiting) < wake:
            wake = min(waiting)
        for batch in gpu.advance(now, wake):  # batches done by then: their post stage starts
            heapq.heappush(posts, wake + args.post_ms / 1e3)
            latencies.extend(wake + args.post_ms / 1e3 - c for c in batch)
        now = wake
        if arrival <= now:
            _, stream = arrivals[i]
            i += 1
            if len(queues[stream]) >= DEPTH:
                queues[stream].pop(0)
                dropped += 1
            queues[stream].append(now)
        while posts and posts[0] <= now:
            heapq.heappop(posts)
            free_sets += 1
        try_cut(now)
    latencies.sort()
    return {"instances": args.instances, "streams": streams, "in_step": in_step, "hold": hold,
            "p50_ms": round(latencies[len(latencies) // 2] * 1e3, 1),
            "p99_ms": round(latencies[len(latencies) * 99 // 100] * 1e3, 1),
            "frames_a_batch": round(sum(sizes) / len(sizes), 2), "dropped": dropped,
            "gpu_busy": round(gpu.busy / seconds, 3)}


class SharedGpu:
    """Batches run on `instances` model instances, first come first served; while m run at once each goes at
    1 / slowdown(m) of its solo speed (slowdown(1) = 1, slowdown(2) = overlap: two_lanes.py's 14.1 against 7.7 ms
    a batch of 8 on an H100, 1.83). One instance is the runtime's one compute stream: batches one after another."""

    def __init__(self, instances: int, overlap: float):
        self.instances, self.overlap = instances, overlap
        self.running: list[list] = []   # [solo seconds left, frames' capture times]
        self.waiting: list[list] = []   # submitted, no instance free yet (queued on a stream)
        self.busy = 0.0                 # seconds with at least one batch running

    def slowdown(self) -> float:
        return 1.0 if len(self.running) <= 1 else self.overlap * len(self.running) / 2

    def unfinished(self) -> int:
        return len(self.running) + len(self.waiting)

    def submit(self, batch: list[float], solo_s: float) -> None:
        self.waiting.append([solo_s, batch])
        self._start()

    def next_done(self, now: float) -> float:
        if not self.running:
            return float("inf")
        return now + min(left for left, _ in self.running) * self.slowdown()

    def advance(self, now: float, until: float) -> list[list[float]]:
        """Progress from now to until; the batches that finished (at `until`: it is never past a finish)."""
        if not self.running or until <= now:
            return []
        self.busy += until - now
        progress = (until - now) / self.slowdown()
        for item in self.running:
            item[0] -= progress
        done = [batch for left, batch in self.running if left <= 1e-12]
        self.running = [item for item in self.running if item[0] > 1e-12]
        self._start()
        return done

    def _start(self) -> None:
        while self.waiting and len(self.running) < self.instances:
            self.running.append(self.waiting.pop(0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--fixed-ms", type=float, default=5.6)
    parser.add_argument("--per-frame-ms", type=float, default=0.28)
    parser.add_argument("--post-ms", type=float, default=0.7)
    parser.add_argument("--jitter-ms", type=float, default=2.0)
    parser.add_argument("--in-step-ms", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--instances", type=int, default=1, help="model instances running batches at once")
    parser.add_argument("--overlap", type=float, default=1.83,
                        help="how much longer a batch takes while two run at once (two_lanes.py, H100: 1.83)")
    parser.add_argument("--spread", type=float, default=0.0,
                        help="a batch's GPU time drawn lognormal with this sigma around the fitted time (0: none)")
    parser.add_argument("--hold-only", action="store_true", help="only the arms with the hold (the batcher's now)")
    args = parser.parse_args()
    for in_step in (True, False):
        for hold in (True,) if args.hold_only else (False, True):
            print(json.dumps(simulate(args.streams, args.seconds, in_step, hold, args)))


if __name__ == "__main__":
    main()
