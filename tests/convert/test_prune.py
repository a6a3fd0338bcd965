import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from jetpipe.cli import main
from jetpipe.convert import flops, prune_alloc, prune_refit
from jetpipe.convert.graph import simplify
from jetpipe.convert.prune import analyse, apply, prune
from jetpipe.convert.prune_spaces import unshare
from jetpipe.errors import ModelError
from jetpipe.runtime.sessions import cpu_session
from tests.helpers import _init, _model, c2f_sppf_net, save, upsample_net, wide_cnn


def residual_block(zero_channels=(), seed=0) -> onnx.ModelProto:
    """conv1 -> relu -> conv2 -> Add(skip) -> depthwise -> SE (GAP, conv, relu, conv, sigmoid, Mul)
    -> conv_out -> graph output. conv1/conv2/SE-expand share one channel group through Add and Mul."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((16, 3, 3, 3)) * 0.3
    b1 = rng.standard_normal(16) * 0.1
    w2 = rng.standard_normal((16, 16, 3, 3)) * 0.2
    b2 = rng.standard_normal(16) * 0.1
    for c in zero_channels:  # dead channels of the whole group: zero everywhere they are produced
        w1[c], b1[c], w2[c], b2[c] = 0, 0, 0, 0
    inits = [_init("w1", w1), _init("b1", b1), _init("w2", w2), _init("b2", b2),
             _init("wd", rng.standard_normal((16, 1, 3, 3)) * 0.3), _init("bd", np.zeros(16)),
             _init("ws1", rng.standard_normal((4, 16, 1, 1)) * 0.3),
             _init("ws2", rng.standard_normal((16, 4, 1, 1)) * 0.3),
             _init("wo", rng.standard_normal((8, 16, 1, 1)) * 0.3)]
    if zero_channels:
        wd = numpy_helper.to_array(inits[4]).copy()
        wd[list(zero_channels)] = 0
        inits[4] = _init("wd", wd)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "r1"], ["s"], name="residual"),
        helper.make_node("Conv", ["s", "wd", "bd"], ["d"], pads=[1, 1, 1, 1], group=16, name="depthwise"),
        helper.make_node("GlobalAveragePool", ["d"], ["g"], name="gap"),
        helper.make_node("Conv", ["g", "ws1"], ["e1"], name="se_reduce"),
        helper.make_node("Relu", ["e1"], ["e2"], name="se_relu"),
        helper.make_node("Conv", ["e2", "ws2"], ["e3"], name="se_expand"),
        helper.make_node("Sigmoid", ["e3"], ["e4"], name="se_gate"),
        helper.make_node("Mul", ["d", "e4"], ["m"], name="se_scale"),
        helper.make_node("Conv", ["m", "wo"], ["y"], name="conv_out"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 16, 16])
    return _model(helper.make_graph(nodes, "block", [x], [y], inits), 17)


def _run(model, x):
    return cpu_session(model).run(None, {"x": x})[0]


def test_groups_follow_residual_add_se_mul_and_depthwise():
    spaces = analyse(residual_block())
    group = next(s for s in spaces.values() if ("conv1", 0) in s.producers)
    assert set(group.producers) == {("conv1", 0), ("conv2", 0), ("se_expand", 0)} and group.blocked is None
    assert group.depthwise == [("depthwise", 0)]
    assert {c for c, _ in group.consumers} == {"conv2", "se_reduce", "conv_out"}
    out = next(s for s in spaces.values() if s.label == "conv_out")
    assert out.blocked == "graph output y"


def test_pruning_dead_channels_is_exact():
    model = residual_block(zero_channels=(1, 5, 9, 12))
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    pruned, report = prune(model, 0.2, align=4)  # 16 -> 12 channels removes 39 % of the FLOPs
    onnx.checker.check_model(pruned)
    weights = {t.name: numpy_helper.to_array(t) for t in pruned.graph.initializer}
    assert weights["w1"].shape == (12, 3, 3, 3) and weights["w2"].shape == (12, 12, 3, 3)
    assert weights["wd"].shape == (12, 1, 3, 3) and weights["ws1"].shape == (4, 12, 1, 1)
    assert weights["ws2"].shape == (12, 4, 1, 1) and weights["wo"].shape == (8, 12, 1, 1)
    depthwise = next(n for n in pruned.graph.node if n.name == "depthwise")
    assert next(a.i for a in depthwise.attribute if a.name == "group") == 12
    # SE's reduce conv sees the mean of zero channels: exact as long as those are zero, which they are
    np.testing.assert_allclose(_run(pruned, x), _run(model, x), rtol=1e-5, atol=1e-5)
    assert report["pruned"]


def test_l1_pruning_of_live_channels_changes_outputs_but_runs():
    model = residual_block()
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
    pruned, _ = prune(model, 0.5)
    out = _run(pruned, x)
    assert out.shape == (1, 8, 16, 16) and np.isfinite(out).all()
    dense = _run(model, x)
    assert np.abs(out - dense).max() > 1e-3 * np.abs(dense).max()  # live channels went: the output moved


def test_nothing_prunable_and_bad_ratio():
    with pytest.raises(ModelError, match="between 0 and 1"):
        prune(wide_cnn(), 1.0)
    # conv1's 4 channels are below the minimum, conv2 is the graph output: nothing to prune
    with pytest.raises(ModelError, match="nothing in this model can be pruned safely .*graph output y"):
        prune(simplify(upsample_net()), 0.3)


def test_convert_prune_reports_params_and_flops(tmp_path, capsys):
    model = save(residual_block(), tmp_path / "block.onnx")
    out = tmp_path / "b"
    assert main(["convert", model, "-o", str(out), "--prune", "0.25", "--quiet"]) == 0
    assert "pruning   l1 0.25 (uniform): 1 channel group(s) pruned" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["cost"]["processed"]["flops"] < 0.8 * manifest["cost"]["source"]["flops"]
    assert manifest["pruning"]["skipped"] == {"se_reduce": "4 channels (< 8)", "conv_out": "graph output y"}
    assert list(manifest["pruning"]["pruned"].values()) == [{"channels": 16, "kept": 8}]  # 8-aligned
    assert main(["convert", model, "-o", str(tmp_path / "c"), "--prune", "1.5", "--quiet"]) == 2
    assert "(share of FLOPs to remove) must be between 0 and 1" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_reconstruction_lowers_the_error_against_plain_removal():
    model = residual_block(seed=4)
    rng = np.random.default_rng(5)
    calib = rng.standard_normal((8, 3, 16, 16)).astype(np.float32)
    held_out = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
    reference = _run(model, held_out)
    errors = {}
    for method in ("l1", "reconstruct"):
        pruned, report = prune(model, 0.2, method, samples=calib, input_name="x", align=4)
        onnx.checker.check_model(pruned)
        errors[method] = float(np.linalg.norm(_run(pruned, held_out) - reference) / np.linalg.norm(reference))
    assert set(report["refit"]) == {"conv2", "se_reduce", "conv_out"}
    assert errors["reconstruct"] < 0.8 * errors["l1"], errors  # measured: 0.38 vs 0.68


def test_reconstruct_without_data_is_refused():
    with pytest.raises(ModelError, match="needs calibration data: pass --calib"):
        prune(residual_block(), 0.25, "reconstruct")


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_pruning_composes_with_precision(tmp_path, precision):
    from jetpipe.synth import write_text_images

    model = save(residual_block(), tmp_path / "block.onnx")
    images = write_text_images(tmp_path / "imgs", 4, size_hw=(32, 32))
    out = tmp_path / precision
    assert main(["convert", model, "-o", str(out), "--prune", "0.25", "--prune-method", "reconstruct",
                 "--precision", precision, "--calib", str(images), "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == precision and manifest["pruning"]["method"] == "reconstruct"
    assert manifest["calibration"]["model_sha256"].endswith("+prune=0.25:reconstruct:sensitivity:8")
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    assert np.isfinite(cpu_session(str(out / "model.onnx")).run(None, {"x": x})[0]).all()


def redundant_pair_net(seed=0) -> onnx.ModelProto:
    """conv1 (16 channels, linear) -> conv2 3x3 -> output; channel 3 is exactly 2x channel 5 and has the
    largest weights, so L1 keeps it while a least-squares choice can drop it for free."""
    rng = np.random.default_rng(seed)
    w1, b1 = rng.standard_normal((16, 3, 3, 3)) * 0.3, rng.standard_normal(16) * 0.1
    w1[3], b1[3] = 2 * w1[5], 2 * b1[5]
    w2 = rng.standard_normal((8, 16, 3, 3)) * 0.2
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Conv", ["c1", "w2"], ["y"], pads=[1, 1, 1, 1], name="conv2")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 16, 16])
    inits = [_init("w1", w1), _init("b1", b1), _init("w2", w2)]
    return _model(helper.make_graph(nodes, "pair", [x], [y], inits), 17)


def test_reconstruct_drops_a_redundant_channel_almost_for_free():
    model = redundant_pair_net()
    rng = np.random.default_rng(1)
    calib, held_out = (rng.standard_normal((n, 3, 16, 16)).astype(np.float32) for n in (8, 4))
    reference = _run(model, held_out)
    errors, kept = {}, {}
    for method in ("l1", "reconstruct"):
        pruned, report = prune(model, 0.05, method, samples=calib, input_name="x", align=1)
        kept[method] = numpy_helper.to_array(next(t for t in pruned.graph.initializer if t.name == "w1"))
        errors[method] = float(np.linalg.norm(_run(pruned, held_out) - reference) / np.linalg.norm(reference))
        assert report["pruned"]["conv1"]["kept"] == 15
    assert errors["reconstruct"] < 0.05 * errors["l1"], errors
    assert errors["reconstruct"] < 1e-2, errors


def test_kept_counts_are_aligned_and_allocation_follows_sensitivity():
    assert prune_alloc.candidates(42, 8, 8, 0.75) == [42, 40, 32, 24, 16]
    assert prune_alloc.candidates(12, 8, 8, 0.75) == [12, 8]
    assert prune_alloc.candidates(16, 1, 8, 0.25) == [16, 15, 14, 13, 12]
    flop_model = prune_alloc.FlopModel([(100.0, (("a", 1.0),), ()), (100.0, (("b", 1.0),), ())],
                                      {"a": 32, "b": 32})
    options = {"a": [32, 24, 16, 8], "b": [32, 24, 16, 8]}
    errors = {"a": {24: 0.5, 16: 1.0, 8: 2.0}, "b": {24: 0.01, 16: 0.02, 8: 0.5}}
    assert prune_alloc.greedy(flop_model, options, errors, 0.3) == {"a": 32, "b": 8}
    assert prune_alloc.uniform(flop_model, options, 0.3) == {"a": 16, "b": 16}
    with pytest.raises(ModelError, match="at most 75% of this model's FLOPs can be removed"):
        prune_alloc.greedy(flop_model, options, errors, 0.8)


def test_bad_alignment_and_sensitivity_without_data_are_refused():
    with pytest.raises(ModelError, match="--prune-align 0"):
        prune(residual_block(), 0.2, align=0)
    with pytest.raises(ModelError, match="sensitivity allocation needs calibration data"):
        prune(residual_block(), 0.2, allocation="sensitivity")


def test_reconstruct_reports_progress_for_each_long_step():
    bars = []

    class Recorder:  # the progress interface: (total, what, unit) -> update(n), close()
        def __init__(self, total, what, unit):
            self.total, self.what, self.done, self.closed = total, what, 0, False
            bars.append(self)

        def update(self, n=1):
            self.done += n

        def close(self):
            self.closed = True

    calib = np.random.default_rng(5).standard_normal((8, 3, 16, 16)).astype(np.float32)
    prune(residual_block(seed=4), 0.2, "reconstruct", samples=calib, input_name="x", align=4, progress=Recorder)
    assert [b.what for b in bars] == ["pruning: ranking channels", "pruning: sensitivity", "pruning: refit"]
    assert all(b.done == b.total > 0 and b.closed for b in bars), [(b.what, b.done, b.total) for b in bars]


C2F_DEAD = {"conv0": [3, 20], "c2f_cv1": [2, 9, 17, 30], "m2": [1, 14], "m1": [5], "c2f_cv2": [0, 31],
            "sppf_cv1": [4, 7], "sppf_cv2": [8]}


def _live(model, spaces, dead):
    """For every prunable group: the channels none of its producers zeroed (every producer's dead
    channels, at their offsets, are dead in the group)."""
    keeps = {}
    for key, space in spaces.items():
        if space.blocked:
            continue
        gone = set(range(space.channels))
        for conv, offset in space.producers:
            gone &= {c - offset for c in dead.get(conv, ()) if offset <= c < offset + space.channels}
        keeps[key] = np.array(sorted(set(range(space.channels)) - gone))
    return keeps


@pytest.mark.parametrize("split", ["input", "attribute", "equal"])
def test_groups_follow_split_and_concat_and_dead_channels_go_exactly(split):
    model = c2f_sppf_net(C2F_DEAD, split=split)
    spaces = analyse(unshare(model))
    labels = {s.label: s for s in spaces.values()}
    # C2f: cv1's halves are two groups; the second is one with the bottleneck's residual; both reach cv2
    assert set(labels) == {"conv0", "c2f_cv1[0:16]", "c2f_cv1[16:32],m2", "m1", "c2f_cv2", "sppf_cv1",
                           "sppf_cv2", "head"}
    assert labels["c2f_cv1[16:32],m2"].consumers == [("m1", 0), ("c2f_cv2", 16), ("c2f_cv2", 32)]
    assert labels["sppf_cv1"].consumers == [("sppf_cv2", o) for o in (0, 16, 32, 48)]  # four times
    assert [s.label for s in spaces.values() if s.blocked] == ["head"]
    keeps = _live(model, spaces, C2F_DEAD)
    pruned = apply(unshare(model), spaces, keeps)
    onnx.checker.check_model(pruned)
    weights = {t.name: numpy_helper.to_array(t) for t in pruned.graph.initializer}
    assert weights["w_c2f_cv1"].shape == (28, 30, 1, 1)  # 2 of each half go (m2's dead 1, 14 = cv1's 17, 30)
    assert weights["w_c2f_cv2"].shape == (30, 42, 1, 1)  # cv2 reads 14 + 14 + 14
    assert weights["w_sppf_cv2"].shape == (31, 56, 1, 1)  # 4 x (16 - 2)
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(pruned, x), _run(model, x), rtol=1e-4, atol=2e-4)  # outputs reach 20


def test_yolov8_blocks_prune_to_the_flops_target():
    model = c2f_sppf_net()
    pruned, report = prune(model, 0.3, align=4)
    onnx.checker.check_model(pruned)
    assert {"c2f_cv1[0:16]", "c2f_cv1[16:32],m2", "sppf_cv1"} <= set(report["pruned"])
    assert report["skipped"] == {"head": "graph output head_c"}
    before, after = (sum(r["flops"] for r in flops.layer_costs(m)) for m in (model, pruned))
    assert 0.3 <= 1 - after / before < 0.4
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    assert _run(pruned, x).shape == (1, 4, 16, 16)


def test_reconstruct_through_split_and_concat_beats_plain_removal():
    model = c2f_sppf_net(seed=3)
    rng = np.random.default_rng(4)
    calib, held_out = (rng.standard_normal((n, 3, 16, 16)).astype(np.float32) for n in (8, 4))
    reference = _run(model, held_out)
    errors = {}
    for method in ("l1", "reconstruct"):  # the same channel counts: only the choice and the refit differ
        pruned, report = prune(model, 0.3, method, samples=calib, input_name="x", align=4, allocation="uniform")
        errors[method] = float(np.linalg.norm(_run(pruned, held_out) - reference) / np.linalg.norm(reference))
    assert {"c2f_cv2", "sppf_cv2"} <= set(report["refit"])  # Convs reading concatenated groups are refit
    assert errors["reconstruct"] < 0.8 * errors["l1"], errors


def test_sensitivity_over_the_time_budget_falls_back_to_uniform(tmp_path, capsys):
    calib = np.random.default_rng(5).standard_normal((8, 3, 16, 16)).astype(np.float32)
    _, report = prune(c2f_sppf_net(seed=3), 0.2, "reconstruct", samples=calib, input_name="x", align=4,
                      budget_s=1e-6)  # three probes show that all of them take longer than that
    assert report["allocation"] == "uniform" and "sensitivity" not in next(iter(report["pruned"].values()))
    assert "over the 1.66667e-08 min budget: uniform allocation instead" in report["allocation_note"]
    _, report = prune(c2f_sppf_net(seed=3), 0.2, "reconstruct", samples=calib, input_name="x", align=4,
                      budget_s=600)
    assert report["allocation"] == "sensitivity" and "allocation_note" not in report
    model = save(residual_block(), tmp_path / "block.onnx")
    assert main(["convert", model, "-o", str(tmp_path / "b"), "--prune", "0.2", "--prune-budget", "0"]) == 2
    assert "--prune-budget 0: minutes above 0" in capsys.readouterr().err


def test_convs_too_wide_for_least_squares_keep_plainly_sliced_weights(monkeypatch):
    calib = np.random.default_rng(5).standard_normal((8, 3, 16, 16)).astype(np.float32)
    # conv2 reads 16 channels x 3x3 = 144 columns: over a limit of 100 (a 2048-channel 3x3 ASPP branch's
    # 18432 over the real 4608); ranked by energy, not refit
    monkeypatch.setattr(prune_refit, "MAX_OBS_COLUMNS", 100)
    pruned, report = prune(residual_block(seed=4), 0.2, "reconstruct", samples=calib, input_name="x", align=4,
                           allocation="uniform")
    assert report["refit_too_wide"] == ["conv2"] and "conv2" not in report["refit"]
    dense = {t.name: numpy_helper.to_array(t) for t in residual_block(seed=4).graph.initializer}
    kept = {t.name: numpy_helper.to_array(t) for t in pruned.graph.initializer}
    keep = [i for i in range(16) if any(np.array_equal(row, dense["w1"][i]) for row in kept["w1"])]
    assert len(keep) == len(kept["w1"]) < 16  # conv1 produces the group: its rows are sliced, never refit
    np.testing.assert_array_equal(kept["w2"], dense["w2"][keep][:, keep])


def test_pruning_says_how_far_the_flops_fell_and_that_l1_without_data_is_unmeasured(tmp_path, caplog):
    """The block's one prunable group moves in steps of 8 channels: asked for 10 %, it removes far more, and
    without --calib nothing measured the cost; with --calib the check compares by the task's metric."""
    import logging

    model = save(residual_block(), tmp_path / "block.onnx")
    with caplog.at_level(logging.WARNING):
        assert main(["convert", model, "-o", str(tmp_path / "b"), "--prune", "0.1", "--quiet"]) == 0
    removed = json.loads((tmp_path / "b" / "manifest.json").read_text())["pruning"]["flops_removed"]
    assert abs(removed - 0.1) > 0.03
    text = caplog.text
    said = f"{100 * removed:.0f}"  # the manifest keeps 4 decimals, the log 1
    assert f"--prune 0.1 removed {said}" in text and "% of the FLOPs, not 10 %: channel groups move in steps" in text
    assert f"pruning (l1) removed {said}" in text and "% of the FLOPs and nothing measured what it cost" in text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert main(["convert", model, "-o", str(tmp_path / "c"), "--prune", "0.1", "--calib", "synthetic",
                     "--calib-size", "4", "--quiet"]) == 0
    assert "nothing measured what it cost" not in caplog.text
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())["pruning"]["check"]["task_metrics"]


def test_the_default_method_is_reconstruct_with_data_and_l1_without(tmp_path, caplog):
    """With --calib, pruning keeps accuracy unasked (l1 was the default and lost real models silently)."""
    from jetpipe.synth import write_text_images

    model = save(residual_block(), tmp_path / "block.onnx")
    images = write_text_images(tmp_path / "imgs", 4, size_hw=(32, 32))
    for name, extra, method in (("data", ["--calib", str(images)], "reconstruct"), ("none", [], "l1"),
                                ("asked", ["--calib", str(images), "--prune-method", "l1"], "l1")):
        out = tmp_path / name
        assert main(["convert", model, "-o", str(out), "--prune", "0.25", "--quiet", *extra]) == 0
        assert json.loads((out / "manifest.json").read_text())["pruning"]["method"] == method, name
    assert sum("--prune-method reconstruct: the default with --calib" in r.getMessage() for r in caplog.records) == 1
