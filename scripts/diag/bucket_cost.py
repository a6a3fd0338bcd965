#!/usr/bin/env python3
"""What a partial batch costs in the batch bucket that runs it (issue 66 targets 2 and 3): the GPU runtime keeps an
ONNX Runtime session per bucket, 1, 2, 4 and 8 (backends.batch_buckets), so a batch of 5-7 frames runs as 8. 32
network cameras with two model instances average 6.9 frames a batch (session 63): how much of the GPU's time goes
on the rows past the batch, and so what a session for every size would give back (a session more for each of 3, 5,
6 and 7: its memory and its start-up).

  python scripts/diag/bucket_cost.py BUNDLE [--runs 200] [--repeats 3] [--cpu]

A session per batch size 1..the bundle's max batch, each run only at its own size (ORT's CUDA convolutions re-plan
when the shape changes: backends.OrtCudaBackend), inputs and outputs bound on the device (no copies timed), random
inputs. Per size: the median milliseconds a run over --runs runs, best of --repeats rounds taken size by size in
turn; then, per size, the run in the bucket that holds it today against one of its own, and what the rows past it
cost. --cpu: the CPU provider (the same table for the CPU runtime; its runs are not bucketed today).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

root = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(root / "scripts"), str(root)]

from bench_runtime import wall_median  # noqa: E402

from jetpipe import bundle as bundles  # noqa: E402
from jetpipe.runtime.backends import batch_buckets  # noqa: E402


def session_of(model: Path, cpu: bool):
    import onnxruntime as ort

    providers = ["CPUExecutionProvider"] if cpu else [("CUDAExecutionProvider", {"device_id": 0}),
                                                      "CPUExecutionProvider"]
    session = ort.InferenceSession(str(model), providers=providers)
    if not cpu and session.get_providers()[0] != "CUDAExecutionProvider":
        sys.exit("error: ONNX Runtime's CUDA provider is not available here: pass --cpu, or install onnxruntime-gpu")
    return session


def bound_run(session, size: int, shape, cpu: bool):
    """A function that runs one batch of `size`, its input and outputs bound where the provider works."""
    import onnxruntime as ort

    place = "cpu" if cpu else "cuda"
    x = np.random.default_rng(size).random((size, *shape), dtype=np.float32)
    value = ort.OrtValue.ortvalue_from_numpy(x, place, 0)
    binding = session.io_binding()
    binding.bind_ortvalue_input(session.get_inputs()[0].name, value)
    for output in session.get_outputs():
        binding.bind_output(output.name, place)
    return lambda: session.run_with_iobinding(binding)  # waits for the run (ORT synchronizes its stream)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu", action="store_true", help="ONNX Runtime's CPU provider")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    manifest = bundles.load(args.bundle)
    model = args.bundle / manifest["model"]
    max_batch = int(manifest["batch"]["max"])
    shape = [int(d) for d in manifest["io"]["inputs"][0]["shape"][1:]]
    sizes = list(range(1, max_batch + 1))
    runs = {n: bound_run(session_of(model, args.cpu), n, shape, args.cpu) for n in sizes}
    best = {n: float("inf") for n in sizes}
    for _ in range(args.repeats):  # sizes in turn each round: a clock or a neighbour's change spread over all
        for n in sizes:
            best[n] = min(best[n], wall_median(runs[n], args.runs))  # after 20 warm-up runs
    buckets = batch_buckets(max_batch)
    rows = []
    print(f"{'frames':>6} {'own ms':>8} {'bucket':>6} {'bucket ms':>9} {'rows past it':>12}")
    for n in sizes:
        bucket = next(b for b in buckets if b >= n)
        waste = best[bucket] / best[n] - 1
        rows.append({"frames": n, "own_ms": round(best[n], 3), "bucket": bucket, "bucket_ms": round(best[bucket], 3),
                     "past_share": round(waste, 3)})
        print(f"{n:>6} {best[n]:>8.3f} {bucket:>6} {best[bucket]:>9.3f} {waste:>11.1%}")
    if args.json:
        args.json.write_text(json.dumps({"provider": "cpu" if args.cpu else "cuda", "input": shape,
                                         "runs": args.runs, "repeats": args.repeats, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
