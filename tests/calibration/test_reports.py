"""`jetpipe calibrate accuracy | latency` end to end, reports, plots, bad input."""

import json

import numpy as np
import pytest

from jetpipe.cli import main
from jetpipe.synth import write_text_images
from tests.helpers import residual_cnn, save

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cal")
    model = save(residual_cnn(batch=1), folder / "tiny.onnx")
    images = write_text_images(folder / "imgs", 6, size_hw=(48, 64))
    bundle = folder / "b16"
    assert main(["convert", model, "-o", str(bundle), "--precision", "fp16", "--calib", str(images),
                 "--max-batch", "4", "--quiet"]) == 0
    return folder, model, images, bundle


def _valid_pngs(folder):
    import matplotlib.image

    report = json.loads((folder / "report.json").read_text())
    for name in report["plots"]:
        data = (folder / name).read_bytes()
        assert data.startswith(PNG)
        assert matplotlib.image.imread(folder / name).ndim == 3
    return report


def test_accuracy_report_on_a_tiny_fp16_bundle(tiny, capsys):
    folder, _, images, bundle = tiny
    out = folder / "acc"
    assert main(["calibrate", "accuracy", str(bundle), "--data", str(images), "--task", "classification",
                 "--report", str(out)]) == 0
    report = _valid_pngs(out)
    assert report["task_metrics"]["top1"] == 1.0 and report["outputs"]["y"]["cosine"] > 0.999
    assert {"layer_errors.png", "error_histogram.png"} <= set(report["plots"])
    assert "# Accuracy:" in (out / "report.md").read_text()
    assert "| top1 | 1 |" in capsys.readouterr().out


def test_latency_report_on_the_cpu(tiny, capsys):
    folder, _, _, bundle = tiny
    out = folder / "lat"
    assert main(["calibrate", "latency", str(bundle), "--batch", "1,2,4", "--iterations", "5", "--warmup", "1",
                 "--source", "synthetic:320x240:nv12", "--report", str(out)]) == 0
    report = _valid_pngs(out)
    assert [r["batch"] for r in report["batches"]] == [1, 2, 4]
    for row in report["batches"]:
        assert set(row["stages_ms"]) == {"preprocess", "infer", "postprocess"}
        assert all(s["count"] == 5 for s in (*row["stages_ms"].values(), row["total_ms"]))  # warm-up left out
        # each call's wall time holds its stages: the mean total is at least the sum of the stage means
        assert row["total_ms"]["mean"] >= sum(s["mean"] for s in row["stages_ms"].values())
        assert row["throughput_fps"] == pytest.approx(row["batch"] * 1000 / row["total_ms"]["p50"])
    assert report["device"]["kind"] == "cpu" and report["backend"] == "onnxruntime-cpu"


@pytest.mark.parametrize("args, message", [
    (["--task", "detection-yolo"], "--task detection-yolo: the model's outputs do not fit: expects one output "
                                   "\\[N, 4\\+C, A\\]"),
    (["--reference", "{other}"], "different I/O"),
    (["--data", "{bad_npy}"], "needs float32 \\[N, 3, 16, 16\\]"),
    (["--budget", "f1=0.9"], "write METRIC>=VALUE"),
])
def test_bad_input_is_one_clear_line_and_no_report(tiny, tmp_path, capsys, args, message):
    import re

    folder, _, images, bundle = tiny
    other = save(residual_cnn(size=8), tmp_path / "other.onnx")
    other_model = residual_cnn()
    other_model.graph.output[0].name = "scores"
    other_model.graph.node[-1].output[0] = "scores"
    save(other_model, tmp_path / "other.onnx")
    np.save(tmp_path / "bad.npy", np.zeros((2, 3, 8, 8), np.float32))
    args = [a.format(other=other, bad_npy=tmp_path / "bad.npy") for a in args]
    base = ["calibrate", "accuracy", str(bundle), "--report", str(tmp_path / "r")]
    if "--data" not in args:
        base += ["--data", str(images)]
    assert main([*base, *args]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and re.search(message, err), err
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_precision_search_meets_a_budget_plain_int8_misses(tmp_path, det_model_path, capsys):
    """PP-OCRv4 det INT8 without sensitive-layer exclusion misses f1>=0.99; the search fixes it,
    and `convert --exclude-from` rebuilds the bundle with its choice."""
    bundle, report_dir = tmp_path / "int8", tmp_path / "report"
    images = write_text_images(tmp_path / "eval", 8, seed=0, size_hw=(240, 320))  # not calibration seeds
    size = ["--input-size", "320x320"]  # the search's steps at a quarter of 640's pixels: a quarter of the time
    assert main(["convert", "ppocr-det", "-o", str(bundle), "--precision", "int8", "--calib", "synthetic",
                 "--calib-size", "16", "--no-auto-exclude", *size, "--quiet"]) == 0
    code = main(["calibrate", "accuracy", str(bundle), "--data", str(images), "--budget", "f1>=0.99",
                 "--report", str(report_dir)])
    report = _valid_pngs(report_dir)
    assert report["budget"]["met"] is False and report["budget"]["value"] < 0.99
    search = report["precision_search"]
    assert search["met"] is True and search["value"] >= 0.99 and code == 0
    assert 1 <= len(search["added"]) <= 32 and "precision_search.png" in report["plots"]
    rebuilt = tmp_path / "int8-searched"
    assert main(["convert", "ppocr-det", "-o", str(rebuilt), "--precision", "int8", "--calib", "synthetic",
                 "--calib-size", "16", "--exclude-from", str(report_dir), *size, "--quiet"]) == 0
    manifest = json.loads((rebuilt / "manifest.json").read_text())
    assert set(manifest["excluded_nodes"]) == set(search["excluded_nodes"])
    check = tmp_path / "check"
    assert main(["calibrate", "accuracy", str(rebuilt), "--data", str(images), "--budget", "f1>=0.99",
                 "--no-search", "--report", str(check)]) == 0
    assert json.loads((check / "report.json").read_text())["budget"]["met"] is True


@pytest.mark.slow
def test_unreachable_budget_is_a_verdict_not_a_crash(tmp_path, det_model_path, capsys):
    bundle, report_dir = tmp_path / "int8", tmp_path / "report"
    images = write_text_images(tmp_path / "eval", 4, seed=0, size_hw=(240, 320))
    # at 160x160: a budget no per-node precision reaches is out of reach at any size (a sixteenth of 640's pixels)
    assert main(["convert", "ppocr-det", "-o", str(bundle), "--precision", "int8", "--calib", "synthetic",
                 "--calib-size", "8", "--input-size", "160x160", "--quiet"]) == 0
    code = main(["calibrate", "accuracy", str(bundle), "--data", str(images), "--budget", "mae<=1e-9",
                 "--report", str(report_dir)])
    assert code == 1
    report = json.loads((report_dir / "report.json").read_text())
    assert report["precision_search"]["met"] is False
    assert "out of reach" in report["precision_search"]["why"]
    assert "budget not reachable" in (report_dir / "report.md").read_text()


def test_accuracy_from_another_folder_finds_the_source_model(tmp_path, monkeypatch, capsys):
    # convert run with a relative model path; calibrate run elsewhere, with no --reference
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir(), elsewhere.mkdir()
    save(residual_cnn(batch=1), work / "tiny.onnx")
    write_text_images(work / "imgs", 3, size_hw=(48, 64))
    monkeypatch.chdir(work)
    assert main(["convert", "tiny.onnx", "-o", "b", "--max-batch", "2", "--quiet"]) == 0
    monkeypatch.chdir(elsewhere)
    assert main(["calibrate", "accuracy", str(work / "b"), "--data", str(work / "imgs"), "--task",
                 "classification", "--report", "acc"]) == 0, capsys.readouterr().err
    assert json.loads((work / "b" / "manifest.json").read_text())["source"]["path"] == str(work / "tiny.onnx")


def test_accuracy_sees_every_sample_once(tiny, tmp_path):
    """calibrate accuracy compares on all --samples images, each once (it saw the last batch repeated)."""
    from jetpipe.calibration.accuracy import AccuracyOptions, prepare_context

    folder, _, images, bundle = tiny
    ctx = prepare_context(AccuracyOptions(bundle=bundle, data=str(images), report=tmp_path / "r", samples=6,
                                          batch=4, task="classification"))
    assert len(ctx.inputs) == 6 and len({s.tobytes() for s in ctx.inputs}) == 6


def test_accuracy_through_the_runtime_that_serves_the_bundle(tiny, tmp_path, capsys):
    """--backend: the bundle measured through a runtime (here the CPU one), the samples fed as NV12 frames the
    way sources hand them to serve, the FP32 reference reading the same frames; .npy tensors cannot be."""
    folder, _, images, bundle = tiny
    out = tmp_path / "served"
    assert main(["calibrate", "accuracy", str(bundle), "--data", str(images), "--task", "classification",
                 "--backend", "onnxruntime-cpu", "--report", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["measured_through"] == "onnxruntime-cpu runtime, NV12 frames preprocessed as serve does"
    assert report["samples"] == 6 and report["task_metrics"]["top1"] == 1.0
    assert report["outputs"]["y"]["cosine"] > 0.999
    assert "measured through its onnxruntime-cpu runtime" in capsys.readouterr().out
    tensors = tmp_path / "x.npy"
    np.save(tensors, np.zeros((4, 3, 16, 16), np.float32))
    assert main(["calibrate", "accuracy", str(bundle), "--data", str(tensors), "--backend", "onnxruntime-cpu",
                 "--report", str(tmp_path / "npy")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--backend needs images or video frames" in err
