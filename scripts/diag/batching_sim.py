#!/usr/bin/env python3
"""The batcher's cut against a GPU that runs batches one after another, simulated (no threads, no GPU): which
latency the batching itself gives N live streams near the engine's rate, in step or out of step, with and
without holding a partial batch while the GPU has two unfinished (issue 66 target 3, session 58).

  python scripts/diag/batching_sim.py [--streams 32] [--seconds 60] [--fixed-ms 5.6] [--per-frame-ms 0.28]

The model: each stream sends a frame every 1/30 s from its phase (in step: within --in-step-ms of one another, as
32 looped files were on an H100; out of step: uniform over the interval, seeded), captured after a jitter of up to
--jitter-ms. The batcher cuts at once when 8 frames wait, else 5 ms after its oldest frame's capture (held past that
while two batches are unfinished, where --hold), and only when one of 4 buffer sets is free. The GPU runs a batch
of n in fixed + n x per-frame ms (the defaults fit the H100's 956 frames/s at 94 % busy with full batches and 920
at 96 % with 7.3 a batch); the post stage takes --post-ms a batch, then frees its set. Latency: capture to the
post stage's end. A stream's queue holds 4 frames (the oldest goes). Reported: p50 / p99 ms, frames a batch,
frames dropped, the GPU's busy share.
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
    events: list[tuple[float, str]] = []  # (time, "gpu" | "post"): a batch's GPU end, a set freed
    free_sets, gpu_free_at, running = SETS, 0.0, []  # running: GPU end times of the batches not finished
    latencies, sizes, dropped, busy = [], [], 0, 0.0
    next_stream, now, i = 0, 0.0, 0

    def queued() -> int:
        return sum(map(len, queues))

    def try_cut(t: float) -> None:
        nonlocal free_sets, gpu_free_at, next_stream, busy
        while free_sets and queued():
            unfinished = sum(end > t for end in running)
            oldest = min(q[0] for q in queues if q)
            if queued() < MAX_BATCH and (t < oldest + TIMEOUT or (hold and unfinished >= 2)):
                return
            batch = []
            while len(batch) < MAX_BATCH and queued():
                if queues[next_stream]:
                    batch.append(queues[next_stream].pop(0))
                next_stream = (next_stream + 1) % streams
            free_sets -= 1
            run = (args.fixed_ms + args.per_frame_ms * len(batch)) / 1e3
            start = max(t, gpu_free_at)
            gpu_free_at = start + run
            busy += run
            running.append(gpu_free_at)
            sizes.append(len(batch))
            done = gpu_free_at + args.post_ms / 1e3
            latencies.extend(done - c for c in batch)
            heapq.heappush(events, (gpu_free_at, "gpu"))
            heapq.heappush(events, (done, "post"))

    while i < len(arrivals) or events:
        arrival = arrivals[i][0] if i < len(arrivals) else float("inf")
        wake = min(arrival, events[0][0] if events else float("inf"))
        # a deadline between now and the next event: the batcher wakes for it
        waiting = [q[0] + TIMEOUT for q in queues if q]
        if waiting and min(waiting) < wake and min(waiting) > now:
            now = min(waiting)
            try_cut(now)
            continue
        now = wake
        if arrival <= wake:
            _, stream = arrivals[i]
            i += 1
            if len(queues[stream]) >= DEPTH:
                queues[stream].pop(0)
                dropped += 1
            queues[stream].append(now)
        else:
            _, kind = heapq.heappop(events)
            if kind == "post":
                free_sets += 1
            running[:] = [end for end in running if end > now]
        try_cut(now)
    latencies.sort()
    return {"in_step": in_step, "hold": hold, "p50_ms": round(latencies[len(latencies) // 2] * 1e3, 1),
            "p99_ms": round(latencies[len(latencies) * 99 // 100] * 1e3, 1),
            "frames_a_batch": round(sum(sizes) / len(sizes), 2), "dropped": dropped,
            "gpu_busy": round(busy / seconds, 3)}


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
    args = parser.parse_args()
    for in_step in (True, False):
        for hold in (False, True):
            print(json.dumps(simulate(args.streams, args.seconds, in_step, hold, args)))


if __name__ == "__main__":
    main()
