"""The registry: tasks recognized from outputs and metadata, refused where they do not fit, and recorded by
convert in the bundle so that serve and calibrate read the outputs the same way."""

import json
import logging

import numpy as np
import pytest

from jetpipe.cli import main
from jetpipe.geometry import Letterbox
from jetpipe.tasks import ModelFacts, TaskError, choose, detect, for_bundle
from tests.helpers import residual_cnn, save, yolo_head_net

NAMES = "{0: 'cat', 1: 'dog'}"


def facts(*shapes, hw=(640, 640), **metadata):
    return ModelFacts(tuple((f"out{i}", tuple(s)) for i, s in enumerate(shapes)), hw, metadata)


@pytest.mark.parametrize("shapes, metadata, expected", [
    ([["N", 1, 640, 640]], {}, "text-detection"),
    ([["N", 84, 8400]], {}, "detection-yolo"),             # YOLOv8/11
    ([["N", 25200, 85]], {}, "detection-yolo"),            # YOLOv5: 3 anchors per cell
    ([["N", 84, 8400]], {"task": "detect"}, "detection-yolo"),
    ([["N", 1000]], {}, "classification"),
    ([["N", 1000]], {"task": "classify"}, "classification"),
    ([["N", 40, 5]], {"character": "a\nb\nc"}, "text-recognition"),  # blank + 3 + space
    ([["N", 116, 8400], ["N", 32, 160, 160]], {"task": "segment"}, "segmentation-yolo"),  # YOLOv8-seg
    ([["N", 300, 6]], {"task": "detect"}, "detection-e2e"),  # YOLOv10 / YOLO26 end-to-end
    ([["N", 300, 6]], {}, "detection-e2e"),
    ([["N", 300, 84]], {"task": "detect"}, "detection-e2e"),  # RT-DETR: normalized cxcywh + 80 scores
    ([["N", 300, 84]], {}, "raw"),                           # that shape alone could be a recognizer's
    ([["N", 56, 8400]], {"task": "pose"}, "pose-yolo"),
    ([["N", 55, 8400]], {"task": "pose", "kpt_shape": "[17, 3]"}, "raw"),  # no row left for a class
    ([["N", 40, 6625]], {}, "raw"),                        # a recognizer without its alphabet
    ([["N", 2, 320, 320]], {}, "semantic-segmentation"),  # a class map at half the input's size
    ([["N", 2, 300, 300]], {}, "raw"),
])
def test_recognized_from_shapes_and_metadata(shapes, metadata, expected):
    assert detect(facts(*shapes, **metadata))[0].name == expected


def test_a_task_that_does_not_fit_is_refused_with_the_shapes():
    with pytest.raises(TaskError, match=r"--task detection-yolo: the model's outputs do not fit: expects 8400 "
                                        r"\(or 25200\) anchor rows .* found out0 \['N', 56, 100\] \(pass --task raw"):
        choose("detection-yolo", facts(["N", 56, 100]))
    with pytest.raises(TaskError, match="says it is an Ultralytics 'pose' model, not a detector"):
        choose("detection-yolo", facts(["N", 56, 8400], task="pose"))
    with pytest.raises(TaskError, match="needs its alphabet: .* pass --labels FILE"):
        choose("text-recognition", facts(["N", 40, 6625]))
    with pytest.raises(TaskError, match="the alphabet has 3 characters, which does not fit 9 classes"):
        choose("text-recognition", facts(["N", 40, 9], character="a\nb\nc"))


def test_nothing_recognized_is_said_and_served_raw(caplog):
    with caplog.at_level(logging.WARNING):
        assert choose(None, facts(["N", 2, 300, 300])).name == "raw"
    assert "no task recognizes the outputs out0 ['N', 2, 300, 300]" in caplog.text
    assert "pass --task to choose" in caplog.text


def _manifest(bundle):
    return json.loads((bundle / "manifest.json").read_text())


def test_convert_records_a_detectors_task_and_class_names_and_serve_reads_them(tmp_path, capsys):
    model = save(yolo_head_net(metadata={"task": "detect", "names": NAMES}), tmp_path / "det.onnx")
    assert main(["convert", model, "-o", str(tmp_path / "b"), "--max-batch", "1", "--quiet"]) == 0
    manifest = _manifest(tmp_path / "b")
    assert (manifest["task"], manifest["labels"]) == ("detection-yolo", ["cat", "dog"])
    task, options = for_bundle(manifest)
    post = task.postprocessor(options)
    y = np.zeros((1, 6, 84), np.float32)
    y[0, :4, 3], y[0, 5, 3] = [20, 20, 10, 10], 0.9  # one box of class 1
    result = post({"y": y}, [Letterbox(1.0, 1.0, 0, 0)], [(64, 64)])[0]
    assert result["classes"] == [1] and result["labels"] == ["dog"]


def test_labels_file_names_the_classes_and_must_fit(tmp_path):
    model = save(residual_cnn(batch=1), tmp_path / "cls.onnx")
    (tmp_path / "names.txt").write_text("zero\none\ntwo\nthree\nfour\n")
    assert main(["convert", model, "-o", str(tmp_path / "b"), "--labels", str(tmp_path / "names.txt"),
                 "--max-batch", "2", "--quiet"]) == 0
    manifest = _manifest(tmp_path / "b")
    assert manifest["task"] == "classification" and manifest["labels"][4] == "four"
    task, options = for_bundle(manifest)
    logits = np.array([[0, 0, 0, 5, 1]], np.float32)
    assert task.postprocessor(options)({"y": logits}, [None], [(1, 1)])[0]["labels"][:2] == ["three", "four"]


def test_a_bundle_without_a_recorded_task_is_recognized_when_served(tmp_path):
    """Bundles of earlier versions recorded none (served raw without a word); now their outputs decide."""
    model = save(residual_cnn(batch=1), tmp_path / "cls.onnx")
    assert main(["convert", model, "-o", str(tmp_path / "b"), "--max-batch", "2", "--quiet"]) == 0
    manifest = _manifest(tmp_path / "b")
    manifest.pop("task"), manifest.pop("labels")
    assert for_bundle(manifest)[0].name == "classification"


def test_synthetic_calibration_is_said_out_of_domain_by_the_task_not_by_where_the_model_came_from(tmp_path,
                                                                                                  caplog):
    """Rendered text fits text models, built-in or from a file; a detector calibrated on it is warned."""
    warned = "--calib synthetic renders"
    yolo = save(yolo_head_net(metadata={"task": "detect", "names": NAMES}), tmp_path / "det.onnx")
    with caplog.at_level(logging.WARNING):
        assert main(["convert", yolo, "-o", str(tmp_path / "y"), "--max-batch", "1", "--calib", "synthetic",
                     "--calib-size", "2", "--quiet"]) == 0
    assert warned in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert main(["convert", "ppocr-rec", "-o", str(tmp_path / "r"), "--max-batch", "2", "--calib", "synthetic",
                     "--calib-size", "2", "--quiet"]) == 0
    assert _manifest(tmp_path / "r")["task"] == "text-recognition" and warned not in caplog.text


def test_int8_from_rendered_text_is_refused_for_a_model_that_does_not_read_text_unless_forced(tmp_path, capsys):
    yolo = save(yolo_head_net(metadata={"task": "detect", "names": NAMES}), tmp_path / "det.onnx")
    args = ["convert", yolo, "-o", str(tmp_path / "y"), "--max-batch", "1", "--precision", "int8", "--calib",
            "synthetic", "--calib-size", "2", "--engine", "never", "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "this is a detection-yolo model and INT8 ranges taken from unlike data cost accuracy" in err
    assert "--force-synthetic" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "y").exists()
    assert main([*args, "--force-synthetic"]) == 0 and (tmp_path / "y" / "manifest.json").exists()


def test_given_labels_come_before_the_models_names_and_must_fit_its_classes(tmp_path, capsys):
    model = save(yolo_head_net(metadata={"task": "detect", "names": NAMES}), tmp_path / "det.onnx")
    (tmp_path / "three.txt").write_text("a\nb\nc\n")
    (tmp_path / "two.txt").write_text("kitten\npuppy\n")
    assert main(["convert", model, "-o", str(tmp_path / "b"), "--labels", str(tmp_path / "three.txt"), "--quiet",
                 "--max-batch", "1"]) == 2
    err = capsys.readouterr().err
    assert "3 labels given for 2 classes: one label a line, one per class" in err and "Traceback" not in err
    assert not (tmp_path / "b").exists()
    assert main(["convert", model, "-o", str(tmp_path / "b"), "--labels", str(tmp_path / "two.txt"), "--quiet",
                 "--max-batch", "1"]) == 0
    assert _manifest(tmp_path / "b")["labels"] == ["kitten", "puppy"]
    with pytest.raises(TaskError, match="6 labels given for 5 classes"):
        choose("classification", ModelFacts((("y", ("N", 5)),), (16, 16), {}, tuple("abcdef")))


def _dynamic_size_net(metadata: dict):
    """Conv -> GAP -> Flatten on an input of dynamic height and width (as `dynamic=True` exports have it)."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("GlobalAveragePool", ["c"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["y"], name="flatten")]
    graph = helper.make_graph(nodes, "dynamic", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                              ["N", 3, "height", "width"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for key, value in metadata.items():
        model.metadata_props.add(key=key, value=value)
    return model


def test_a_dynamic_size_export_is_converted_at_its_own_imgsz_and_the_bundle_keeps_its_metadata(tmp_path, capsys):
    model = save(_dynamic_size_net({"imgsz": "[32, 48]", "task": "classify", "author": "x"}), tmp_path / "m.onnx")
    assert main(["convert", model, "-o", str(tmp_path / "b"), "--max-batch", "1", "--quiet"]) == 0
    manifest = _manifest(tmp_path / "b")
    assert manifest["input_size"] == [32, 48]
    assert manifest["metadata"] == {"imgsz": "[32, 48]", "task": "classify"}  # what tasks read, not all of it
    bare = save(_dynamic_size_net({}), tmp_path / "bare.onnx")
    assert main(["convert", bare, "-o", str(tmp_path / "c"), "--max-batch", "1", "--quiet"]) == 2
    assert "has dynamic height/width ['height', 'width']: pass --input-size HxW" in capsys.readouterr().err
