"""The CLI on tiny models: bundles, error texts, exit codes, no partial output."""

import json

import numpy as np
import pytest

from jetpipe import bundle
from jetpipe.cli import main
from jetpipe.synth import write_text_images
from tests.helpers import residual_cnn, save


@pytest.fixture
def tiny(tmp_path):
    return save(residual_cnn(batch=1), tmp_path / "tiny.onnx")


@pytest.fixture
def images(tmp_path):
    return str(write_text_images(tmp_path / "calib", 6, size_hw=(48, 64)))


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_int8_bundle_round_trip(tiny, images, no_tmp_leftovers, capsys):
    out = no_tmp_leftovers / "bundle"
    assert main(["convert", tiny, "-o", str(out), "--precision", "int8", "--calib", images,
                 "--max-batch", "4", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "precision int8" in printed and "made dynamic" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == "int8"
    batch = manifest["batch"]
    assert {k: batch[k] for k in ("min", "max", "made_dynamic")} == {"min": 1, "max": 4, "made_dynamic": True}
    assert set(batch) == {"min", "max", "made_dynamic", "max_relative_difference", "rewritten_reshapes",
                          "expanded_concats"}
    assert 0 <= batch["max_relative_difference"] < 1e-5  # batch-3 == three batch-1 runs, to float rounding
    assert manifest["io"]["inputs"][0]["shape"] == ["batch", 3, 16, 16]
    assert manifest["calibration"]["samples"] == 6
    assert manifest["engine"]["built"] is False and "TensorRT" in manifest["engine"]["reason"]
    assert set(manifest["files"]) == {"model.onnx", "calibration.json"}
    assert manifest["source"]["sha256"] == bundle.sha256_file(tiny)
    assert manifest["versions"]["onnxruntime"]
    # no engine was built: no TensorRT is named, however many are installed (the test extras install TensorRT-RTX)
    assert manifest["versions"]["tensorrt"] is None and manifest["versions"]["tensorrt_rtx"] is None
    assert bundle.verify(out) == []
    assert main(["inspect", str(out)]) == 0
    assert "hashes: 2 files verified" in capsys.readouterr().out


def test_inspect_detects_tampering(tiny, tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["convert", tiny, "-o", str(out), "--quiet"]) == 0
    with open(out / "model.onnx", "ab") as f:
        f.write(b"\0")
    assert main(["inspect", str(out)]) == 1
    assert "model.onnx: sha256 differs" in _error(capsys)


def test_existing_output_needs_force(tiny, tmp_path, capsys):
    out = tmp_path / "b"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    for force in ([], ["--force"]):  # a user's folder is not a bundle: --force does not replace it either
        assert main(["convert", tiny, "-o", str(out), "--quiet", *force]) == 2
        assert "exists and is not a bundle" in _error(capsys)
    assert (out / "keep.txt").read_text() == "precious"


@pytest.mark.parametrize("args, message", [
    (["missing.onnx"], "model file missing.onnx not found"),
    (["{tiny}", "--precision", "int8"], "--precision int8 needs calibration data"),
    (["{tiny}", "--precision", "int8", "--calib", "{tmp}/nowhere"], "calibration data .* not found"),
    (["{tiny}", "--input-size", "32x32"], "contradicts the model's fixed input 16x16"),
    (["{tiny}", "--input-size", "big"], "must look like HxW"),
    (["{tiny}", "--mean", "1,2"], "--mean '1,2' must be three"),
    (["{tiny}", "--max-batch", "0"], "--max-batch 0 must be from 1 to 256"),
    (["{tiny}", "--max-batch", "100000"], "--max-batch 100000 must be from 1 to 256"),
    (["{tiny}", "--precision", "int8", "--calib", "{tmp}/x.txt"], "unsupported file type '.txt'"),
    (["{tiny}", "--exclude", "conv9"], "no node of that name.*did you mean .*conv1"),
])
def test_user_errors_are_one_line(tiny, tmp_path, capsys, args, message):
    (tmp_path / "x.txt").write_text("x")
    args = [a.format(tiny=tiny, tmp=tmp_path) for a in args]
    out = tmp_path / "out"
    assert main(["convert", *args, "-o", str(out), "--quiet"]) == 2
    err = _error(capsys)
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    import re

    assert re.search(message, err), err
    assert not out.exists()


def test_non_onnx_file(tmp_path, capsys):
    (tmp_path / "m.onnx").write_bytes(b"\x08\x07garbage" * 10)
    assert main(["convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o")]) == 2
    err = _error(capsys)
    assert "not a readable ONNX model" in err or "no graph nodes" in err, err


def test_unreadable_images_are_skipped_and_counted(tiny, images, tmp_path, capsys):
    from pathlib import Path

    (Path(images) / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "b"
    assert main(["convert", tiny, "-o", str(out), "--precision", "int8", "--calib", images, "--quiet"]) == 0
    assert json.loads((out / "manifest.json").read_text())["calibration"]["skipped"] == 1
    assert "1 unreadable skipped" in capsys.readouterr().out


def test_all_images_unreadable_is_an_error(tiny, tmp_path, capsys):
    folder = tmp_path / "bad"
    folder.mkdir()
    for i in range(3):
        (folder / f"{i}.jpg").write_bytes(b"nope")
    assert main(["convert", tiny, "-o", str(tmp_path / "b"), "--precision", "int8",
                 "--calib", str(folder), "--quiet"]) == 2
    assert "none of the 3 images" in _error(capsys)
    assert not (tmp_path / "b").exists()


def test_npy_calibration_is_used_as_is_and_checked(tiny, tmp_path, capsys):
    good = tmp_path / "x.npy"
    np.save(good, np.random.default_rng(0).standard_normal((5, 3, 16, 16)).astype(np.float32))
    out = tmp_path / "b"
    args = ["convert", tiny, "-o", str(out), "--precision", "fp16", "--calib", str(good), "--quiet"]
    assert main(args) == 0
    assert json.loads((out / "manifest.json").read_text())["calibration"]["samples"] == 5
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((2, 3, 8, 8), np.float32))
    assert main(["convert", tiny, "-o", str(tmp_path / "c"), "--precision", "int8",
                 "--calib", str(bad), "--quiet"]) == 2
    assert "needs float32 [N, 3, 16, 16]" in _error(capsys)


def test_calibration_reused_when_all_match_and_refused_otherwise(tiny, images, tmp_path, caplog):
    out = tmp_path / "b"
    base = ["convert", tiny, "-o", str(out), "--precision", "int8", "--calib", images, "--quiet"]
    assert main(base) == 0
    first = json.loads((out / "calibration.json").read_text())
    caplog.clear()
    assert main([*base, "--force"]) == 0
    assert "reusing calibration" in caplog.text
    assert json.loads((out / "calibration.json").read_text()) == first
    caplog.clear()
    assert main([*base, "--force", "--calib-method", "minmax"]) == 0
    assert "recalibrating: its calibration method differs" in caplog.text
    # an explicit cache that does not match is refused, saying why and how to recalibrate
    other = tmp_path / "other"
    assert main(["convert", tiny, "-o", str(other), "--precision", "int8", "--calib", images,
                 "--calib-cache", str(out), "--calib-method", "entropy", "--quiet"]) == 2
    assert not other.exists()


def test_calibration_made_with_other_excluded_nodes_is_not_reused(tiny, images, tmp_path, caplog, capsys):
    """Ranges made with --exclude conv1 lack conv1's input, which a run without the exclusion quantizes."""
    out = tmp_path / "b"
    base = ["convert", tiny, "-o", str(out), "--precision", "int8", "--calib", images, "--no-auto-exclude",
            "--quiet"]
    assert main([*base, "--exclude", "conv1"]) == 0
    caplog.clear()
    assert main([*base, "--force"]) == 0  # the bundle being replaced: recalibrated, not a failure
    assert "recalibrating: its ranges were made for other excluded nodes" in caplog.text
    assert main([*base[:3], str(tmp_path / "c"), *base[4:], "--exclude", "conv1"]) == 0
    assert main([*base[:3], str(tmp_path / "d"), *base[4:], "--calib-cache", str(tmp_path / "c")]) == 2
    assert f"--calib-cache {tmp_path / 'c'} has no range for" in _error(capsys)
    assert not (tmp_path / "d").exists()


def test_interrupt_leaves_nothing(tiny, images, no_tmp_leftovers, monkeypatch, capsys):
    from jetpipe.convert import stats

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(stats, "collect", interrupted)
    out = no_tmp_leftovers / "b"
    assert main(["convert", tiny, "-o", str(out), "--precision", "int8", "--calib", images, "--quiet"]) == 130
    assert "interrupted (Ctrl-C): nothing was written" in capsys.readouterr().err
    assert not out.exists()


def test_interrupt_during_write_keeps_old_bundle(tiny, no_tmp_leftovers, monkeypatch):
    out = no_tmp_leftovers / "b"
    assert main(["convert", tiny, "-o", str(out), "--quiet"]) == 0
    before = (out / "manifest.json").read_text()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bundle, "finish_manifest", interrupted)
    assert main(["convert", tiny, "-o", str(out), "--force", "--quiet"]) == 130
    assert (out / "manifest.json").read_text() == before


def test_fixed_batch_graph_is_refused(tmp_path, capsys):
    from tests.helpers import batch_collapsing_net

    path = save(batch_collapsing_net(), tmp_path / "fixed.onnx")
    assert main(["convert", path, "-o", str(tmp_path / "b"), "--quiet"]) == 2
    assert "fixes that size (ReduceSum 'sum_over_batch' turns [3, 3, 8, 8] into [1, 3, 8, 8]" in _error(capsys)
    assert main(["convert", path, "-o", str(tmp_path / "b"), "--max-batch", "1", "--quiet"]) == 0


def test_op_tensorrt_cannot_build_is_named(tmp_path, capsys):
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("SequenceConstruct", ["r"], ["seq"], name="make_seq"),
             helper.make_node("SequenceAt", ["seq", "zero"], ["y"], name="pick")]
    zero = onnx.numpy_helper.from_array(np.array(0, np.int64), "zero")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 8, 8])
    graph = helper.make_graph(nodes, "seq", [x], [y], [zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = save(model, tmp_path / "seq.onnx")
    assert main(["convert", path, "-o", str(tmp_path / "b"), "--quiet"]) == 2
    expected = "node 'make_seq' uses SequenceConstruct, which TensorRT cannot build (and 1 more)"
    assert expected in _error(capsys)
    assert main(["convert", path, "-o", str(tmp_path / "b"), "--engine", "never", "--quiet"]) == 0


def test_weights_kept_beside_the_model_load_and_a_missing_data_file_is_named(tmp_path, capsys):
    """Large exports keep their weights in a data file beside the .onnx: it loads; without the file convert
    names it (it said the model was truncated or not ONNX)."""
    import onnx

    from tests.helpers import residual_cnn

    model = residual_cnn(batch=1)
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0)
    assert main(["convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "ok"), "--quiet"]) == 0
    (tmp_path / "m.data").unlink()
    assert main(["convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o"), "--quiet"]) == 2
    err = _error(capsys)
    assert "keeps its weights in m.data, which is not beside it" in err and "truncated" not in err, err
    assert not (tmp_path / "o").exists()


def test_a_custom_operator_is_named_not_blamed_on_the_input_size(tmp_path, capsys):
    """ONNX Runtime cannot run an op from a custom domain: the one line names it (it said 'pick an
    --input-size the network accepts')."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("MyFancyOp", ["r"], ["y"], name="fancy", domain="custom.ops")]
    graph = helper.make_graph(nodes, "custom", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             ["N", 3, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 32, 32])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom.ops", 1)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "custom.onnx"))
    assert main(["convert", str(tmp_path / "custom.onnx"), "-o", str(tmp_path / "b"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "uses the operator custom.ops:MyFancyOp, which ONNX Runtime does not implement" in err
    assert "--input-size" not in err and not (tmp_path / "b").exists()


def test_an_input_size_whose_activations_do_not_fit_is_refused_before_it_runs(tmp_path, capsys, monkeypatch):
    """Issue 49: --input-size 16384x16384 was OOM-killed at 24 GB after 81 s. The activations are estimated
    from static shapes first (here the machine is told it has 1 GB; a 4096x4096 sample of the built-in
    detector needs several)."""
    from jetpipe.convert import chain

    monkeypatch.setattr(chain, "_available_memory", lambda: 10**9)
    monkeypatch.setattr(chain, "_check_runs", lambda *a: pytest.fail("the sample was run"))
    assert main(["convert", "ppocr-det", "-o", str(tmp_path / "big"), "--input-size", "4096x4096", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "at 4096x4096: one sample's activations need about" in err[0], err
    assert "1 GB available: choose a smaller --input-size" in err[0] and not (tmp_path / "big").exists()
