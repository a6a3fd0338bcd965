#!/usr/bin/env python3
"""The batcher alone with many streams (issue 27): N capture threads put frames as fast as they can (files: each
waits for room in its queue), one thread takes batches; frames/s through it and CPU microseconds a frame. No GPU,
no model: what the batching itself costs the pipeline's threads (the GIL they share) at 64 streams.

  python scripts/bench_batcher.py [--streams 64] [--frames 40000] [--max-batch 32] [--depth 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jetpipe.pipelines.ingest.batcher import Batcher, QueuedFrame  # noqa: E402


def run(streams: int, frames: int, max_batch: int, depth: int) -> dict:
    batcher = Batcher(streams=streams, max_batch=max_batch, timeout_s=0.005, depth=depth)
    each = frames // streams

    def produce(stream: int) -> None:
        for i in range(each):
            batcher.put(QueuedFrame(stream, i, 0.0, None, lambda: None), wait=True)

    threads = [threading.Thread(target=produce, args=(s,), daemon=True) for s in range(streams)]
    wall, cpu = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    taken = batches = 0
    while taken < each * streams:
        batch = batcher.next_batch() or []
        taken, batches = taken + len(batch), batches + bool(batch)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"streams": streams, "frames": taken, "batches": batches, "frames_per_s": round(taken / wall),
            "cpu_us_per_frame": round(1e6 * cpu / taken, 2), "mean_batch": round(taken / batches, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--frames", type=int, default=40000)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args()
    print(json.dumps(run(args.streams, args.frames, args.max_batch, args.depth)))


if __name__ == "__main__":
    main()
