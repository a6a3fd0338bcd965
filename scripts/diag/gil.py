#!/usr/bin/env python3
"""Which CUDA calls the pipeline makes give up the GIL (issue 27), measured: each call's latency with the
process idle and with 16 pure-Python threads running.

  python scripts/diag/gil.py [--clip VIDEO]

--clip: PyNvVideoCodec's calls on it too (demuxing a packet, decoding it, reading a frame's plane and time):
whether NVDEC's decoding holds the GIL, as every capture thread calls it once a frame.

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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

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


def nvdec_calls(device: CudaDevice, clip: str) -> dict:
    import PyNvVideoCodec as nvc

    stream = device.stream()
    state = {"packets": iter(nvc.CreateDemuxer(filename=clip)), "frame": None}
    decoder = nvc.CreateDecoder(gpuid=device.ordinal, codec=nvc.CreateDemuxer(filename=clip).GetNvCodecId(),
                                cudacontext=device.context.handle, cudastream=stream.handle, usedevicememory=True)

    def packet():
        got = next(state["packets"], None)
        if got is None or got.bsl == 0:  # the end: loop
            state["packets"] = iter(nvc.CreateDemuxer(filename=clip))
            got = next(state["packets"])
        return got

    def decode():
        frames = decoder.Decode(packet())
        if frames:
            state["frame"] = frames[-1]

    def plane():
        if state["frame"] is not None:
            state["frame"].GetPtrToPlane(0), state["frame"].getPTS()

    for _ in range(30):  # the decoder set up and giving frames
        decode()
    return {"nvdec demux a packet": packet, "nvdec demux + Decode": decode, "nvdec frame plane + pts": plane,
            "_sync": stream.synchronize}


def gil_share(clip: str, threads: int, seconds: float = 3.0) -> dict:
    """A pure-Python spinner's rate beside `threads` threads decoding the clip (as bench_light's decode), over
    its rate alone: what is left of the GIL for the rest of a pipeline while the decoders run."""
    import PyNvVideoCodec as nvc

    def spin_for(duration: float) -> int:
        count, end = 0, time.perf_counter() + duration
        while time.perf_counter() < end:
            count += 1
        return count

    alone = spin_for(seconds)
    stop, frames = threading.Event(), [0] * threads

    def decode(i: int) -> None:
        packets = iter(nvc.CreateDemuxer(filename=clip))
        decoder = nvc.CreateDecoder(gpuid=0, codec=nvc.CreateDemuxer(filename=clip).GetNvCodecId(),
                                    usedevicememory=True)
        while not stop.is_set():
            packet = next(packets, None)
            if packet is None or packet.bsl == 0:
                packets = iter(nvc.CreateDemuxer(filename=clip))
                continue
            frames[i] += len(decoder.Decode(packet))

    workers = [threading.Thread(target=decode, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    time.sleep(1.0)  # decoders set up
    start = sum(frames)
    beside = spin_for(seconds)
    decoded = sum(frames) - start
    stop.set()
    for w in workers:
        w.join()
    return {"decode_threads": threads, "decode_fps": round(decoded / seconds),
            "spinner_share": round(beside / alone, 3)}


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
    clip = sys.argv[sys.argv.index("--clip") + 1] if "--clip" in sys.argv else None
    device = CudaDevice(0)
    with device.active():
        kinds = calls(device)
        if clip:
            kinds.update(nvdec_calls(device, clip))
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
    shares = [gil_share(clip, n) for n in (1, 8, 32)] if clip else []
    print(json.dumps({"switch_interval_ms": sys.getswitchinterval() * 1e3,
                      "calls": {k: {"idle": idle[k], "16 threads busy": busy[k]} for k in idle},
                      **({"gil_share_beside_decoding": shares} if shares else {})}, indent=1))


if __name__ == "__main__":
    main()
