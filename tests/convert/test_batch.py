"""A batch-1 export made to batch: literal batch 1s rewritten, the result proved, the culprit named."""

import json

import numpy as np
import onnx
import pytest

from jetpipe.cli import main
from jetpipe.convert import batch, graph
from jetpipe.errors import ModelError
from jetpipe.runtime.sessions import cpu_session
from tests.helpers import (
    baked_batch_head,
    batch_collapsing_net,
    class_token_net,
    residual_cnn,
    save,
    time_major_recognizer,
)


def _dynamic(model):
    assert graph.make_batch_dynamic(model)
    return graph.simplify(model)


def _sample(size):
    return np.random.default_rng(0).standard_normal((1, 3, size, size)).astype(np.float32)


def test_a_batch_one_export_without_literals_is_proven_unchanged():
    model = _dynamic(residual_cnn(batch=1))
    before = model.SerializeToString()
    assert batch.batch_layout(model, _sample(16), made_dynamic=True) == {"rewritten_reshapes": [],
                                                                         "expanded_concats": [],
                                                                         "moved_batch_axes": {}}
    assert model.SerializeToString() == before and batch.prove_rows(model, _sample(16)) < 1e-5
    assert cpu_session(model).run(None, {"x": np.repeat(_sample(16), 4, axis=0)})[0].shape == (4, 5)


def test_literal_batch_ones_in_reshape_targets_are_freed_and_proven():
    model = _dynamic(baked_batch_head())
    assert batch.output_batch_axes(model, _sample(16))[1] is not None  # as exported: batch 3 does not run
    layout = batch.batch_layout(model, _sample(16), made_dynamic=True)
    assert sorted(layout["rewritten_reshapes"]) == ["cls_reshape", "dfl_reshape"]  # box_reshape: folded away
    assert batch.prove_rows(model, _sample(16)) < 1e-5
    x = np.concatenate([_sample(16), _sample(16) * 0.5, _sample(16) + 1])
    session, source = cpu_session(model), cpu_session(baked_batch_head())
    batched = session.run(None, {"x": x})
    for row in range(3):
        for got, alone in zip(batched, source.run(None, {"x": x[row:row + 1]})):
            np.testing.assert_allclose(got[row], alone[0], rtol=1e-5, atol=1e-6)


def test_a_class_token_folded_to_batch_one_is_expanded_to_the_batch_and_proven():
    """torch's dynamo export of a ViT at batch 1 joins a [1, 1, D] class token constant to the patch tokens:
    freeing the Reshapes' 1s is not enough there (ONNX Runtime fails in the Concat); the constant is expanded
    to the batch of the tokens, and each row of a batch equals the export's run on that frame alone."""
    model = _dynamic(class_token_net())
    layout = batch.batch_layout(model, _sample(8), made_dynamic=True)
    assert layout["rewritten_reshapes"] == ["tokens_reshape"] and layout["expanded_concats"] == ["node_cat"]
    assert batch.prove_rows(model, _sample(8)) < 1e-5
    x = np.concatenate([_sample(8), _sample(8) * 0.5, _sample(8) + 1, -_sample(8)])
    batched, source = cpu_session(model).run(None, {"x": x})[0], cpu_session(class_token_net())
    assert batched.shape == (4, 4)
    for row in range(4):
        np.testing.assert_allclose(batched[row], source.run(None, {"x": x[row:row + 1]})[0][0], rtol=1e-5, atol=1e-6)


def test_convert_makes_a_vit_style_export_batch_and_records_the_expanded_concat(tmp_path):
    out = tmp_path / "b"
    assert main(["convert", save(class_token_net(), tmp_path / "vit.onnx"), "-o", str(out), "--max-batch", "4",
                 "--engine", "never", "--task", "raw", "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["batch"]["max"] == 4 and manifest["batch"]["expanded_concats"] == ["node_cat"]
    assert cpu_session(str(out / "model.onnx")).run(None, {"x": np.repeat(_sample(8), 4, axis=0)})[0].shape == (4, 4)


def test_the_yolox_style_target_with_a_minus_one_copies_the_batch():
    model = _dynamic(baked_batch_head())
    batch.free_batch_literals(model)
    targets = {n.name: graph.GraphIndex(model.graph).weight(n.input[1]).tolist()
               for n in model.graph.node if n.op_type == "Reshape"}
    assert targets["cls_reshape"] == [0, 64, -1] and targets["dfl_reshape"] == [-1, 4, 16, 256]


def test_a_graph_that_mixes_the_batch_is_refused_naming_the_node():
    model = _dynamic(batch_collapsing_net())
    with pytest.raises(ModelError, match=r"fixes that size \(ReduceSum 'sum_over_batch' turns \[3, 3, 8, 8\] into "
                                         r"\[1, 3, 8, 8\]; rewriting the literal batch in 1 Reshape target\(s\) was "
                                         r"not enough\).*--max-batch 1"):
        batch.batch_layout(model, np.ones((1, 3, 8, 8), np.float32), made_dynamic=True)


def test_convert_makes_a_static_detector_export_batch(tmp_path):
    out = tmp_path / "b"
    assert main(["convert", save(baked_batch_head(), tmp_path / "head.onnx"), "-o", str(out), "--max-batch", "4",
                 "--engine", "never", "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["batch"]["max"] == 4 and len(manifest["batch"]["rewritten_reshapes"]) == 2
    assert [o["shape"] for o in manifest["io"]["outputs"]] == [["batch", 4, 256], ["batch", 64, 256]]
    session = cpu_session(str(out / "model.onnx"))
    assert [o.shape for o in session.run(None, {"x": np.repeat(_sample(16), 4, axis=0)})] == [(4, 4, 256),
                                                                                                (4, 64, 256)]


def test_a_time_major_output_gets_its_batch_axis_first(tmp_path):
    """A CRNN-style [T, N, C] output (dynamic batch): the bundle's output is [N, T, C], same values."""
    source = time_major_recognizer(batch="N")
    out = tmp_path / "b"
    assert main(["convert", save(source, tmp_path / "rec.onnx"), "-o", str(out), "--max-batch", "4",
                 "--engine", "never", "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["batch"]["moved_batch_axes"] == {"y": 1}
    assert manifest["io"]["outputs"] == [{"name": "y", "dtype": "float32", "shape": ["N", 32, 16]}]
    x = np.random.default_rng(1).standard_normal((4, 3, 8, 32)).astype(np.float32)
    got = cpu_session(str(out / "model.onnx")).run(None, {"x": x})[0]
    want = cpu_session(source).run(None, {"x": x})[0]
    assert want.shape == (32, 4, 16) and got.shape == (4, 32, 16)
    np.testing.assert_allclose(got, want.transpose(1, 0, 2), rtol=1e-5, atol=1e-6)


def test_clean_up_does_not_trust_a_wrong_output_declaration(tmp_path):
    """The export declares y as [1, seqlen] but produces [T, 1, C]: onnxslim folded the final Reshape
    to the declaration ([1, 512]); the bundle must keep the model's real output."""
    source = time_major_recognizer(batch=1, declared=[1, "seqlen"], shape_reshape=True)
    out = tmp_path / "b"
    assert main(["convert", save(source, tmp_path / "rec.onnx"), "-o", str(out), "--max-batch", "1",
                 "--engine", "never", "--quiet"]) == 0
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 32)).astype(np.float32)
    got = cpu_session(str(out / "model.onnx")).run(None, {"x": x})[0]
    want = cpu_session(source).run(None, {"x": x})[0].transpose(1, 0, 2)  # [T, 1, C], batch axis put first
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_clean_up_that_changes_outputs_is_not_kept(caplog):
    source = residual_cnn(batch=1)
    changed = graph.clone(source)
    weight = changed.graph.initializer[0]
    weight.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(weight) * 2, weight.name))
    why = graph.outputs_differ(source, changed, _sample(16))
    assert why is not None and why.startswith("output y differs by")
    assert graph.outputs_differ(source, graph.simplify(source), _sample(16)) is None


def test_a_time_major_batch_one_export_kept_at_batch_one_gets_its_batch_axis_first(tmp_path):
    """--max-batch 1 keeps a static batch-1 export's batch, yet [T, 1, C] still becomes [1, T, C]: the
    runtime takes frame i's result from axis 0."""
    source = time_major_recognizer(batch=1)
    out = tmp_path / "b"
    assert main(["convert", save(source, tmp_path / "rec.onnx"), "-o", str(out), "--max-batch", "1",
                 "--engine", "never", "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["batch"]["moved_batch_axes"] == {"y": 1}
    assert manifest["io"]["inputs"][0]["shape"][0] == 1 and manifest["io"]["outputs"][0]["shape"] == [1, 32, 16]
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 32)).astype(np.float32)
    got = cpu_session(str(out / "model.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, cpu_session(source).run(None, {"x": x})[0].transpose(1, 0, 2), rtol=1e-5)
