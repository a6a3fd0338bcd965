"""Calibration reports on the GPU (marker gpu): PyCUDA + onnxruntime-gpu."""

import json

import pytest

from jetpipe.cli import main
from jetpipe.synth import write_text_images

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _cuda_ep():
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu (CUDA execution provider) is not installed")


@pytest.fixture(scope="module")
def fp16_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("calgpu") / "det16"
    assert main(["convert", "ppocr-det", "-o", str(out), "--precision", "fp16", "--calib", "synthetic",
                 "--calib-size", "8", "--quiet"]) == 0
    return out


def test_accuracy_on_the_cuda_provider(fp16_bundle, tmp_path):
    images = write_text_images(tmp_path / "eval", 8, seed=0, size_hw=(480, 640))
    report_dir = tmp_path / "acc"
    assert main(["calibrate", "accuracy", str(fp16_bundle), "--data", str(images), "--provider", "cuda",
                 "--budget", "f1>=0.99", "--report", str(report_dir)]) == 0
    report = json.loads((report_dir / "report.json").read_text())
    assert report["provider"] == "cuda" and report["budget"]["met"]
    assert report["task_metrics"]["mae"] <= 1e-3 and report["layers"]


def test_latency_stages_from_cuda_events(fp16_bundle, tmp_path):
    report_dir = tmp_path / "lat"
    assert main(["calibrate", "latency", str(fp16_bundle), "--batch", "1,4,8", "--iterations", "30",
                 "--backend", "onnxruntime-cuda", "--report", str(report_dir)]) == 0
    report = json.loads((report_dir / "report.json").read_text())
    assert report["device"]["kind"] == "gpu" and report["backend"] == "onnxruntime-cuda"
    for row in report["batches"]:
        stages = row["stages_ms"]
        assert set(stages) == {"h2d", "preprocess", "infer", "d2h", "postprocess"}
        assert all(s["count"] == 30 for s in (*stages.values(), row["total_ms"]))  # warm-up left out
        # preprocessing, inference and postprocessing run one after another inside each timed call
        assert row["total_ms"]["mean"] >= sum(stages[k]["mean"] for k in ("preprocess", "infer", "postprocess"))
    print((report_dir / "report.md").read_text())


def test_accuracy_through_the_gpu_runtime_equals_the_cpu_runtimes(fp16_bundle, tmp_path):
    """--backend onnxruntime-cuda: the samples as NV12 frames through the fused kernel and the CUDA EP; the
    same frames through the CPU runtime give the same figures within tolerance."""
    images = write_text_images(tmp_path / "eval", 8, seed=0, size_hw=(480, 640))
    figures = {}
    for backend in ("onnxruntime-cuda", "onnxruntime-cpu"):
        report_dir = tmp_path / backend
        assert main(["calibrate", "accuracy", str(fp16_bundle), "--data", str(images), "--backend", backend,
                     "--no-search", "--report", str(report_dir)]) == 0
        report = json.loads((report_dir / "report.json").read_text())
        assert report["measured_through"].startswith(f"{backend} runtime")
        figures[backend] = report["task_metrics"]
    gpu, cpu = figures["onnxruntime-cuda"], figures["onnxruntime-cpu"]
    assert gpu["box_f1"] == pytest.approx(cpu["box_f1"], abs=0.02)
    assert gpu["f1"] == pytest.approx(cpu["f1"], abs=0.01) and gpu["mae"] <= 2 * cpu["mae"] + 1e-3
