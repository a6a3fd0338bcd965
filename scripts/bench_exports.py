#!/usr/bin/env python3
"""`jetpipe convert` on exports it was not developed on: what converts, how well, at what cost.

    python scripts/bench_exports.py MODEL.onnx[:HxW] ... --out DIR [--variants fp32,fp16,int8,prune]
        [--calib synthetic] [--jetpipe-root CHECKOUT] [--json out.json]

Each model is converted by `python -m jetpipe convert` in a child process (from CHECKOUT when given, to
compare with an older jetpipe), once per variant, at --max-batch 8: fp32, fp16 and int8 (calibrated on
--calib), and fp32 with --prune 0.3 (l1). Per run: exit status and the error's first line, wall time and
the child's peak RSS; from the bundle: the batch proof, the held-out "vs fp32" (or "pruned vs
unpruned") relative MAE convert measured, GFLOPs; and, measured here, batch-8 == 8 x batch-1 on the
bundle's model in ONNX Runtime (largest difference relative to the output's magnitude).

The models are exports a user brings (Ultralytics `YOLO("yolov8n.yaml").export(format="onnx")`,
torchvision models with `weights=None` through `torch.onnx.export`, the PP-OCRv4 recognizer): made in a
scratch environment, never checked in. Random weights say nothing about task accuracy; the relative
MAE against FP32 still says how far a step moved the outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import children  # scripts/children.py: run as a script, its folder is first on sys.path
import numpy as np

VARIANTS = {
    "fp32": [],
    "fp16": ["--precision", "fp16"],
    "int8": ["--precision", "int8"],
    "prune": ["--prune", "0.3"],
}


def run_child(command: list[str], env: dict, cwd: Path) -> dict:
    """Exit status, wall time, the first `error:` line and the last stderr lines of one child process
    (run in the checkout: `python -m` puts the working folder first on sys.path)."""
    child = children.run(command, cwd=cwd, env=env)
    err = child.stderr.splitlines()
    return {"exit": child.returncode, "seconds": child.seconds,
            "error": next((line for line in err if line.startswith("error")), None), "stderr_tail": err[-3:]}


def batch8_difference(model_path: Path) -> float | None:
    """Largest |batch-8 row - batch-1 run| over the output's largest magnitude, on random inputs."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    x = session.get_inputs()[0]
    shape = [d if isinstance(d, int) else None for d in x.shape]
    if shape[0] is not None:  # a fixed batch (--max-batch 1 or a refused rewrite): nothing to compare
        return None
    manifest = json.loads((model_path.parent / "manifest.json").read_text())
    h, w = manifest["input_size"]
    batch = np.random.default_rng(0).uniform(0, 1, (8, shape[1], h, w)).astype(np.float32)
    together = session.run(None, {x.name: batch})
    worst = 0.0
    for i in range(8):
        for alone, rows in zip(session.run(None, {x.name: batch[i:i + 1]}), together):
            scale = max(1.0, float(np.abs(rows).max()))
            worst = max(worst, float(np.abs(alone[0].astype(np.float64) - rows[i]).max()) / scale)
    return worst


def convert_one(model: str, size: str | None, variant: str, args, env) -> dict:
    out = Path(args.out).resolve() / f"{Path(model).stem}-{variant}"
    command = [sys.executable, "-m", "jetpipe", "convert", model, "-o", str(out), "--max-batch", "8", "--force",
               "--quiet", "--engine", "never", *VARIANTS[variant]]
    if size:
        command += ["--input-size", size]
    if variant in ("fp16", "int8") or args.calib_always:
        command += ["--calib", args.calib, "--calib-size", str(args.calib_size)]
        if args.force_synthetic:  # INT8 from rendered text for models that do not read text (refused without)
            command += ["--force-synthetic"]
    row = {"model": Path(model).name, "variant": variant,
           **run_child(["/usr/bin/time", "-f", "%M", *command], env, Path(env["PYTHONPATH"]))}
    row["peak_rss_gb"] = _peak_rss(row.pop("stderr_tail"))
    if row["exit"] != 0:
        row["error"] = row["error"] or f"exit status {row['exit']}"
        return row
    manifest = json.loads((out / "manifest.json").read_text())
    check = manifest.get("accuracy_check") or (manifest.get("pruning") or {}).get("check")
    row.update({
        "batch_proof": manifest["batch"].get("max_relative_difference"),
        "rewritten_reshapes": len(manifest["batch"].get("rewritten_reshapes") or []),
        "relative_mae": check and round(check["relative_mae"], 4),
        "held_out": check and check.get("held_out"),
        "gflops": round(manifest["cost"]["processed"]["flops"] / 1e9, 2),
        "gflops_source": round(manifest["cost"]["source"]["flops"] / 1e9, 2),
        "pruned_groups": len((manifest.get("pruning") or {}).get("pruned") or {}) or None,
        "batch8_vs_1": batch8_difference(out / "model.onnx"),
    })
    return row


def _peak_rss(stderr_tail: list[str]) -> float | None:
    """/usr/bin/time -f %M prints the child's peak RSS in KB as its last line."""
    try:
        return round(int(stderr_tail[-1]) / 1e6, 2)
    except (IndexError, ValueError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="MODEL.onnx or MODEL.onnx:HxW (for a dynamic input size)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--calib", default="synthetic")
    parser.add_argument("--force-synthetic", action="store_true",
                        help="pass --force-synthetic to convert (checkouts from 2026-11-24 on refuse INT8 from "
                             "--calib synthetic for models that do not read text without it)")
    parser.add_argument("--calib-size", type=int, default=64, help="images (default 64, as convert's)")
    parser.add_argument("--calib-always", action="store_true",
                        help="give --calib to fp32 and prune too (the held-out check needs data)")
    parser.add_argument("--jetpipe-root", help="a checkout of jetpipe to run instead of this one")
    parser.add_argument("--json")
    args = parser.parse_args()
    root = Path(args.jetpipe_root or Path(__file__).resolve().parents[1]).resolve()
    env = {**os.environ, "PYTHONPATH": str(root)}
    rows = []
    for spec in args.models:
        model, _, size = spec.partition(":")
        model = str(Path(model).resolve())
        for variant in args.variants.split(","):
            row = convert_one(model, size or None, variant, args, env)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"jetpipe_root": str(root), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
