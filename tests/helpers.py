"""Tiny ONNX graphs built with onnx.helper for structure tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array, np.float32), name)


def residual_cnn(size: int = 16, batch="batch", opset: int = 17, seed: int = 0) -> onnx.ModelProto:
    """Conv -> Relu -> Conv -> Add(skip) -> GAP -> Flatten -> Gemm -> Sigmoid."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("w1", rng.standard_normal((4, 3, 3, 3)) * 0.3), _init("b1", rng.standard_normal(4) * 0.1),
        _init("w2", rng.standard_normal((4, 4, 3, 3)) * 0.3), _init("b2", rng.standard_normal(4) * 0.1),
        _init("wg", rng.standard_normal((5, 4)) * 0.5), _init("bg", rng.standard_normal(5) * 0.1),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "r1"], ["s"], name="residual"),
        helper.make_node("GlobalAveragePool", ["s"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["g"], transB=1, name="fc"),
        helper.make_node("Sigmoid", ["g"], ["y"], name="score"),
    ]
    graph = helper.make_graph(nodes, "residual_cnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 5])], inits)
    model = _model(graph, opset)
    onnx.checker.check_model(model)
    return model


def fixed_batch_reshape(size: int = 8) -> onnx.ModelProto:
    """Batch 1 with a Reshape to a hard-coded [1, -1]: cannot be made dynamic."""
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["y"], name="reshape")]
    graph = helper.make_graph(nodes, "fixed",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3 * size * size])],
                              [shape])
    return _model(graph, 17)


def upsample_net(size: int = 8, gain: float = 1.0) -> onnx.ModelProto:
    """Conv -> Mul(gain) -> Resize(scales) -> Conv: Resize's scales must stay float32 in fp16."""
    rng = np.random.default_rng(3)
    inits = [_init("w1", rng.standard_normal((4, 3, 3, 3)) * 0.3), _init("gain", [gain]),
             _init("scales", [1, 1, 2, 2]), _init("w2", rng.standard_normal((2, 4, 1, 1)) * 0.3)]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Mul", ["c1", "gain"], ["big"], name="amplify"),
        helper.make_node("Resize", ["big", "", "scales"], ["up"], mode="nearest", name="resize"),
        helper.make_node("Conv", ["up", "w2"], ["y"], name="conv2"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, size, size])
    graph = helper.make_graph(nodes, "upsample", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                             ["batch", 2, 2 * size, 2 * size])], inits)
    return _model(graph, 17)


def _model(graph, opset: int) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8  # what every supported onnxruntime reads
    return model


def save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def wide_cnn(size: int = 16, seed: int = 0) -> onnx.ModelProto:
    """Conv 3->16, Conv 16->16, depthwise Conv, GAP, Gemm 16->10: layers 2:4 can and cannot take."""
    rng = np.random.default_rng(seed)
    inits = [_init("w1", rng.standard_normal((16, 3, 3, 3)) * 0.3),
             _init("w2", rng.standard_normal((16, 16, 3, 3)) * 0.2),
             _init("wd", rng.standard_normal((16, 1, 3, 3)) * 0.3), _init("wg", rng.standard_normal((10, 16)) * 0.3)]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Conv", ["c2", "wd"], ["c3"], pads=[1, 1, 1, 1], group=16, name="depthwise"),
        helper.make_node("GlobalAveragePool", ["c3"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wg"], ["y"], transB=1, name="fc"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])
    graph = helper.make_graph(nodes, "wide", [x], [y], inits)
    return _model(graph, 17)
