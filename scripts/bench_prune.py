#!/usr/bin/env python3
"""Latency of a pruned PP-OCRv4 det against the unpruned one: ONNX Runtime CUDA EP, device buffers.

    python scripts/bench_prune.py [--ratio 0.2] [--method reconstruct] [--batches 1,8] [--json out.json]

Both models are converted here (FP32, 640x640); the pruned one with `--prune RATIO
--prune-method METHOD --calib synthetic`. The bare-backend loop of bench_runtime.py
times each at each batch size (median of 200 runs).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root), str(root / "scripts")]

from bench_runtime import bare_backend  # noqa: E402

from jetpipe import bundle as bundle_io  # noqa: E402
from jetpipe.convert import ConvertOptions, convert  # noqa: E402
from jetpipe.models import BUILTIN  # noqa: E402
from jetpipe.spec import preset  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--ratio", type=float, default=0.2)
    parser.add_argument("--method", default="reconstruct")
    parser.add_argument("--batches", default="1,8", type=lambda s: [int(v) for v in s.split(",")])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    det = BUILTIN["ppocr-det"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        variants = {"dense": {}, f"pruned {args.method} {args.ratio:g}":
                    {"prune": args.ratio, "prune_method": args.method, "calib": "synthetic", "calib_size": 8}}
        for name, extra in variants.items():
            out = Path(tmp) / name.replace(" ", "_")
            convert(ConvertOptions(model=det.path(), output=out, input_size=det.input_size, max_batch=8,
                                   spec=preset(det.preset), engine="never", progress=False, **extra))
            cost = bundle_io.read_manifest(out)["cost"]["processed"]
            for batch in args.batches:
                ms = bare_backend(str(out / "model.onnx"), (3, *det.input_size), batch, 200)
                rows.append({"model": name, "batch": batch, "ms": ms, "gflops": cost["flops"] / 1e9,
                             "params_m": cost["params"] / 1e6})
                print(json.dumps(rows[-1]), flush=True)
    for r in rows:
        print(f"{r['model']:<28} batch {r['batch']}: {r['ms']:.3f} ms  ({r['gflops']:.2f} GFLOPs/img, "
              f"{r['params_m']:.2f} M params)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
