"""Tiny ONNX graphs built with onnx.helper for structure tests."""

from __future__ import annotations

import contextlib
import subprocess

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


def batch_collapsing_net(size: int = 8) -> onnx.ModelProto:
    """Batch 1 whose graph sums over the batch axis (ReduceSum axis 0), then Reshapes to a literal
    [1, -1]: no rewriting of batch literals can make it batch."""
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["r"], name="sum_over_batch", keepdims=1),
             helper.make_node("Reshape", ["r", "shape"], ["y"], name="reshape")]
    graph = helper.make_graph(nodes, "collapsing",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3 * size * size])],
                              [axes, shape])
    return _model(graph, 17)


def baked_batch_head(size: int = 16, seed: int = 0) -> onnx.ModelProto:
    """A detector head exported the default way (static batch 1): a YOLOv8-style DFL Reshape to the
    literal [1, 4, 16, N] and a YOLOX-style Reshape to [1, C, -1], whose 1s only a rewrite can free."""
    rng = np.random.default_rng(seed)
    n = size * size
    inits = [_init("w", rng.standard_normal((64, 3, 3, 3)).astype(np.float32) * 0.3),
             numpy_helper.from_array(np.array([1, 4, 16, n], np.int64), "dfl_shape"),
             numpy_helper.from_array(np.array([1, 4, n], np.int64), "box_shape"),
             numpy_helper.from_array(np.array([1, 64, -1], np.int64), "cls_shape")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["f"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["f", "dfl_shape"], ["d"], name="dfl_reshape"),
             helper.make_node("Softmax", ["d"], ["p"], name="dfl_softmax", axis=2),
             helper.make_node("ReduceMax", ["p"], ["m"], name="dfl_reduce", axes=[2], keepdims=0),
             helper.make_node("Reshape", ["m", "box_shape"], ["boxes"], name="box_reshape"),
             helper.make_node("Reshape", ["f", "cls_shape"], ["c"], name="cls_reshape"),
             helper.make_node("Sigmoid", ["c"], ["scores"], name="cls_sigmoid")]
    graph = helper.make_graph(nodes, "baked",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 4, n]),
                               helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 64, n])],
                              inits)
    return _model(graph, 17)


def class_token_net(size: int = 8, seed: int = 0) -> onnx.ModelProto:
    """A ViT-style head exported the way torch's dynamo exporter writes torchvision's ViT at batch 1: the patch
    tokens [1, P, D] joined (Concat on axis 1) to a class token folded to a constant [1, 1, D], whose 1 is the
    batch's; then a layer that mixes tokens (so a wrong token shows in every output row)."""
    rng = np.random.default_rng(seed)
    inits = [_init("w", rng.standard_normal((8, 3, 2, 2)).astype(np.float32) * 0.3),
             _init("class_token", rng.standard_normal((1, 1, 8)).astype(np.float32)),
             _init("mix", rng.standard_normal((8, 4)).astype(np.float32) * 0.3),
             numpy_helper.from_array(np.array([1, 8, -1], np.int64), "tokens_shape")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["f"], name="patchify", strides=[2, 2]),
             helper.make_node("Reshape", ["f", "tokens_shape"], ["t"], name="tokens_reshape"),
             helper.make_node("Transpose", ["t"], ["tokens"], name="tokens_last", perm=[0, 2, 1]),
             helper.make_node("Concat", ["class_token", "tokens"], ["joined"], name="node_cat", axis=1),
             helper.make_node("ReduceMean", ["joined"], ["pooled"], name="pool", axes=[1], keepdims=0),
             helper.make_node("MatMul", ["pooled", "mix"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "class_token",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    return _model(graph, 17)


def time_major_recognizer(batch="N", declared=None, shape_reshape: bool = False) -> onnx.ModelProto:
    """A CRNN-style recognizer, x [N, 3, 8, 32] -> y [T=32, N, C=16] (time-major). shape_reshape: end with
    Reshape(t, Shape(t)), an identity that folding against a wrong declared output shape breaks."""
    rng = np.random.default_rng(5)
    inits = [_init("w", rng.standard_normal((16, 3, 8, 1)) * 0.3),
             numpy_helper.from_array(np.array([2], np.int64), "axes")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Squeeze", ["c", "axes"], ["s"], name="squeeze"),
             helper.make_node("Transpose", ["s"], ["t" if shape_reshape else "y"], name="time_major", perm=[2, 0, 1])]
    if shape_reshape:
        nodes += [helper.make_node("Shape", ["t"], ["t_shape"], name="shape"),
                  helper.make_node("Reshape", ["t", "t_shape"], ["y"], name="final_reshape")]
    graph = helper.make_graph(nodes, "crnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, declared or [32, batch, 16])],
                              inits)
    return _model(graph, 17)


def gray_recognizer(height: int = 32, width: int = 128, batch="N") -> onnx.ModelProto:
    """A 1-channel (grayscale) text-line model: x [N, 1, H, W] -> Conv -> ReLU -> GlobalAveragePool."""
    rng = np.random.default_rng(7)
    inits = [_init("w", rng.standard_normal((8, 1, 3, 3)) * 0.5), _init("b", rng.standard_normal(8) * 0.1)]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["y"], name="pool")]
    graph = helper.make_graph(nodes, "gray",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1, height, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8, 1, 1])], inits)
    return _model(graph, 17)


def int8_hostile_net(size: int = 16) -> onnx.ModelProto:
    """One channel 10^4 times the others between two Convs: a per-tensor INT8 range for that tensor rounds
    the seven small channels to zero, whose share of the output the second Conv keeps equal."""
    rng = np.random.default_rng(11)
    gain = np.ones((1, 8, 1, 1), np.float32)
    gain[0, 0] = 1e4
    w2 = rng.standard_normal((4, 8, 1, 1)).astype(np.float32)
    w2[:, 0] *= 1e-4
    inits = [_init("w1", rng.standard_normal((8, 3, 3, 3)) * 0.3), _init("gain", gain), _init("w2", w2)]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Mul", ["c1", "gain"], ["m"], name="gain"),
             helper.make_node("Conv", ["m", "w2"], ["y"], name="conv2")]
    graph = helper.make_graph(nodes, "hostile",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, size, size])], inits)
    return _model(graph, 17)


def hostile_chain_net(blocks: int = 12, hostile: tuple[int, ...] = (3, 7, 10), size: int = 16) -> onnx.ModelProto:
    """Conv 3->8, then `blocks` x (Mul by a per-channel gain -> Conv 8->8); in the `hostile` blocks one channel
    is 10^4 times the others before the Conv (int8_hostile_net's pattern), so quantizing that Conv's input
    loses the other seven channels. The other blocks quantize well."""
    rng = np.random.default_rng(17)
    inits = [_init("w0", rng.standard_normal((8, 3, 3, 3)) * 0.3)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], name="conv0")]
    for i in range(1, blocks + 1):
        gain = np.ones((1, 8, 1, 1), np.float32)
        # near the identity: a well-conditioned chain, where the benign blocks' INT8 errors stay small
        weight = (np.eye(8) + 0.2 * rng.standard_normal((8, 8))).reshape(8, 8, 1, 1).astype(np.float32)
        if i in hostile:
            gain[0, 0], weight[:, 0] = 1e4, weight[:, 0] * 1e-4
        inits += [_init(f"gain{i}", gain), _init(f"w{i}", weight)]
        nodes += [helper.make_node("Mul", [f"c{i - 1}", f"gain{i}"], [f"m{i}"], name=f"gain{i}"),
                  helper.make_node("Conv", [f"m{i}", f"w{i}"], [f"c{i}" if i < blocks else "y"], name=f"conv{i}")]
    graph = helper.make_graph(nodes, "hostile_chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, size, size])], inits)
    return _model(graph, 17)


def qdq_net(size: int = 16) -> onnx.ModelProto:
    """An already quantized model (Q/DQ in front of a Conv, as ONNX Runtime's quantize_static writes it)."""
    rng = np.random.default_rng(13)
    inits = [_init("w", rng.standard_normal((4, 3, 3, 3)) * 0.3), _init("scale", 0.02),
             numpy_helper.from_array(np.array(0, np.int8), "zero")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], name="quantize_input"),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["dq"], name="dequantize_input"),
             helper.make_node("Conv", ["dq", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "qdq",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, size, size])], inits)
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


def c2f_sppf_net(dead: dict | None = None, size: int = 16, seed: int = 0, split: str = "input") -> onnx.ModelProto:
    """YOLOv8's blocks in small, as exported and cleaned up: SiLU as Sigmoid + Mul; C2f (cv1 -> Split in
    halves -> a bottleneck with a residual Add on the second half -> Concat of both halves and the
    bottleneck -> cv2); SPPF (cv1 -> three chained MaxPools -> Concat of all four -> cv2); a head Conv.
    Every bias is zero and all are one initializer (as onnxslim leaves fresh BatchNorms fused).
    dead: {conv name: output channels whose weights are zero} (such channels are 0 after SiLU).
    split: how the Split gets its sizes: "input" (opset 13+), "attribute" (opset 11), "equal" (opset 18,
    num_outputs)."""
    rng = np.random.default_rng(seed)
    shapes = {"conv0": (32, 3), "c2f_cv1": (32, 32), "m1": (16, 16), "m2": (16, 16), "c2f_cv2": (32, 48),
              "sppf_cv1": (16, 32), "sppf_cv2": (32, 64), "head": (4, 32)}
    inits = [_init("zeros", np.zeros(32)), _init("zeros16", np.zeros(16)), _init("zeros4", np.zeros(4)),
             numpy_helper.from_array(np.array([16, 16], np.int64), "halves")]
    for name, (k, c) in shapes.items():
        kernel = (3, 3) if name in ("conv0", "m1", "m2") else (1, 1)
        w = rng.standard_normal((k, c, *kernel)) * (1.5 / np.sqrt(c))
        w[list((dead or {}).get(name, ()))] = 0
        inits.append(_init(f"w_{name}", w))
    bias = {32: "zeros", 16: "zeros16", 4: "zeros4"}
    nodes = []

    def conv(name, x, silu=True):
        k = shapes[name][0]
        pads = [1, 1, 1, 1] if name in ("conv0", "m1", "m2") else [0, 0, 0, 0]
        nodes.append(helper.make_node("Conv", [x, f"w_{name}", bias[k]], [f"{name}_c"], pads=pads, name=name))
        if not silu:
            return f"{name}_c"
        nodes.append(helper.make_node("Sigmoid", [f"{name}_c"], [f"{name}_s"], name=f"{name}_sigmoid"))
        nodes.append(helper.make_node("Mul", [f"{name}_c", f"{name}_s"], [f"{name}_y"], name=f"{name}_silu"))
        return f"{name}_y"

    c1 = conv("c2f_cv1", conv("conv0", "x"))
    sizes = {"input": {"inputs": [c1, "halves"]}, "attribute": {"inputs": [c1], "split": [16, 16]},
             "equal": {"inputs": [c1], "num_outputs": 2}}[split]
    nodes.append(helper.make_node("Split", outputs=["a", "b"], axis=1, name="c2f_split", **sizes))
    nodes.append(helper.make_node("Add", ["b", conv("m2", conv("m1", "b"))], ["bm"], name="bottleneck_add"))
    nodes.append(helper.make_node("Concat", ["a", "b", "bm"], ["cat"], axis=1, name="c2f_concat"))
    s = conv("sppf_cv1", conv("c2f_cv2", "cat"))
    pooled = [s]
    for i in range(3):
        nodes.append(helper.make_node("MaxPool", [pooled[-1]], [f"pool{i}"], kernel_shape=[5, 5],
                                      pads=[2, 2, 2, 2], strides=[1, 1], name=f"sppf_pool{i}"))
        pooled.append(f"pool{i}")
    nodes.append(helper.make_node("Concat", pooled, ["sppf_cat"], axis=1, name="sppf_concat"))
    y = conv("head", conv("sppf_cv2", "sppf_cat"), silu=False)
    graph = helper.make_graph(nodes, "c2f_sppf",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, size, size])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["batch", 4, size, size])],
                              inits)
    return _model(graph, {"input": 17, "attribute": 11, "equal": 18}[split])


def yolo_head_net(size: int = 64, classes: int = 2, metadata: dict | None = None, seed: int = 0,
                  box_gain: float = 1.0) -> onnx.ModelProto:
    """A YOLOv8-shaped head: one 1x1 Conv per stride (8, 16, 32) on a pooled input, each [N, 4+C, cells],
    concatenated to [N, 4+C, A] with A the anchor points at `size` (84 at 64x64), mixed by an identity MatMul
    (a quantizable layer over box and class channels together, as a real head's last layers are); boxes
    scaled to pixels, class scores through a Sigmoid. `box_gain` > 1 makes the box logits that much larger
    than the class logits: one INT8 range for both then leaves the class logits a step or two (scores
    collapse, boxes barely move). `metadata`: the export's metadata_props (Ultralytics: task, names)."""
    rng = np.random.default_rng(seed)
    channels, nodes, inits, levels = 4 + classes, [], [], []
    gain = np.array([box_gain] * 4 + [1.0] * classes)
    for stride in (8, 16, 32):
        cells = (size // stride) ** 2
        inits += [_init(f"w{stride}", rng.standard_normal((channels, 3, 1, 1)) * gain[:, None, None, None]),
                  _init(f"b{stride}", rng.standard_normal(channels) * gain),
                  numpy_helper.from_array(np.array([0, channels, cells], np.int64), f"shape{stride}")]
        nodes += [helper.make_node("AveragePool", ["x"], [f"p{stride}"], kernel_shape=[stride, stride],
                                   strides=[stride, stride]),
                  helper.make_node("Conv", [f"p{stride}", f"w{stride}", f"b{stride}"], [f"c{stride}"]),
                  helper.make_node("Reshape", [f"c{stride}", f"shape{stride}"], [f"l{stride}"])]
        levels.append(f"l{stride}")
    inits += [numpy_helper.from_array(np.array([4], np.int64), "split"),
              numpy_helper.from_array(np.array([classes], np.int64), "rest"),
              _init("box_scale", np.full((1, 4, 1), size / 2.0))]
    inits.append(_init("mix", np.eye(channels)))
    nodes += [helper.make_node("Concat", levels, ["levels"], axis=2),
              helper.make_node("MatMul", ["mix", "levels"], ["all"], name="mix"),
              helper.make_node("Split", ["all", "split_sizes"], ["raw_box", "raw_cls"], axis=1),
              helper.make_node("Sigmoid", ["raw_box"], ["unit_box"]),
              helper.make_node("Mul", ["unit_box", "box_scale"], ["box"]),
              helper.make_node("Sigmoid", ["raw_cls"], ["cls"]),
              helper.make_node("Concat", ["box", "cls"], ["y"], axis=1)]
    inits.append(numpy_helper.from_array(np.array([4, classes], np.int64), "split_sizes"))
    anchors = sum((size // s) ** 2 for s in (8, 16, 32))
    graph = helper.make_graph(nodes, "yolo_head",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, anchors])],
                              [i for i in inits if i.name not in ("split", "rest")])
    model = _model(graph, 17)
    for key, value in (metadata or {}).items():
        model.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(model)
    return model


@contextlib.contextmanager
def nearly_full_disk(folder, size_kb: int, free_kb: int):
    """A tmpfs of `size_kb` mounted at `folder` (made here), all but `free_kb` of it taken by a file named
    "filler": writes there run out of space. Skips the test where mounting is not allowed (it needs root)."""
    import pytest

    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(folder)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.decode().strip()[:80]}): needs root")
    try:
        (folder / "filler").write_bytes(b"\0" * (size_kb - free_kb) * 1024)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)
