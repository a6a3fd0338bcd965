#!/usr/bin/env python3
"""A1 / A2 / P5 for PP-OCRv4 det: jetpipe bundles against FP32, peers side by side.

  # accuracy of existing bundles on ONNX Runtime CPU (and CUDA where onnxruntime-gpu is installed)
  python scripts/measure_convert.py accuracy --fp16 B16 --int8 B8 [--providers cpu,cuda] [--images 32]
  # the same run also quantizes with ONNX Runtime's quantize_static (the peer) when --peers is given
  # P5: peak RSS of `jetpipe convert --precision int8` over N calibration images of 640x640
  python scripts/measure_convert.py memory --images 256

Evaluation images are rendered with seeds 0..N-1; jetpipe's default calibration
uses seeds >= 10000, the peer's calibration seeds 20000+, so none is evaluated on.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jetpipe.bundle import MODEL_FILE  # noqa: E402
from jetpipe.calibration.textdet_eval import eval_inputs, run_batched, score  # noqa: E402
from jetpipe.convert import graph  # noqa: E402
from jetpipe.models import BUILTIN  # noqa: E402
from jetpipe.spec import preset  # noqa: E402

DET = BUILTIN["ppocr-det"]


def session(model, provider: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if provider == "cuda":
        # no TF32: the FP32 reference must really be FP32
        providers = [("CUDAExecutionProvider", {"use_tf32": 0}), "CPUExecutionProvider"]
    else:
        providers = ["CPUExecutionProvider"]
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=providers)


def reference_model(path: Path):
    return graph.fix_input_size(graph.load(path), DET.input_size)


def peer_quantize_static(fp32_path: Path, method: str, calib_images: int, workdir: Path) -> Path:
    """ONNX Runtime's quantize_static: QDQ, symmetric, per-channel, as the issue measured it."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    from jetpipe.convert.calib_data import SyntheticText

    model = graph.upgrade_opset(reference_model(fp32_path))
    src_path = workdir / "fp32_opset13.onnx"
    import onnx

    onnx.save(model, str(src_path))

    class Reader(CalibrationDataReader):
        def __init__(self):
            source = SyntheticText(DET.input_size, preset("ppocr-det"), calib_images)
            source.seed = 20_000
            self.batches = iter(source.batches(1))

        def get_next(self):
            batch = next(self.batches, None)
            return None if batch is None else {"x": batch.copy()}

    out = workdir / f"peer_{method}.onnx"
    methods = {"percentile": CalibrationMethod.Percentile, "minmax": CalibrationMethod.MinMax,
               "entropy": CalibrationMethod.Entropy}
    quantize_static(str(src_path), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    calibrate_method=methods[method],
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
    return out


def accuracy(args) -> dict:
    inputs = eval_inputs(args.images, DET.input_size, preset("ppocr-det"))
    fp32 = reference_model(DET.path())
    candidates = {name: str(Path(b) / MODEL_FILE) for name, b in
                  (("jetpipe fp16", args.fp16), ("jetpipe int8", args.int8)) if b}
    results: dict = {"images": args.images, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.peers:
            start = time.time()
            candidates[f"ORT quantize_static {method} ({args.peer_calib} img)"] = str(
                peer_quantize_static(DET.path(), method, args.peer_calib, Path(tmp)))
            print(f"peer {method} quantized in {time.time() - start:.0f} s", flush=True)
        for provider in args.providers:
            ref = run_batched(session(fp32, provider), inputs)
            for name, path in candidates.items():
                out = run_batched(session(path, provider), inputs)
                s = score(ref, out)
                row = {"model": name, "provider": provider, "f1_mean": s.f1_mean, "f1_min": s.f1_min,
                       "mae": s.mae}
                results["rows"].append(row)
                print(f"{provider:5} {name:42} {s.line()}", flush=True)
    return results


def memory(args) -> dict:
    from jetpipe.synth import write_text_images

    with tempfile.TemporaryDirectory() as tmp:
        folder = write_text_images(Path(tmp) / "calib", args.images, seed=20_000, size_hw=(640, 640))
        command = [sys.executable, "-m", "jetpipe", "convert", "ppocr-det", "-o", str(Path(tmp) / "b"),
                   "--precision", "int8", "--calib", str(folder), "--calib-size", str(args.images),
                   "--quiet"]
        start = time.time()
        subprocess.run(command, check=True)
        elapsed = time.time() - start
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"P5: jetpipe convert --precision int8 with {args.images} images of 640x640: "
          f"peak RSS {peak_mb:.0f} MB, {elapsed:.0f} s")
    return {"images": args.images, "peak_rss_mb": peak_mb, "seconds": elapsed,
            "command": " ".join(command[1:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    a = sub.add_parser("accuracy")
    a.add_argument("--fp16")
    a.add_argument("--int8")
    a.add_argument("--providers", default="cpu", type=lambda s: s.split(","))
    a.add_argument("--images", type=int, default=32)
    a.add_argument("--peers", default="", type=lambda s: [m for m in s.split(",") if m],
                   help="ORT quantize_static methods to compare, e.g. percentile,minmax")
    a.add_argument("--peer-calib", type=int, default=16)
    m = sub.add_parser("memory")
    m.add_argument("--images", type=int, default=256)
    for p in (a, m):
        p.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    results = accuracy(args) if args.what == "accuracy" else memory(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
