import json

import numpy as np
import onnx
from onnx import numpy_helper

from jetpipe.cli import main
from jetpipe.convert.flops import layer_costs, totals
from jetpipe.convert.sparsity import apply_2_4, is_2_4, prune_2_4
from tests.helpers import residual_cnn, save, wide_cnn


def test_prune_2_4_keeps_the_two_largest_of_every_four():
    w = np.array([[0.1, -3.0, 2.0, 0.5, 7.0, -0.2, 0.3, -8.0, 1.0]], np.float32)  # tail of 1: padded
    pruned = prune_2_4(w, axis=1)
    np.testing.assert_array_equal(pruned, [[0, -3.0, 2.0, 0, 7.0, 0, 0, -8.0, 1.0]])
    conv = np.random.default_rng(0).standard_normal((8, 16, 3, 3)).astype(np.float32)
    pruned = prune_2_4(conv, axis=1)
    assert is_2_4(pruned, 1) and not is_2_4(conv, 1)
    assert np.count_nonzero(pruned) == conv.size // 2
    kept = pruned != 0
    np.testing.assert_array_equal(pruned[kept], conv[kept])  # kept weights unchanged


def test_apply_2_4_skips_what_cannot_take_the_pattern():
    model, report = apply_2_4(wide_cnn())
    assert report == {"conv1": "skipped: 3 input channels (< 8)", "conv2": "2:4",
                      "depthwise": "skipped: grouped/depthwise conv (group 16)", "fc": "2:4"}
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert is_2_4(weights["w2"], 1) and is_2_4(weights["wg"], 1)
    onnx.checker.check_model(model)


def test_flops_match_hand_counts():
    rows = {r["node"]: r for r in layer_costs(residual_cnn(size=16, batch=1))}
    assert rows["conv1"]["flops"] == 2 * (4 * 3 * 3 * 3) * 16 * 16
    assert rows["conv1"]["params"] == 4 * 3 * 3 * 3 + 4
    assert rows["fc"]["flops"] == 2 * 5 * 4
    assert totals(list(rows.values()))["params"] == sum(r["params"] for r in rows.values())


def test_convert_with_sparsity_records_it_and_calibrates_the_pruned_weights(tmp_path, capsys):
    from jetpipe.synth import write_text_images

    model = save(wide_cnn(), tmp_path / "wide.onnx")
    images = write_text_images(tmp_path / "imgs", 4, size_hw=(32, 32))
    out = tmp_path / "b"
    assert main(["convert", model, "-o", str(out), "--sparsity", "2:4", "--precision", "int8", "--calib", str(images),
                 "--no-auto-exclude", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "sparsity  2:4 on 2 of 4 weight layers" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sparsity"]["layers"]["conv2"] == "2:4"
    cost = manifest["cost"]
    assert cost["processed"]["nonzero_weights"] < cost["source"]["nonzero_weights"]
    assert cost["processed"]["flops"] == cost["source"]["flops"]  # dense FLOPs: TensorRT's kernels do the rest
    assert manifest["calibration"]["model_sha256"].endswith("+sparsity=2:4")
    q = onnx.load(str(out / "model.onnx"))
    int8_w2 = next(numpy_helper.to_array(t) for t in q.graph.initializer if t.name == "w2__int8")
    assert is_2_4(int8_w2, 1)
