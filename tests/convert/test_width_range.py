"""A dynamic input width kept in a range (--input-size HxMIN:OPT:MAX): text recognizers take any width.

On the real PP-OCRv4 recognizer shipped by rapidocr-onnxruntime (input [N, 3, ?, W])."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from jetpipe.cli import main
from jetpipe.models import BUILTIN
from jetpipe.runtime.sessions import cpu_session
from jetpipe.runtime.trt_builder import import_family
from tests.helpers import _model, residual_cnn, save

WIDTHS = (80, 320, 960)


@pytest.fixture(scope="module")
def rec_model():
    return BUILTIN["ppocr-det"].path().parent / "ch_PP-OCRv4_rec_infer.onnx"


def _lines(width: int, batch: int = 2) -> np.ndarray:
    return np.random.default_rng(width).uniform(-1, 1, (batch, 3, 48, width)).astype(np.float32)


def _outputs(model, width: int) -> np.ndarray:
    return cpu_session(str(model)).run(None, {"x": _lines(width)})[0]


@pytest.mark.parametrize("precision, tolerance", [("fp32", 1e-4), ("fp16", 2e-2)])
def test_a_recognizer_keeps_its_width_range(tmp_path, rec_model, capsys, precision, tolerance):
    out = tmp_path / precision
    assert main(["convert", str(rec_model), "-o", str(out), "--input-size", "48x80:320:960", "--max-batch", "4",
                 "--precision", precision, "--calib", "synthetic", "--calib-size", "4", "--quiet"]) == 0
    assert "input     x float32 [p2o.DynamicDimension.0, 3, 48, width]" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["input_size"] == [48, 320] and manifest["input_width_range"] == [80, 960]
    assert manifest["io"]["inputs"][0]["shape"][2:] == [48, "width"]
    for width in WIDTHS:  # the bundle runs at every width of the range, as the source does
        want, got = _outputs(rec_model, width), _outputs(out / "model.onnx", width)
        assert got.shape == want.shape == (2, width // 8, 6625)
        assert np.abs(got - want).max() < tolerance, (width, np.abs(got - want).max())


def test_a_width_range_counts_flops_at_the_opt_width(tmp_path, rec_model):
    costs = {}
    for size in ("48x320", "48x80:320:960"):
        out = tmp_path / size.replace(":", "-")
        assert main(["convert", str(rec_model), "-o", str(out), "--input-size", size, "--quiet"]) == 0
        costs[size] = json.loads((out / "manifest.json").read_text())["cost"]["source"]
    assert costs["48x80:320:960"] == costs["48x320"]


@pytest.mark.parametrize("size, message", [
    ("16x8:16:32", "a width range needs a dynamic input width, and this model's is fixed at 16"),
    ("16x32:16:64", "MIN <= OPT <= MAX"),
    ("16x8:16", "must look like HxW or HxMIN:OPT:MAX"),
])
def test_bad_width_ranges_are_one_line(tmp_path, capsys, size, message):
    model = save(residual_cnn(batch=1), tmp_path / "tiny.onnx")
    assert main(["convert", model, "-o", str(tmp_path / "b"), "--input-size", size, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "b").exists()


def test_a_width_the_model_cannot_take_is_refused(tmp_path, capsys):
    # an unpadded 3x9 Conv needs a width of at least 9
    w = numpy_helper.from_array(np.ones((4, 3, 3, 9), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], "narrow",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 6, "T"])], [w])
    model = save(_model(graph, 17), tmp_path / "narrow.onnx")
    assert main(["convert", model, "-o", str(tmp_path / "b"), "--input-size", "8x4:32:64", "--quiet"]) == 2
    assert "the model does not run at input size 8x4" in capsys.readouterr().err
    assert main(["convert", model, "-o", str(tmp_path / "b"), "--input-size", "8x9:32:64", "--quiet"]) == 0


@pytest.mark.skipif(import_family("tensorrt-rtx") is None, reason="TensorRT-RTX is not installed")
def test_the_engine_profile_spans_the_width_range(tmp_path, rec_model):
    out = tmp_path / "rtx"
    assert main(["convert", str(rec_model), "-o", str(out), "--input-size", "48x80:320:960", "--max-batch", "4",
                 "--engine", "require", "--engine-family", "tensorrt-rtx", "--rtx-targets", "sm89", "--quiet"]) == 0
    network = json.loads((out / "manifest.json").read_text())["engine"]["network"]
    assert network["inputs"][0]["shape"] == [-1, 3, 48, -1]
    assert network["profile"] == {"min": [1, 3, 48, 80], "opt": [2, 3, 48, 320], "max": [4, 3, 48, 960]}
    assert onnx.load(str(out / "model.onnx")).graph.input[0].type.tensor_type.shape.dim[3].dim_param == "width"
