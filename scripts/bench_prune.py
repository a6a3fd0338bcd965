#!/usr/bin/env python3
"""Pruned PP-OCRv4 det against the dense one: accuracy (CPU) and latency (ONNX Runtime CUDA EP).

    python scripts/bench_prune.py accuracy --out DIR [--ratio 0.2] [--images 128] [--json out.json]
    python scripts/bench_prune.py latency DIR [--batches 1,8] [--json out.json]

`accuracy` converts the dense model and every pruning variant into DIR with
`jetpipe convert` options (FP32, 640x640, `--calib synthetic`), then scores each
on held-out rendered-text images (seeds 1000+, never calibration data):
binarized-map F1 against the dense model, and detection hmean against the
rendered words' boxes (the task metric). `latency` times every bundle in DIR
with the bare-backend loop of bench_runtime.py (median of 200 runs), in
`--repeats` interleaved rounds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root), str(root / "scripts")]

from jetpipe import bundle as bundle_io  # noqa: E402
from jetpipe.models import BUILTIN  # noqa: E402

VARIANTS = {  # name -> ConvertOptions fields on top of the dense conversion
    "dense": {},
    "l1": {"prune_method": "l1"},
    "reconstruct-uniform": {"prune_method": "reconstruct", "prune_allocation": "uniform"},
    "reconstruct": {"prune_method": "reconstruct"},
    "reconstruct-align1": {"prune_method": "reconstruct", "prune_align": 1},
}
EVAL_SEED = 1000


def accuracy(args) -> list[dict]:
    from jetpipe.calibration.textdet_eval import boxes_of, detection_hmean, eval_set, run_batched
    from jetpipe.convert import ConvertOptions, convert
    from jetpipe.runtime.sessions import cpu_session
    from jetpipe.spec import preset
    from jetpipe.tasks.agreement_metrics import per_sample_f1

    det = BUILTIN["ppocr-det"]
    inputs, letterboxes, truths = eval_set(args.images, det.input_size, preset(det.preset), EVAL_SEED)
    rows, reference = [], None
    for name, extra in VARIANTS.items():
        if args.variants and name not in args.variants and name != "dense":
            continue
        out = args.out / name
        started = time.perf_counter()
        pruning = {"prune": args.ratio, "calib": "synthetic", **extra} if extra else {}
        convert(ConvertOptions(model=det.path(), output=out, input_size=det.input_size, max_batch=8,
                               spec=preset(det.preset), engine="never", progress=False, force=True, **pruning))
        seconds = time.perf_counter() - started
        probabilities = run_batched(cpu_session(str(out / "model.onnx")), inputs)
        reference = probabilities if reference is None else reference
        f1 = per_sample_f1(reference, probabilities)
        score = detection_hmean(boxes_of(probabilities, letterboxes), truths)
        cost = bundle_io.read_manifest(out)["cost"]
        rows.append({"variant": name, "convert_s": round(seconds, 1), "params_m": cost["processed"]["params"] / 1e6,
                     "gflops": cost["processed"]["flops"] / 1e9,
                     "flops_removed": 1 - cost["processed"]["flops"] / cost["source"]["flops"],
                     "f1_vs_dense_mean": float(f1.mean()), "f1_vs_dense_min": float(f1.min()),
                     "hmean": score.hmean, "precision": score.precision, "recall": score.recall,
                     "images": args.images, "words": score.truths})
        print(json.dumps(rows[-1]), flush=True)
    dense = rows[0]["hmean"]
    print(f"\n{'variant':<22} {'GFLOPs':>7} {'removed':>8} {'F1 vs dense':>16} {'hmean':>7} {'drop':>6}")
    for r in rows:
        print(f"{r['variant']:<22} {r['gflops']:7.2f} {r['flops_removed']:8.1%} "
              f"{r['f1_vs_dense_mean']:8.4f}/{r['f1_vs_dense_min']:.4f} {r['hmean']:7.4f} "
              f"{100 * (dense - r['hmean']):6.2f}")
    return rows


def latency(args) -> list[dict]:
    """Round-robin over bundles and batch sizes, `--repeats` rounds: the GPU's state drifts between runs
    (a single pass once showed a pruned model 0.6 ms slower at batch 1, not reproduced after)."""
    from statistics import median

    from bench_runtime import bare_backend

    det = BUILTIN["ppocr-det"]
    folders = sorted(p for p in args.bundles.iterdir() if (p / "model.onnx").exists())
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for folder in folders:
            for batch in args.batches:
                ms = bare_backend(str(folder / "model.onnx"), (3, *det.input_size), batch, 200)
                times.setdefault((folder.name, batch), []).append(ms)
    rows = []
    for folder in folders:
        gflops = bundle_io.read_manifest(folder)["cost"]["processed"]["flops"] / 1e9
        for batch in args.batches:
            runs = times[(folder.name, batch)]
            rows.append({"variant": folder.name, "batch": batch, "ms": median(runs), "ms_min": min(runs),
                         "ms_max": max(runs), "repeats": len(runs), "gflops": gflops})
            print(json.dumps(rows[-1]), flush=True)
    for r in rows:
        print(f"{r['variant']:<22} batch {r['batch']}: {r['ms']:.3f} ms (range {r['ms_min']:.3f}-{r['ms_max']:.3f}, "
              f"{r['repeats']} rounds; {r['gflops']:.2f} GFLOPs/img)")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("accuracy", help="convert the variants into --out and score them on CPU")
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--ratio", type=float, default=0.2)
    a.add_argument("--images", type=int, default=128)
    a.add_argument("--variants", type=lambda s: s.split(","), help=f"a subset of {', '.join(VARIANTS)} (dense runs "
                   "always: the reference)")
    a.set_defaults(run=accuracy)
    t = sub.add_parser("latency", help="time every bundle of a folder on ONNX Runtime CUDA EP")
    t.add_argument("bundles", type=Path)
    t.add_argument("--batches", default="1,8", type=lambda s: [int(v) for v in s.split(",")])
    t.add_argument("--repeats", type=int, default=5, help="rounds over all bundles (median of 200 runs each)")
    t.set_defaults(run=latency)
    for p in (a, t):
        p.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = args.run(args)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
