"""Engines built for real by NVIDIA's ONNX parser and builder: TensorRT-RTX, ahead of time, no GPU needed.

Every kind of bundle `jetpipe convert` makes goes through `--engine require --engine-family
tensorrt-rtx`; the tests read back what the builder was given (the parsed network: I/O names,
dtypes and shapes, the optimization profile, layers by output precision) against the manifest.
The engines themselves cannot run here (no GPU) nor on the H100/H200 (TensorRT-RTX does not
support compute capability 9.0): deserialization and the engine inspector are not exercised.
"""

import json

import onnx
import pytest

from jetpipe.cli import main
from jetpipe.models import BUILTIN
from jetpipe.runtime.trt_builder import import_family

needs_rtx = pytest.mark.skipif(import_family("tensorrt-rtx") is None,
                                reason="TensorRT-RTX is not installed (pip install tensorrt-rtx-cu13-bindings "
                                       "tensorrt-rtx-cu13-libs; the test extra installs it on x86_64)")

KINDS = {
    "fp32": [],
    "fp16": ["--precision", "fp16"],
    "int8": ["--precision", "int8", "--calib", "synthetic", "--calib-size", "8"],
    "pruned": ["--prune", "0.3"],
    "sparse-2:4": ["--sparsity", "2:4"],
}
PROFILE = {"min": [1, 3, 320, 320], "opt": [4, 3, 320, 320], "max": [8, 3, 320, 320]}


def _convert(model, out, *extra) -> dict:
    assert main(["convert", str(model), "-o", str(out), "--input-size", "320x320", "--max-batch", "8",
                 "--engine", "require", "--engine-family", "tensorrt-rtx", "--rtx-targets", "sm86,sm89",
                 "--quiet", *extra]) == 0
    return json.loads((out / "manifest.json").read_text())


def _checked_network(out, manifest: dict) -> dict:
    """The built engine's facts agree with the manifest; returns the parsed network's description."""
    engine = manifest["engine"]
    assert engine["built"] and engine["family"] == "tensorrt-rtx" and engine["targets"] == ["sm86", "sm89"]
    assert engine["version"].startswith("1.") and manifest["versions"]["tensorrt_rtx"] == engine["version"]
    assert (out / engine["file"]).stat().st_size > 1_000_000
    network, io = engine["network"], manifest["io"]
    for side in ("inputs", "outputs"):
        assert [(t["name"], t["dtype"]) for t in network[side]] == [(t["name"], t["dtype"]) for t in io[side]]
    assert network["inputs"][0]["shape"] == [-1, 3, 320, 320]
    assert network["outputs"][0]["shape"] == [-1, 1, 320, 320]
    assert network["profile"] == PROFILE
    return network


@needs_rtx
@pytest.mark.parametrize("kind", KINDS)
def test_every_bundle_kind_builds_a_tensorrt_rtx_engine(tmp_path, kind):
    out = tmp_path / kind
    manifest = _convert(BUILTIN["ppocr-det"].path(), out, *KINDS[kind])
    network = _checked_network(out, manifest)
    dtypes, types = network["layer_output_dtypes"], network["layer_types"]
    if kind == "fp16":  # the strongly typed network computes in float16, not silently float32
        assert dtypes["float16"] >= 0.95 * network["layers"]
    elif kind == "int8":  # Q/DQ pairs reached the builder
        assert types["DEQUANTIZE"] >= 100 and dtypes["int8"] >= 100
    else:
        assert set(dtypes) == {"float32"}
    if kind == "sparse-2:4":
        assert manifest["engine"]["sparse_weights"] and manifest["sparsity"]["pattern"] == "2:4"
    if kind == "pruned":  # the builder got the thinner network
        cost = manifest["cost"]
        assert manifest["pruning"]["pruned"] and cost["processed"]["flops"] < 0.8 * cost["source"]["flops"]


@needs_rtx
def test_a_static_batch_export_is_built_with_the_dynamic_profile(tmp_path):
    model = onnx.load(str(BUILTIN["ppocr-det"].path()))
    batch = model.graph.input[0].type.tensor_type.shape.dim[0]
    batch.Clear()
    batch.dim_value = 1  # exported for batch 1, as many exporters do
    static = tmp_path / "det-batch1.onnx"
    onnx.save(model, str(static))
    manifest = _convert(static, tmp_path / "bundle")
    _checked_network(tmp_path / "bundle", manifest)


def test_unknown_targets_and_a_missing_family_are_one_line_errors(tmp_path, capsys):
    det = str(BUILTIN["ppocr-det"].path())
    assert main(["convert", det, "-o", str(tmp_path / "a"), "--engine-family", "tensorrt-rtx",
                 "--rtx-targets", "sm90", "--quiet"]) == 2
    assert "--rtx-targets 'sm90': name one or more of sm75, sm80" in capsys.readouterr().err
    if import_family("tensorrt") is None:
        assert main(["convert", det, "-o", str(tmp_path / "b"), "--engine", "require", "--engine-family",
                     "tensorrt", "--quiet"]) == 2
        assert "--engine require but tensorrt is not installed" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@needs_rtx
def test_doctor_trt_builds_with_tensorrt_rtx_where_tensorrt_is_missing(capsys):
    if import_family("tensorrt") is not None:
        pytest.skip("TensorRT proper is installed: doctor --trt runs its own self-test")
    assert main(["doctor", "--trt"]) == 0
    out = capsys.readouterr().out
    assert "tensorrt-rtx 1." in out and "built a" in out and "ahead of time for sm86" in out
