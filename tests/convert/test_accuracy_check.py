"""convert's "vs fp32" check: on samples calibration did not see, and loud when the error is large."""

import json
import re

import cv2
import numpy as np
import pytest

from jetpipe.cli import main
from jetpipe.synth import render_text_image
from jetpipe.tasks.detection_yolo import YoloDetectionTask
from tests.helpers import int8_hostile_net, residual_cnn, save, yolo_head_net


def _manifest(out):
    return json.loads((out / "manifest.json").read_text())


def test_a_large_int8_error_is_warned_about_naming_calibrate_accuracy(tmp_path, capsys, caplog):
    out = tmp_path / "b"
    assert main(["convert", save(int8_hostile_net(), tmp_path / "m.onnx"), "-o", str(out), "--precision", "int8",
                 "--calib", "synthetic", "--calib-size", "8", "--no-auto-exclude", "--force-synthetic",
                 "--engine", "never"]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    # a 16x16 input is checked on 64 samples (small inputs get more, up to 64; a 640x640 one 8)
    assert any("INT8 changes the model's results against FP32 on 64 held-out samples (raw: rel_mae_max" in w and
               f"jetpipe calibrate accuracy {out} --data synthetic --budget" in w for w in warnings), warnings
    assert re.search(r"<- WARNING: rel_mae_max 1(\.\d+)? > 0.1; relative MAE 1\.\d+ > 0.1", capsys.readouterr().out)
    check = _manifest(out)["accuracy_check"]
    assert check["held_out"] and check["samples"] == 64 and check["relative_mae"] > 0.1 and check["warning"]


def test_a_small_error_is_reported_without_a_warning(tmp_path, caplog):
    out = tmp_path / "b"
    assert main(["convert", save(residual_cnn(), tmp_path / "m.onnx"), "-o", str(out), "--precision", "int8",
                 "--calib", "synthetic", "--calib-size", "8", "--force-synthetic", "--engine", "never"]) == 0
    check = _manifest(out)["accuracy_check"]
    assert check["relative_mae"] < 0.1 and "warning" not in check
    assert not any("changes the model's results" in r.getMessage() for r in caplog.records)


def _images(folder, count):
    folder.mkdir()
    for i in range(count):
        cv2.imwrite(str(folder / f"{i:03d}.png"), render_text_image(i, (48, 64)).bgr)
    return folder


def test_the_check_uses_images_beyond_the_calibration_set_where_there_are_any(tmp_path, capsys):
    model = save(residual_cnn(), tmp_path / "m.onnx")
    images = _images(tmp_path / "images", 10)
    for size, held_out, count in ((6, True, 4), (10, False, 10)):
        out = tmp_path / f"b{size}"
        assert main(["convert", model, "-o", str(out), "--precision", "fp16", "--calib", str(images),
                     "--calib-size", str(size), "--engine", "never"]) == 0
        check = _manifest(out)["accuracy_check"]
        assert (check["held_out"], check["samples"]) == (held_out, count)
        said = capsys.readouterr().out
        assert f"on {count} {'held-out' if held_out else 'calibration'} samples" in said
        # an in-sample check flatters (PP-OCRv3 rec INT8: CER 1.3 % on its 64 calibration lines, 2.2 % held out):
        # say how to get a held-out one
        assert ("images beyond --calib-size are held out" in said) is not held_out


def test_an_already_quantized_model_is_not_quantized_again(tmp_path, capsys):
    from tests.helpers import qdq_net

    model = save(qdq_net(), tmp_path / "q.onnx")
    for precision in ("fp16", "int8"):
        assert main(["convert", model, "-o", str(tmp_path / precision), "--precision", precision, "--calib",
                     "synthetic", "--calib-size", "2", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert ("the model is quantized already (node 'quantize_input' is QuantizeLinear): --precision "
                f"{precision} needs the float model") in err and "Traceback" not in err
        assert not (tmp_path / precision).exists()
    assert main(["convert", model, "-o", str(tmp_path / "fp32"), "--engine", "never", "--quiet"]) == 0


@pytest.mark.parametrize("box_gain, collapsed", [(100.0, True), (1.0, False)])
def test_a_detector_whose_scores_collapsed_is_warned_by_its_boxes_not_its_tensors(tmp_path, caplog, box_gain,
                                                                                   collapsed):
    """A YOLO head's output is dominated by its box coordinates: with box logits 100x the class logits, one INT8
    range for both leaves the class logits a step or two, most boxes are lost, and the relative MAE hardly
    moves (below 1e-3: the old check's only figure, silent). The check reports box F1 and warns; the same
    head with balanced logits converts without a warning."""
    model = save(yolo_head_net(metadata={"task": "detect", "names": "{0: 'a', 1: 'b'}"}, seed=3, box_gain=box_gain),
                 tmp_path / "y.onnx")
    out = tmp_path / "b"
    assert main(["convert", model, "-o", str(out), "--precision", "int8", "--calib", "synthetic", "--calib-size",
                 "8", "--max-batch", "1", "--no-auto-exclude", "--force-synthetic", "--engine", "never",
                 "--quiet"]) == 0
    check = _manifest(out)["accuracy_check"]
    assert check["task"] == "detection-yolo" and set(check["task_metrics"]) == set(YoloDetectionTask.metrics)
    assert check["relative_mae"] < 1e-2
    warned = [r.getMessage() for r in caplog.records if "changes the model's results" in r.getMessage()]
    if collapsed:
        assert check["task_metrics"]["box_f1"] < 0.5 and check["warning"].startswith("box_f1 ")
        assert warned and "(detection-yolo: box_f1 " in warned[0]
    else:
        assert check["task_metrics"]["box_f1"] >= 0.9 and "warning" not in check and not warned


def test_the_check_sample_count_grows_as_the_input_shrinks():
    from jetpipe.convert.chain import check_sample_count

    assert check_sample_count((640, 640)) == 8 and check_sample_count((736, 1312)) == 8
    assert check_sample_count((48, 320)) == 64 and check_sample_count((224, 224)) == 64
    assert check_sample_count((320, 320)) == 32


def test_int8_keeps_more_nodes_in_float_until_the_task_check_holds(tmp_path, caplog):
    """Three Convs of thirteen are ruined by INT8; the outlier rule keeps at most two in float: the fallback
    keeps the next most sensitive one too, because the task's check still missed, and the warning is gone."""
    from tests.helpers import hostile_chain_net

    out, data = tmp_path / "b", tmp_path / "inputs.npy"
    np.save(data, np.random.default_rng(0).uniform(-1, 1, (72, 3, 16, 16)).astype(np.float32))
    assert main(["convert", save(hostile_chain_net(), tmp_path / "m.onnx"), "-o", str(out), "--precision", "int8",
                 "--calib", str(data), "--calib-size", "8", "--task", "raw", "--engine", "never"]) == 0
    manifest = _manifest(out)
    excluded = manifest["excluded_nodes"]
    # onnxslim >= 0.1.4x names nodes by their outputs (c3), older ones keep the export's names (conv3)
    assert {name.replace("conv", "c") for name in excluded} == {"c3", "c7", "c10"}, excluded
    assert sum("kept for the task's check" in why for why in excluded.values()) >= 1, excluded
    assert "warning" not in manifest["accuracy_check"], manifest["accuracy_check"]
    assert any("keeping 1 more node(s) in float" in r.getMessage() for r in caplog.records)
