#!/usr/bin/env python3
"""What a partial batch costs in the batch bucket that runs it (issue 66 targets 2 and 3): before session 64 the GPU
runtime kept an ONNX Runtime session per power-of-two bucket, 1, 2, 4 and 8, so a batch of 5-7 frames ran as 8; 32
network cameras with two model instances average 6.9 frames a batch (session 63). Now every size up to 8 has its own
(backends.batch_buckets): this says what that gives back and what a session more costs (its memory).

  python scripts/diag/bucket_cost.py BUNDLE [--runs 200] [--repeats 3] [--cpu] [--cuda-option NAME=VALUE ...]

A session per batch size 1..the bundle's max batch, made as the GPU runtime makes them, each run only at its own
size (ORT's CUDA convolutions re-plan when the shape changes: backends.OrtCudaBackend), inputs and outputs bound on
the device (no copies timed), random inputs. Per size: the median milliseconds a run over --runs runs, best of
--repeats rounds taken size by size in turn; then, per size, the run in the power-of-two bucket that held it before
against one of its own, and what the rows past it cost; on the GPU also the device memory each size's session took
(nvidia-smi's memory.used after its first runs, against before it was made; the first holds the CUDA context's and
libraries' too). --cuda-option: a CUDA provider option more (e.g. arena_extend_strategy=kSameAsRequested: what it
does to the memory and the time). --cpu: the CPU provider (the same table for the CPU runtime; its runs are not
bucketed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

root = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(root / "scripts"), str(root)]

from bench_light import gpu_memory_used_mib  # noqa: E402
from bench_runtime import wall_median  # noqa: E402

from jetpipe import bundle as bundles  # noqa: E402
from jetpipe.runtime.backends import batch_buckets  # noqa: E402


def session_of(model: Path, cpu: bool, cuda_options: dict):
    """A session as the GPU runtime makes them (jetpipe.runtime.sessions: TF32 off), with cuda_options more."""
    from jetpipe.errors import JetpipeError
    from jetpipe.runtime.sessions import ort_session

    try:
        return ort_session(model, "cpu" if cpu else "cuda", cuda_options=cuda_options)
    except JetpipeError as exc:
        sys.exit(f"error: {exc} (or pass --cpu)")


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


def sessions_by_size(model: Path, sizes, shape, cpu: bool, cuda_options: dict):
    """A bound run per size, and (on the GPU) the MiB each size's session took once it had run."""
    runs, mib = {}, {}
    for n in sizes:
        before = None if cpu else gpu_memory_used_mib()
        runs[n] = bound_run(session_of(model, cpu, cuda_options), n, shape, cpu)
        for _ in range(3):  # the arena grows to the run's needs on its first runs
            runs[n]()
        after = None if cpu else gpu_memory_used_mib()
        mib[n] = round(after - before) if before is not None and after is not None else None
    return runs, mib


def name_value(text: str) -> tuple[str, str]:
    """--cuda-option NAME=VALUE (argparse says what is wrong in one line)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: NAME=VALUE, e.g. arena_extend_strategy=kSameAsRequested")
    return name, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu", action="store_true", help="ONNX Runtime's CPU provider")
    parser.add_argument("--cuda-option", action="append", default=[], metavar="NAME=VALUE", type=name_value,
                        help="a CUDA provider option more, e.g. arena_extend_strategy=kSameAsRequested")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    manifest = bundles.load(args.bundle)
    model = args.bundle / manifest["model"]
    max_batch = int(manifest["batch"]["max"])
    shape = [int(d) for d in manifest["io"]["inputs"][0]["shape"][1:]]
    sizes = list(range(1, max_batch + 1))
    cuda_options = dict(args.cuda_option)
    runs, mib = sessions_by_size(model, sizes, shape, args.cpu, cuda_options)
    best = {n: float("inf") for n in sizes}
    for _ in range(args.repeats):  # sizes in turn each round: a clock or a neighbour's change spread over all
        for n in sizes:
            best[n] = min(best[n], wall_median(runs[n], args.runs))  # after 20 warm-up runs
    buckets = batch_buckets(max_batch, every_size_up_to=1)  # the buckets before session 64: powers of two
    rows = []
    print(f"{'frames':>6} {'own ms':>8} {'bucket':>6} {'bucket ms':>9} {'rows past it':>12} {'session MiB':>11}")
    for n in sizes:
        bucket = next(b for b in buckets if b >= n)
        waste = best[bucket] / best[n] - 1
        rows.append({"frames": n, "own_ms": round(best[n], 3), "bucket": bucket, "bucket_ms": round(best[bucket], 3),
                     "past_share": round(waste, 3), "session_mib": mib[n]})
        print(f"{n:>6} {best[n]:>8.3f} {bucket:>6} {best[bucket]:>9.3f} {waste:>11.1%} {mib[n] or '-':>11}")
    if args.json:
        args.json.write_text(json.dumps({"provider": "cpu" if args.cpu else "cuda", "cuda_options": cuda_options,
                                         "input": shape,
                                         "runs": args.runs, "repeats": args.repeats, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
