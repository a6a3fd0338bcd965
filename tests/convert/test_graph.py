import pytest

from jetpipe.convert import graph
from jetpipe.errors import ModelError
from tests.helpers import residual_cnn, save


def test_missing_truncated_and_non_onnx_files(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        graph.load(tmp_path / "nope.onnx")
    good = residual_cnn().SerializeToString()
    (tmp_path / "trunc.onnx").write_bytes(good[: len(good) // 2])
    with pytest.raises(ModelError, match="not a readable ONNX model|holds no graph nodes|checker"):
        graph.load(tmp_path / "trunc.onnx")
    (tmp_path / "text.onnx").write_text("hello, not a model")
    with pytest.raises(ModelError, match="trunc|not a readable ONNX model|holds no graph nodes"):
        graph.load(tmp_path / "text.onnx")


def test_checker_failure_is_reported(tmp_path):
    model = residual_cnn()
    model.graph.node[0].input[1] = "does_not_exist"
    with pytest.raises(ModelError, match="fails the ONNX checker"):
        graph.load(save(model, tmp_path / "bad.onnx"))


def test_opset_upgrade_for_qdq():
    model = graph.upgrade_opset(residual_cnn(opset=11))
    assert graph.opset(model) == 13


def test_input_size_rules():
    dynamic = residual_cnn(size="h")
    dynamic.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "w"
    with pytest.raises(ModelError, match="pass --input-size"):
        graph.fix_input_size(dynamic, None)
    fixed = graph.fix_input_size(dynamic, (32, 48))
    assert graph.image_input(fixed).dims[2:] == (32, 48)
    with pytest.raises(ModelError, match="contradicts the model's fixed input 16x16"):
        graph.fix_input_size(residual_cnn(), (32, 32))
