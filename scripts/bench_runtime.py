#!/usr/bin/env python3
"""P2: runtime overhead over the bare backend; mapped vs staged frames end to end.

For each model and batch: the bare backend (ONNX Runtime CUDA EP, IOBinding on
device buffers, run_with_iobinding in a tight loop) against jetpipe's GpuRuntime
infer() from host NV12 1920x1080 frames. The runtime does more GPU work than the
bare loop (frame upload, preprocessing kernel, output download), measured with
CUDA events per stage; overhead = runtime wall - bare wall - that extra GPU work.
Models: PP-OCRv4 det (from rapidocr-onnxruntime) and ResNet-50 (torchvision,
random weights, exported here when torch is present).

    python scripts/bench_runtime.py [--batches 1,8] [--iterations 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jetpipe.frames import from_bgr  # noqa: E402
from jetpipe.runtime.api import Frame  # noqa: E402
from jetpipe.synth import render_text_image  # noqa: E402


def wall_median(fn, iterations: int) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def bare_backend(model_path: str, sample_shape, batch: int, iterations: int, cuda_graph: bool = False) -> float:
    """The backend alone: ORT CUDA EP, I/O bound to device buffers, called in a loop (ms per run);
    cuda_graph: ORT captures the run once and replays it."""
    import pycuda.driver as cuda

    cuda.init()
    context = cuda.Device(0).retain_primary_context()
    context.push()
    try:
        return _bare_backend(model_path, sample_shape, batch, iterations, cuda_graph)
    finally:
        cuda.Context.pop()
        context.detach()


def _bare_backend(model_path: str, sample_shape, batch: int, iterations: int, cuda_graph: bool) -> float:
    import onnxruntime as ort
    import pycuda.driver as cuda

    options = ort.SessionOptions()
    options.log_severity_level = 3
    cuda_options = {"use_tf32": "0", **({"enable_cuda_graph": "1"} if cuda_graph else {})}
    session = ort.InferenceSession(model_path, options, providers=[("CUDAExecutionProvider", cuda_options)])
    probe = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    outs = probe.run(None, {probe.get_inputs()[0].name: np.zeros((1, *sample_shape), np.float32)})
    x = cuda.mem_alloc(int(np.prod((batch, *sample_shape))) * 4)
    cuda.memcpy_htod(x, np.random.default_rng(0).standard_normal((batch, *sample_shape)).astype(np.float32))
    binding = session.io_binding()
    binding.bind_input(session.get_inputs()[0].name, "cuda", 0, np.float32, [batch, *sample_shape], int(x))
    keep = [x]
    for meta, value in zip(session.get_outputs(), outs):
        y = cuda.mem_alloc(value.nbytes * batch)
        keep.append(y)
        binding.bind_output(meta.name, "cuda", 0, value.dtype, [batch, *value.shape[1:]], int(y))
    ms = wall_median(lambda: session.run_with_iobinding(binding), iterations)
    for buf in keep:
        buf.free()
    return ms


def runtime_numbers(bundle: Path, batch: int, iterations: int, memory: str, cuda_graph: bool = False) -> dict:
    from jetpipe.runtime.gpu_runtime import GpuRuntime

    frames = [Frame(from_bgr(render_text_image(i, (1080, 1920)).bgr, "nv12"), "nv12") for i in range(batch)]
    with GpuRuntime(bundle, max_batch=batch, memory=memory, profile=True, cuda_graph=cuda_graph) as rt:
        wall = wall_median(lambda: rt.infer(frames), iterations)
        stages = []
        for _ in range(50):
            ticket = rt.submit(frames)
            rt.collect(ticket)
            stages.append(rt.stage_times(ticket))
    medians = {k: float(np.median([s[k] for s in stages])) for k in stages[0]}
    return {"wall_ms": wall, **{f"{k}_ms": v for k, v in medians.items()}}


def make_bundles(workdir: Path, resnet: bool = True) -> dict[str, Path]:
    from jetpipe.convert import ConvertOptions, convert
    from jetpipe.models import BUILTIN
    from jetpipe.spec import preset

    bundles = {}
    det = BUILTIN["ppocr-det"]
    bundles["PP-OCRv4 det 640x640"] = workdir / "det"
    convert(ConvertOptions(model=det.path(), output=workdir / "det", input_size=det.input_size, max_batch=8,
                           spec=preset("ppocr-det"), engine="never", progress=False, task=det.task))
    onnx_path = export_resnet50(workdir) if resnet else None
    if onnx_path is not None:
        bundles["ResNet-50 224x224"] = workdir / "resnet"
        convert(ConvertOptions(model=onnx_path, output=workdir / "resnet", max_batch=8, spec=preset("imagenet"),
                               engine="never", progress=False, task="classification"))
    return bundles


def export_resnet50(workdir: Path) -> Path | None:
    try:
        import torch
        import torchvision
    except ImportError:
        print("torch/torchvision not found: ResNet-50 skipped")
        return None
    model = torchvision.models.resnet50(weights=None).eval()
    path = workdir / "resnet50.onnx"
    dummy = torch.randn(1, 3, 224, 224)
    kwargs = dict(input_names=["x"], output_names=["logits"], opset_version=17,
                  dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    try:
        torch.onnx.export(model, dummy, str(path), dynamo=False, **kwargs)
    except TypeError:
        torch.onnx.export(model, dummy, str(path), **kwargs)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--batches", default="1,8", type=lambda s: [int(v) for v in s.split(",")])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import pycuda.driver as cuda

    from jetpipe import bundle as bundle_io

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        bundles = make_bundles(Path(tmp))
        cuda.init()
        context = cuda.Device(0).retain_primary_context()
        context.push()
        try:
            for name, path in bundles.items():
                manifest = bundle_io.read_manifest(path)
                sample = (3, *manifest["input_size"])
                for batch in args.batches:
                    bare = bare_backend(str(path / "model.onnx"), sample, batch, args.iterations)
                    row = {"model": name, "batch": batch, "bare_ms": bare}
                    for memory in ("staged", "mapped"):
                        row[memory] = runtime_numbers(path, batch, args.iterations, memory)
                    row["staged_cuda_graph"] = runtime_numbers(path, batch, args.iterations, "staged", True)
                    staged = row["staged"]
                    extra = staged["h2d_ms"] + staged["preprocess_ms"] + staged["d2h_ms"]
                    row["overhead_ms"] = staged["wall_ms"] - bare - extra
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            context.pop()
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


def print_table(rows) -> None:
    print(f"\n{'model':<22}{'batch':>6}{'bare':>9}{'runtime':>9}{'h2d':>8}{'pre':>8}{'infer':>8}{'d2h':>8}"
          f"{'overhead':>10}{'mapped':>9}{'graph':>9}   (ms, median)")
    for r in rows:
        s = r["staged"]
        print(f"{r['model']:<22}{r['batch']:>6}{r['bare_ms']:>9.3f}{s['wall_ms']:>9.3f}{s['h2d_ms']:>8.3f}"
              f"{s['preprocess_ms']:>8.3f}{s['infer_ms']:>8.3f}{s['d2h_ms']:>8.3f}{r['overhead_ms']:>10.3f}"
              f"{r['mapped']['wall_ms']:>9.3f}{r['staged_cuda_graph']['wall_ms']:>9.3f}")


if __name__ == "__main__":
    main()
