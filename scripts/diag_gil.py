#!/usr/bin/env python3
"""Which CUDA calls the pipeline makes give up the GIL (issue 27), measured: each call's latency with the
process idle and with 16 pure-Python threads running.

  python scripts/diag_gil.py

A call that releases the GIL must take it back on return; among busy threads that costs a switch interval
(5 ms) or more, whatever the call itself took. A call that keeps it returns in microseconds either way.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jetpipe.runtime.cuda import CudaDevice  # noqa: E402

CALLS_PER_KIND = 60


def spin(stop: threading.Event) -> None:
    count = 0
    while not stop.is_set():
        count += 1


def calls(device: CudaDevice) -> dict:
    from pycuda.compiler import SourceModule

    stream, event = device.stream(), device.event()
    host, first, second = device.pinned((1024,), np.uint8), device.alloc(1024), device.alloc(1024)
    kernel = SourceModule("__global__ void k(int *p) { if (p) p[0] = 1; }").get_function("k")
    kernel.prepare("P")
    cuda = device.cuda
    return {"event record": lambda: event.record(stream),
            "memcpy_htod_async 1 KB": lambda: cuda.memcpy_htod_async(first, host, stream),
            "memcpy_dtod_async 1 KB": lambda: cuda.memcpy_dtod_async(second, first, 1024, stream),
            "memcpy_dtoh_async 1 KB": lambda: cuda.memcpy_dtoh_async(host, first, stream),
            "context push + pop": lambda: (device.context.push(), cuda.Context.pop()),
            "stream synchronize (idle)": stream.synchronize,
            "event query": event.query,
            "stream wait_for_event": lambda: stream.wait_for_event(event),
            "kernel launch (prepared)": lambda: kernel.prepared_async_call((1, 1, 1), (32, 1, 1), stream, 0),
            "_sync": stream.synchronize}


def measure(kinds: dict) -> dict:
    out = {}
    for name, call in kinds.items():
        if name == "_sync":
            continue
        kinds["_sync"]()
        times = []
        for _ in range(CALLS_PER_KIND):
            start = time.perf_counter()
            call()
            times.append((time.perf_counter() - start) * 1e6)
        times.sort()
        out[name] = {"p50_us": round(times[len(times) // 2], 1), "p90_us": round(times[int(len(times) * 0.9)], 1)}
    return out


def main() -> None:
    device = CudaDevice(0)
    with device.active():
        kinds = calls(device)
        idle = measure(kinds)
        stop = threading.Event()
        threads = [threading.Thread(target=spin, args=(stop,), daemon=True) for _ in range(16)]
        for t in threads:
            t.start()
        time.sleep(0.2)
        busy = measure(kinds)
        stop.set()
        for t in threads:
            t.join()
    device.close()
    print(json.dumps({"switch_interval_ms": sys.getswitchinterval() * 1e3,
                      "calls": {k: {"idle": idle[k], "16 threads busy": busy[k]} for k in idle}}, indent=1))


if __name__ == "__main__":
    main()
