"""detection-e2e: NMS-free heads decoded from their export's spec, against a reference written here from the
layouts (YOLOv10 end-to-end: x0 y0 x1 y1 score class in input pixels; RT-DETR: normalized cx cy w h and one
score per class, sigmoid of logits)."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from jetpipe.cli import main
from jetpipe.geometry import Letterbox, fit
from jetpipe.tasks import TaskOptions, get
from jetpipe.tasks.detection_e2e import EndToEndDetection

IDENTITY = Letterbox(1.0, 1.0, 0, 0)


def test_xyxy_rows_thresholded_sorted_and_mapped_to_the_source():
    rows = np.zeros((1, 300, 6), np.float32)  # unused rows: score 0
    rows[0, 0] = [10, 20, 110, 220, 0.5, 2]
    rows[0, 1] = [0, 0, 5, 5, 0.1, 0]          # below the threshold
    rows[0, 2] = [100, 200, 300, 300, 0.9, 1]  # inside the letterboxed content
    letterbox = fit((720, 1280), (640, 640), "letterbox")[1]
    post = EndToEndDetection(input_hw=(640, 640), labels=("a", "b", "c"))
    result = post({"y": rows}, [letterbox], [(720, 1280)])[0]
    assert result["scores"] == [0.9, 0.5] and result["classes"] == [1, 2] and result["labels"] == ["b", "c"]
    expected = letterbox.to_source(np.array([[100, 200], [300, 300]], np.float64)).reshape(-1)
    np.testing.assert_allclose(result["boxes"][0], np.round(expected, 1))
    assert post({"y": np.zeros((1, 300, 6), np.float32)}, [IDENTITY], [(640, 640)])[0]["boxes"] == []


def _reference_cxcywh(rows, input_hw, threshold, logits):
    """From the spec: scores (sigmoid of logits), best class, normalized cxcywh -> pixel xyxy, threshold."""
    h, w = input_hw
    scores = 1 / (1 + np.exp(-rows[:, 4:].astype(np.float64))) if logits else rows[:, 4:].astype(np.float64)
    out = []
    for row, s in zip(rows, scores):
        c = int(np.argmax(s))
        if s[c] >= threshold:
            cx, cy, bw, bh = row[0] * w, row[1] * h, row[2] * w, row[3] * h
            out.append((s[c], c, [cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2]))
    out.sort(key=lambda t: -t[0])
    return out


@pytest.mark.parametrize("logits", [False, True])
def test_rtdetr_queries_decode_as_the_layout_says(logits):
    rng = np.random.default_rng(1)
    rows = np.concatenate([rng.uniform(0.2, 0.8, (1, 300, 2)), rng.uniform(0.05, 0.3, (1, 300, 2)),
                           rng.uniform(-6, 2, (1, 300, 80)) if logits else rng.uniform(0, 0.4, (1, 300, 80))],
                          axis=2).astype(np.float32)
    result = EndToEndDetection(input_hw=(640, 640))({"y": rows}, [IDENTITY], [(640, 640)])[0]
    expected = _reference_cxcywh(rows[0], (640, 640), 0.25, logits)
    assert len(result["boxes"]) == len(expected) > 10
    assert result["classes"] == [c for _, c, _ in expected]
    np.testing.assert_allclose(result["scores"], [s for s, _, _ in expected], atol=1e-4)
    np.testing.assert_allclose(result["boxes"], [b for _, _, b in expected], atol=0.06)


def test_more_objects_than_max_detections_keeps_the_best():
    rows = np.zeros((1, 300, 6), np.float32)
    rows[0, :, :4] = [0, 0, 10, 10]
    rows[0, :, 4] = np.linspace(0.3, 0.99, 300)
    result = EndToEndDetection(input_hw=(64, 64), max_detections=100)({"y": rows}, [IDENTITY], [(64, 64)])[0]
    assert len(result["scores"]) == 100 and result["scores"][0] == pytest.approx(0.99, abs=1e-4)


def _e2e_net(size=64):
    """x [1, 3, size, size] -> pool -> Gemm -> [1, 300, 6]: an end-to-end head's shape (values random)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((1800, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.zeros(1800, np.float32), "b"),
             numpy_helper.from_array(np.array([1, 300, 6], np.int64), "shape")]
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "w", "b"], ["g"], transB=1),
             helper.make_node("Reshape", ["g", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "e2e", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 300, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model.metadata_props.add(key="task", value="detect")
    model.metadata_props.add(key="names", value="{0: 'cat', 1: 'dog'}")
    return model


def test_an_end_to_end_export_is_recognized_at_convert_and_refused_as_another_task(tmp_path, capsys):
    onnx.save(_e2e_net(), tmp_path / "e2e.onnx")
    out = tmp_path / "b"
    assert main(["convert", str(tmp_path / "e2e.onnx"), "-o", str(out), "--max-batch", "1", "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["task"], manifest["labels"]) == ("detection-e2e", ["cat", "dog"])
    code = main(["serve", "--bundle", str(out), "--task", "detection-yolo", "--source", "synthetic://64x48@0/nv12",
                 "--frames", "1", "--metrics", ""])
    assert code == 2 and "expects 84 (or 252) anchor rows" in capsys.readouterr().err


def test_the_metric_sees_boxes_that_vanish():
    task = get("detection-e2e")
    rows = np.zeros((2, 300, 6), np.float32)
    rows[:, 0] = [10, 10, 50, 50, 0.9, 1]
    gone = rows.copy()
    gone[1, 0, 4] = 0.1
    assert task.metric([rows], [rows], TaskOptions((64, 64)))["box_f1"] == 1.0
    assert task.metric([rows], [gone], TaskOptions((64, 64)))["box_f1_min"] == 0.0
