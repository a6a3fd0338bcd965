"""convert's "vs fp32" check: on samples calibration did not see, and loud when the error is large."""

import json

import cv2

from jetpipe.cli import main
from jetpipe.synth import render_text_image
from tests.helpers import int8_hostile_net, residual_cnn, save


def _manifest(out):
    return json.loads((out / "manifest.json").read_text())


def test_a_large_int8_error_is_warned_about_naming_calibrate_accuracy(tmp_path, capsys, caplog):
    out = tmp_path / "b"
    assert main(["convert", save(int8_hostile_net(), tmp_path / "m.onnx"), "-o", str(out), "--precision", "int8",
                 "--calib", "synthetic", "--calib-size", "8", "--no-auto-exclude", "--engine", "never"]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("INT8 changes the model's outputs by" in w and f"jetpipe calibrate accuracy {out} --data synthetic "
               "--budget" in w for w in warnings), warnings
    assert "<- WARNING: relative MAE above 0.1" in capsys.readouterr().out
    check = _manifest(out)["accuracy_check"]
    assert check["held_out"] and check["samples"] == 8 and check["relative_mae"] > 0.1 and check["warning"]


def test_a_small_error_is_reported_without_a_warning(tmp_path, caplog):
    out = tmp_path / "b"
    assert main(["convert", save(residual_cnn(), tmp_path / "m.onnx"), "-o", str(out), "--precision", "int8",
                 "--calib", "synthetic", "--calib-size", "8", "--engine", "never"]) == 0
    check = _manifest(out)["accuracy_check"]
    assert check["relative_mae"] < 0.1 and "warning" not in check
    assert not any("changes the model's outputs" in r.getMessage() for r in caplog.records)


def _images(folder, count):
    folder.mkdir()
    for i in range(count):
        cv2.imwrite(str(folder / f"{i:03d}.png"), render_text_image(i, (48, 64)).bgr)
    return folder


def test_the_check_uses_images_beyond_the_calibration_set_where_there_are_any(tmp_path, capsys):
    model = save(residual_cnn(), tmp_path / "m.onnx")
    images = _images(tmp_path / "images", 10)
    for size, held_out, count in ((6, True, 4), (10, False, 8)):
        out = tmp_path / f"b{size}"
        assert main(["convert", model, "-o", str(out), "--precision", "fp16", "--calib", str(images),
                     "--calib-size", str(size), "--engine", "never"]) == 0
        check = _manifest(out)["accuracy_check"]
        assert (check["held_out"], check["samples"]) == (held_out, count)
        assert f"on {count} {'held-out' if held_out else 'calibration'} samples" in capsys.readouterr().out


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
