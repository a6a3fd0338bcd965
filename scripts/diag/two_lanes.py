#!/usr/bin/env python3
"""Whether two batches running at once on one GPU, from one process, beat one after another (issue 66 target 3:
two serving processes under CUDA MPS kept 32 sparse streams at p99 25-28 ms where one process gave 41-57).

  python scripts/diag/two_lanes.py BUNDLE [--batch 8] [--batches 600] [--rounds 3]

The bundle's model through the runtime's OrtCudaBackend (a session per batch bucket, each (buffer set, bucket) run
replayed from a CUDA graph), random inputs in two buffer sets. 'one': one backend, the runtime's way: every batch
on the compute stream, sets alternating. 'two': two backends (sessions of their own: a graph replays its session's
intermediate buffers, so two sets of one session cannot run at once), each on its own stream with its own set,
batches alternating between them. Reported per arm and round: frames/s over --batches batches, and the GPU time
of a batch (its stream's events around it: two at once each take longer). Then whether the outputs of each set
match between the arms (the largest difference). No decoding, preprocessing or post stage: the engine alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from jetpipe import bundle as bundles  # noqa: E402
from jetpipe.runtime.backends import OrtCudaBackend  # noqa: E402
from jetpipe.runtime.cuda import CudaDevice  # noqa: E402
from jetpipe.spec import PreprocessSpec  # noqa: E402


class Lane:
    """A backend of its own on a stream of its own, bound to the buffer sets it runs."""

    def __init__(self, device, model: str, sample, max_batch: int, sets: list[int], buffers: dict):
        self.device, self.stream = device, device.stream()
        self.backend = OrtCudaBackend(model, sample, max_batch, self.stream, device.ordinal, cuda_graph=True)
        for index in sets:
            outputs = {name: int(address) for name, address in buffers[index]["outputs"].items()}
            self.backend.bind(index, int(buffers[index]["input"]), outputs)
        for _ in range(3):  # warm-up: each session sees its shape before capture
            for index in sets:
                for bucket in self.backend.buckets:
                    self.backend.run(index, bucket, self.stream)
        self.stream.synchronize()
        self.backend.capture_graphs(self.stream)


def buffer_sets(device, backend_spec, max_batch: int, seed: int) -> dict:
    """Two buffer sets: a random input each (as the preprocessor's output would be) and the outputs."""
    draw = np.random.default_rng(seed)
    sets = {}
    for index in (0, 1):
        nbytes = backend_spec.input.nbytes(max_batch)
        host = draw.random(nbytes // 4, dtype=np.float32)
        address = device.alloc(nbytes)
        device.cuda.memcpy_htod(address, host)
        sets[index] = {"input": address, "outputs": {s.name: device.alloc(s.nbytes(max_batch))
                                                     for s in backend_spec.outputs}}
    return sets


def outputs_of(device, spec, buffers: dict, batch: int) -> dict[str, np.ndarray]:
    got = {}
    for s in spec.outputs:
        host = np.empty(s.nbytes(batch) // np.dtype(s.dtype).itemsize, s.dtype)
        device.cuda.memcpy_dtoh(host, buffers["outputs"][s.name])
        got[s.name] = host
    return got


def timed(device, lanes: list[Lane], plan: list[tuple[int, int]], batch: int) -> dict:
    """Run (lane, set) of each batch in turn, without waiting between; frames/s and the mean GPU time a batch
    (events on its stream around it, read after the run)."""
    marks = [(device.event(), device.event()) for _ in plan]
    started = time.perf_counter()
    for (lane_index, set_index), (start, end) in zip(plan, marks):
        lane = lanes[lane_index]
        start.record(lane.stream)
        lane.backend.run(set_index, batch, lane.stream)
        end.record(lane.stream)
    for lane in lanes:
        lane.stream.synchronize()
    took = time.perf_counter() - started
    spans = [start.time_till(end) for start, end in marks]
    return {"frames_s": round(len(plan) * batch / took, 1), "batch_gpu_ms": round(float(np.mean(spans)), 2),
            "batch_gpu_p99_ms": round(float(np.percentile(spans, 99)), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--batches", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    manifest = bundles.load(args.bundle)
    model = str(args.bundle / bundles.MODEL_FILE)
    height, width = manifest["input_size"]
    channels = PreprocessSpec.from_dict(manifest["preprocess"]).channels
    max_batch = int(manifest["batch"]["max"])
    device = CudaDevice(0)
    with device.active():
        probe = OrtCudaBackend(model, (channels, height, width), max_batch, device.stream(), device.ordinal)
        buffers = buffer_sets(device, probe, max_batch, seed=0)
        probe.close()
        one = Lane(device, model, (channels, height, width), max_batch, [0, 1], buffers)
        two = [Lane(device, model, (channels, height, width), max_batch, [index], buffers) for index in (0, 1)]
        rows, results = [], {}
        for round_no in range(args.rounds):
            for arm in ("one", "two"):
                if arm == "one":
                    row = timed(device, [one], [(0, k % 2) for k in range(args.batches)], args.batch)
                else:
                    row = timed(device, two, [(k % 2, k % 2) for k in range(args.batches)], args.batch)
                results[arm] = [outputs_of(device, probe, buffers[index], args.batch) for index in (0, 1)]
                rows.append({"arm": arm, "round": round_no + 1, **row})
                print(json.dumps(rows[-1]), flush=True)
        differences = {name: float(max(np.abs(results["one"][i][name] - results["two"][i][name]).max()
                                       for i in (0, 1))) for name in results["one"][0]}
        print(json.dumps({"largest_output_difference": differences, "batch": args.batch, "max_batch": max_batch}))


if __name__ == "__main__":
    main()
