"""A batch-1 export kept at --max-batch 1: every step feeds it one row at a time.

Calibration (int8), the FP32 comparison, reconstruct pruning (activations and outputs on the
calibration samples), `calibrate accuracy` and its precision search all ran batches of 2-8
rows into a model that takes 1, and crashed with ONNX Runtime's "index: 0 Got: 2 Expected: 1".
"""

import json

import numpy as np
import onnx

from jetpipe.cli import main
from jetpipe.models import BUILTIN


def test_a_batch_1_export_at_max_batch_1_goes_through_every_step(tmp_path, capsys):
    model = onnx.load(str(BUILTIN["ppocr-det"].path()))
    batch = model.graph.input[0].type.tensor_type.shape.dim[0]
    batch.Clear()
    batch.dim_value = 1
    static = tmp_path / "det-batch1.onnx"
    onnx.save(model, str(static))
    bundle, report = tmp_path / "bundle", tmp_path / "report"
    assert main(["convert", str(static), "-o", str(bundle), "--input-size", "160x160", "--max-batch", "1",
                 "--precision", "int8", "--calib", "synthetic", "--calib-size", "4", "--prune", "0.3",
                 "--prune-method", "reconstruct", "--engine", "never", "--quiet"]) == 0
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["batch"]["max"] == 1 and manifest["pruning"]["pruned"] and manifest["calibration"]
    kept = onnx.load(str(bundle / "model.onnx")).graph.input[0].type.tensor_type.shape.dim[0]
    assert kept.dim_value == 1  # left as exported: no batch proof needed at max batch 1
    # an unreachable budget runs the whole precision search, then says so (exit 1 is that verdict)
    assert main(["calibrate", "accuracy", str(bundle), "--data", "synthetic", "--samples", "3", "--report",
                 str(report), "--task", "text-detection", "--budget", "f1>=0.9999"]) == 1
    result = json.loads((report / "report.json").read_text())
    assert result["samples"] == 3 and result["precision_search"]
    assert "Traceback" not in capsys.readouterr().err


def test_a_batch_that_cannot_be_made_dynamic_is_refused_before_pruning(tmp_path, caplog, capsys):
    from onnx import helper, numpy_helper

    from tests.helpers import residual_cnn, save

    model = residual_cnn(batch=1)
    model.graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), "batch_axis"))
    model.graph.node.append(helper.make_node("ReduceSum", ["y", "batch_axis"], ["z"], name="bake_batch"))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1, 5]))
    path = save(model, tmp_path / "baked.onnx")
    caplog.set_level("INFO", logger="jetpipe")
    assert main(["convert", str(path), "-o", str(tmp_path / "b"), "--max-batch", "4", "--prune", "0.5",
                 "--prune-align", "1", "--engine", "never", "--quiet"]) == 2
    assert "exported with batch 1 and its graph fixes that size" in capsys.readouterr().err
    assert not any("pruned" in r.getMessage() for r in caplog.records)  # refused first: pruning can take minutes
