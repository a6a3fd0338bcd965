#!/usr/bin/env python3
"""NVDEC's own hold on a live stream's frames, and its decoder's start (issue 66: network cameras drop frames
only in their first second, and a frame leaves NVDEC well after the camera sent it).

For each video and each of PyNvVideoCodec's display latencies (CreateDecoder(latency=...): the default, NATIVE,
LOW, ZERO), packets go to the decoder one at a time, as a live camera's come, and it counts:
  held:   packets given minus frames out, at the most once started (NATIVE: "a latency of 4 frames" by its docs; at
          30 frames/s each held frame is 33 ms before jetpipe's capture time, which its reported latency does not
          include)
  order:  whether the frames come out in display order (their pts rising), and as many as the packets
  start:  the first Decode's wall time (the decoder is made at the stream's first sequence header)

  python scripts/diag/nvdec_latency.py VIDEO.mp4 [VIDEO2.mp4 ...] [--packets 120]

Needs the GPU, PyCUDA and PyNvVideoCodec (jetpipe's device kit).
"""

from __future__ import annotations

import argparse
import time

from jetpipe.runtime.cuda import CudaDevice
from jetpipe.runtime.nvdec import import_nvdec


def latencies(nvc) -> dict:
    """PyNvVideoCodec's display latency members by name (None: its default)."""
    kind = next((getattr(nvc, name) for name in dir(nvc) if "DisplayDecodeLatency" in name), None)
    members = {name: getattr(kind, name) for name in ("NATIVE", "LOW", "ZERO") if kind is not None
               and hasattr(kind, name)}
    return {"default": None, **members}


def run(nvc, device, video: str, latency, packets: int) -> dict:
    demuxer = nvc.CreateDemuxer(filename=video)
    stream = device.stream()
    extra = {} if latency is None else {"latency": latency}
    decoder = nvc.CreateDecoder(gpuid=device.ordinal, codec=demuxer.GetNvCodecId(),
                                cudacontext=device.context.handle, cudastream=stream.handle, usedevicememory=True,
                                **extra)
    given = out = most_held = 0
    first_call = first_out = None
    pts = []
    for packet in demuxer:
        if given == packets:
            break
        started = time.perf_counter()
        frames = decoder.Decode(packet)
        if first_call is None:
            first_call = time.perf_counter() - started
        given += 1
        out += len(frames)
        pts += [int(f.getPTS()) for f in frames]
        if out:
            first_out = first_out or given
            most_held = max(most_held, given - out)
    return {"video": video, "latency": latency, "packets": given, "frames": out, "held_at_most": most_held,
            "first_out_after_packets": first_out, "pts_rising": pts == sorted(pts),
            "first_decode_ms": round(first_call * 1e3, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("videos", nargs="+")
    parser.add_argument("--packets", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    nvc, device = import_nvdec(), CudaDevice(0)
    kinds = latencies(nvc)
    print("PyNvVideoCodec display latencies:", {k: str(v) for k, v in kinds.items()}, flush=True)
    with device.active():
        for _ in range(args.repeats):
            for video in args.videos:
                for name, latency in kinds.items():
                    row = run(nvc, device, video, latency, args.packets)
                    row["latency"] = name
                    print(row, flush=True)


if __name__ == "__main__":
    main()
