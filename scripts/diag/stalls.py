#!/usr/bin/env python3
"""Where a serving pipeline's slow batches come from (issue 27): one run, every batch timed, threads sampled.

  python scripts/diag/stalls.py BUNDLE CLIP [--streams 32] [--seconds 20] [--budget-ms 66]

N live NVDEC streams (CLIP looped, --realtime) through `Pipeline`, with the GPU stage's submit, the post stage's
collect, the batcher's next_batch and the post stage's finish/emit timed per call, Python's garbage collector
timed per collection, and the gpu/post/sinks threads' innermost frames sampled every 2 ms. Prints the run's
summary, the slowest batches (submission to results) split into submit / waiting for the post thread /
collect, and where the threads were sampled during each. A window with few samples is the whole process
frozen (the sampler needs the GIL too): how the stop's decoder closes were found (docs/lab/benchmarks.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate  # noqa: E402
from jetpipe.pipelines.service.daemon import Pipeline  # noqa: E402

SAMPLED = ("gpu", "post", "sinks")


def timed(log: dict, obj, name: str, key: str) -> None:
    """Replace obj.name by a wrapper that appends (start, end) of each call to log[key]."""
    call = getattr(obj, name)

    def wrapper(*args, **kwargs):
        start = time.monotonic()
        try:
            return call(*args, **kwargs)
        finally:
            log.setdefault(key, []).append((start, time.monotonic()))

    setattr(obj, name, wrapper)


def sample(samples: list, stop: threading.Event) -> None:
    while not stop.wait(0.002):
        names, now = {t.ident: t.name for t in threading.enumerate()}, time.monotonic()
        for ident, frame in sys._current_frames().items():
            if names.get(ident) in SAMPLED:
                where = []
                while frame is not None and len(where) < 3:
                    where.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}:{frame.f_code.co_name}")
                    frame = frame.f_back
                samples.append((now, names[ident], " < ".join(where)))


def quantiles(spans: list) -> str:
    ms = sorted((end - start) * 1e3 for start, end in spans) or [0.0]
    return f"p50 {ms[len(ms) // 2]:.2f} p99 {ms[int(len(ms) * 0.99)]:.2f} max {ms[-1]:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("clip")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--budget-ms", type=float, default=66.0)
    parser.add_argument("--slowest", type=int, default=8)
    args = parser.parse_args()
    sources = [SourceConfig(args.clip, loop=True, realtime=True, decoder="nvdec") for _ in range(args.streams)]
    pipeline = Pipeline(validate(PipelineConfig(bundle=args.bundle, sources=sources, duration=args.seconds,
                                                metrics_listen="", log_every_s=1e9,
                                                latency_budget_ms=args.budget_ms)))
    log: dict = {}
    timed(log, pipeline.runtime, "submit", "submit")
    timed(log, pipeline.runtime, "collect", "collect")
    timed(log, pipeline.batcher, "next_batch", "next_batch")
    timed(log, pipeline.stages, "finish", "finish")
    timed(log, pipeline.stages, "emit", "emit")
    started: list = []
    gc.callbacks.append(lambda phase, info: started.append(time.monotonic()) if phase == "start" else
                        log.setdefault("gc", []).append((started.pop() if started else time.monotonic(),
                                                         time.monotonic())))
    samples, stop = [], threading.Event()
    threading.Thread(target=sample, args=(samples, stop), daemon=True).start()
    summary = pipeline.run()
    stop.set()
    print(json.dumps({"streams": args.streams, "budget_ms": args.budget_ms, "fps": summary["throughput_fps"],
                      "batches": summary["batches"], "dropped": sum(summary["dropped"]),
                      "latency_ms": summary["latency_ms"]}))
    for key in ("submit", "collect", "next_batch", "finish", "emit", "gc"):
        print(f"{key}: {len(log.get(key, []))} calls, {quantiles(log.get(key, []))}")
    submits, collects = log.get("submit", []), log.get("collect", [])
    batches = [{"batch": i, "gpu_stage_ms": (collect[1] - submit[0]) * 1e3, "submit_ms": (submit[1] - submit[0]) * 1e3,
                "waiting_for_post_ms": (collect[0] - submit[1]) * 1e3, "collect_ms": (collect[1] - collect[0]) * 1e3,
                "span": (submit[0], collect[1])} for i, (submit, collect) in enumerate(zip(submits, collects))]
    for b in sorted(batches, key=lambda b: -b["gpu_stage_ms"])[:args.slowest]:
        start, end = b.pop("span")
        print({k: round(v, 1) for k, v in b.items()})
        for name in SAMPLED:
            seen = Counter(where for t, thread, where in samples if thread == name and start <= t <= end)
            print(f"   {name}: {sum(seen.values())} samples, {seen.most_common(3)}")


if __name__ == "__main__":
    main()
