"""Grayscale (1-channel) networks end to end: convert, calibration data, the CPU runtime."""

import json

import numpy as np
import pytest

from jetpipe.cli import main
from jetpipe.frames import from_bgr
from jetpipe.preprocess import preprocess_frame
from jetpipe.runtime.api import Frame
from jetpipe.runtime.cpu_runtime import CpuRuntime
from jetpipe.runtime.sessions import cpu_session
from jetpipe.spec import PreprocessSpec
from jetpipe.synth import render_text_image
from tests.helpers import gray_recognizer, residual_cnn, save


@pytest.fixture(scope="module")
def gray_bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gray")
    out = folder / "bundle"
    assert main(["convert", save(gray_recognizer(), folder / "rec.onnx"), "-o", str(out), "--max-batch", "4",
                 "--mean", "0.5", "--std", "0.5", "--engine", "never", "--quiet"]) == 0
    return out


def test_a_one_channel_model_is_fed_gray(gray_bundle):
    manifest = json.loads((gray_bundle / "manifest.json").read_text())
    assert manifest["preprocess"]["channel_order"] == "gray"
    assert manifest["preprocess"]["mean"] == [0.5] and manifest["preprocess"]["std"] == [0.5]
    assert manifest["io"]["inputs"][0]["shape"][1:] == [1, 32, 128]


@pytest.mark.parametrize("fmt", ["nv12", "yuyv", "bgr"])
def test_the_cpu_runtime_feeds_the_luma_of_any_frame(gray_bundle, fmt):
    spec = PreprocessSpec(channel_order="gray", mean=(0.5,), std=(0.5,))
    images = [render_text_image(i, (60 + 20 * i, 300)).bgr for i in range(3)]
    frames = [from_bgr(img, fmt) for img in images]
    with CpuRuntime(gray_bundle, exact_preprocess=True) as runtime:
        got = runtime.infer([Frame(f, fmt) for f in frames]).outputs["y"]
    inputs = np.stack([preprocess_frame(f, fmt, (32, 128), spec)[0] for f in frames])
    assert inputs.shape == (3, 1, 32, 128)
    want = cpu_session(str(gray_bundle / "model.onnx")).run(None, {"x": inputs})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_int8_calibrates_a_gray_model_on_synthetic_text(tmp_path):
    out = tmp_path / "b"
    assert main(["convert", save(gray_recognizer(), tmp_path / "rec.onnx"), "-o", str(out), "--precision", "int8",
                 "--calib", "synthetic", "--calib-size", "4", "--force-synthetic", "--engine", "never", "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["calibration"]["samples"] == 4 and manifest["preprocess"]["channel_order"] == "gray"


def test_colour_statistics_for_a_gray_model_are_refused(tmp_path, capsys):
    model = save(gray_recognizer(), tmp_path / "rec.onnx")
    assert main(["convert", model, "-o", str(tmp_path / "b"), "--preset", "imagenet", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "takes 1 channel (gray) but mean [0.485, 0.456, 0.406]" in err and "Traceback" not in err
    assert not (tmp_path / "b").exists()


def test_gray_for_a_colour_model_is_refused(tmp_path, capsys):
    model = save(residual_cnn(), tmp_path / "cnn.onnx")
    assert main(["convert", model, "-o", str(tmp_path / "b"), "--channel-order", "gray", "--mean", "0",
                 "--std", "1", "--quiet"]) == 2
    assert "channel order gray feeds 1-channel networks; this one takes 3 channels" in capsys.readouterr().err


def test_synthetic_calibration_for_a_line_shaped_input_renders_text_lines(tmp_path, caplog):
    from jetpipe.convert.calib_data import open_source

    source = open_source("synthetic", (1, 1, 32, 128), (32, 128), PreprocessSpec(channel_order="gray",
                                                                                  mean=(0.5,), std=(0.5,)), 4)
    assert source.lines and source.describe() == "text lines"
    frame = next(source.frames())
    assert frame.shape == (32, 128, 3)
    ink = (np.abs(frame.astype(int) - np.median(frame, axis=(0, 1))).max(axis=2) > 60).any(axis=0)
    assert ink[: 128 // 2].mean() > 0.3  # one line of words across the crop, not a few scattered words
    out = tmp_path / "b"
    assert main(["convert", save(gray_recognizer(), tmp_path / "rec.onnx"), "-o", str(out), "--precision", "int8",
                 "--calib", "synthetic", "--calib-size", "4", "--force-synthetic", "--engine", "never", "--quiet"]) == 0
    assert any("--calib synthetic renders text lines, made for text recognizers" in r.getMessage()
               for r in caplog.records)
