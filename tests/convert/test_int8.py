import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from jetpipe.convert import int8, stats
from jetpipe.convert.graph import simplify
from jetpipe.runtime.sessions import cpu_session
from tests.helpers import residual_cnn


@pytest.fixture(scope="module")
def model():
    return simplify(residual_cnn())


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(5).standard_normal((6, 3, 16, 16)).astype(np.float32)


def _quantized(model, data, method="minmax"):
    qplan = int8.plan(model, set())
    collected = stats.collect(model, [data[:3], data[3:]], "x", set(qplan.activations))
    return qplan, collected, int8.quantize(model, qplan, collected.ranges(method, qplan.activations))


def test_plan_follows_tensorrt_placement(model):
    qplan = int8.plan(model, set())
    assert set(qplan.nodes) == {"conv1", "conv2", "fc"}
    assert dict(qplan.weights) == {"w1": 0, "w2": 0, "wg": 0}  # Gemm transB=1: output axis 0
    # residual Add: the skip input (r1) is quantized, not the Conv output (c2)
    assert ("residual", 1) in qplan.uses and ("residual", 0) not in qplan.uses


def test_qdq_structure(model, data):
    _, _, q = _quantized(model, data)
    onnx.checker.check_model(q)
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    qnodes = [n for n in q.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert qnodes
    for node in qnodes:
        zero = inits[node.input[2]]
        assert zero.dtype == np.int8 and not zero.any()  # symmetric: zero points 0, INT8
    weight_dqs = [n for n in qnodes if n.input[0].endswith("__int8")]
    assert len(weight_dqs) == 3
    for node in weight_dqs:
        axis = {a.name: a.i for a in node.attribute}
        assert axis == {"axis": 0}  # written explicitly
        assert inits[node.input[1]].ndim == 1  # per channel
    activation_scales = [inits[n.input[1]] for n in qnodes if n.op_type == "QuantizeLinear"]
    assert all(s.ndim == 0 for s in activation_scales)  # per tensor
    biases = {"b1", "b2", "bg"}
    assert not any(n.input[0] in biases for n in qnodes)  # no INT32 bias Q/DQ
    conv2 = next(n for n in q.graph.node if n.name == "conv2")
    assert conv2.input[2] == "b2"


def test_minmax_ranges_equal_independent_absmax(model, data):
    from jetpipe.convert.graph import expose_outputs

    qplan, collected, q = _quantized(model, data)
    # every quantized activation, read back by a plain ORT session over all 6 samples at once
    names = sorted(qplan.activations)
    probe = cpu_session(expose_outputs(model, names), optimize=False)
    values = dict(zip([o.name for o in probe.get_outputs()], probe.run(None, {"x": data})))
    ranges = collected.ranges("minmax", names)
    assert len(names) >= 3
    for name in names:
        assert ranges[name] == pytest.approx(float(np.abs(values.get(name, data if name == "x" else None)).max()),
                                             rel=1e-6), name
    x_range = float(np.abs(data).max())
    assert collected.ranges("minmax", ["x"])["x"] == pytest.approx(x_range)
    scales = {n.input[0]: numpy_helper.to_array(next(t for t in q.graph.initializer
                                                     if t.name == n.input[1]))
              for n in q.graph.node if n.op_type == "QuantizeLinear"}
    assert float(scales["x"]) == pytest.approx(x_range / 127, rel=1e-6)


def test_quantized_model_stays_close_to_fp32(model, data):
    _, _, q = _quantized(model, data)
    ref = cpu_session(model).run(None, {"x": data})[0]
    out = cpu_session(q).run(None, {"x": data})[0]
    assert np.abs(out - ref).max() < 0.05


def test_excluded_nodes_stay_float(model, data):
    qplan = int8.plan(model, {"conv1", "fc"})
    assert qplan.nodes == ("conv2",)
    assert "wg" not in dict(qplan.weights)


def _two_branch_add():
    """conv_a -> Add input 0, conv_b -> Add input 1: the residual rule picks one of them for its Q/DQ."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.4).astype(np.float32), "wa"),
             numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.4).astype(np.float32), "wb")]
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], pads=[1, 1, 1, 1], name="conv_a"),
             helper.make_node("Conv", ["x", "wb"], ["b"], pads=[1, 1, 1, 1], name="conv_b"),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "two_branch", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                   ["batch", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_keeping_a_node_in_float_only_removes_quantization():
    """Excluding the Conv the residual rule fused into must not move the Add's Q/DQ onto the other input:
    that is new quantization error, on a tensor calibration never saw."""
    model = _two_branch_add()
    full = int8.plan(model, set())
    assert ("add", 1) in full.uses and ("add", 0) not in full.uses  # b, the skip input, is quantized
    for exclude in ({"conv_a"}, {"conv_b"}, {"conv_a", "conv_b"}, {"add"}):
        reduced = int8.plan(model, exclude)
        assert set(reduced.uses) <= set(full.uses), exclude
        assert set(reduced.activations) <= set(full.activations), exclude
    assert ("add", 0) not in int8.plan(model, {"conv_b"}).uses


def _one_conv(group: int, bias: bool):
    """x (8 channels, mean far from 0) -> Conv 3x3 without padding, so every output reads 9 real pixels."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(11)
    weight = (rng.standard_normal((8, 8 // group, 3, 3)) * 0.3).astype(np.float32)
    weight[:, 0, 0, 0] *= 6  # one large weight a channel: its rounding step is coarse
    inits = [numpy_helper.from_array(weight, "w")]
    inputs = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(np.linspace(-1, 1, 8).astype(np.float32), "b"))
        inputs.append("b")
    node = helper.make_node("Conv", inputs, ["y"], group=group, name="conv")
    graph = helper.make_graph([node], "one_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                ["batch", 8, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 10, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("group", [1, 8])
@pytest.mark.parametrize("bias", [True, False])
def test_bias_correction_takes_the_weights_rounding_shift_out_of_the_output_mean(group, bias):
    """Weights alone in INT8: the per-channel mean of the output moves by (W_int8 - W) . E[x]; with the input's
    channel means from calibration data that shift is folded into the bias (one made where the Conv had none),
    for plain and depthwise (group) Convs."""
    model = _one_conv(group, bias)
    rng = np.random.default_rng(2)
    calib = (rng.standard_normal((8, 8, 12, 12)) + np.arange(1, 9).reshape(1, 8, 1, 1)).astype(np.float32)
    held = (rng.standard_normal((8, 8, 12, 12)) + np.arange(1, 9).reshape(1, 8, 1, 1)).astype(np.float32)
    full = int8.plan(model, set())
    assert int8.conv_inputs(model, full) == {"x"}
    collected = stats.collect(model, [calib[:4], calib[4:]], "x", set(), mean_tensors={"x"})
    means = {k: np.asarray(v, np.float32) for k, v in collected.channel_means().items()}
    np.testing.assert_allclose(means["x"], calib.mean(axis=(0, 2, 3)), rtol=1e-5)
    weights_only = int8.QuantPlan((), full.weights, full.nodes, ())
    reference = cpu_session(model).run(None, {"x": held})[0]

    def mean_shift(channel_means):
        out = cpu_session(int8.quantize(model, weights_only, {}, channel_means)).run(None, {"x": held})[0]
        return np.abs((out - reference).mean(axis=(0, 2, 3)))

    plain, corrected = mean_shift(None), mean_shift(means)
    assert corrected.mean() < 0.2 * plain.mean(), (plain, corrected)


def test_a_long_tailed_weight_channel_is_clipped_where_that_loses_less():
    """The clip value of each weight channel is the one with the least squared error (the absmax among those
    tried): a few large weights of a long-tailed channel no longer set the step for the thousands of others."""
    rng = np.random.default_rng(4)
    w = np.stack([rng.laplace(0, 0.01, 4096), rng.uniform(-0.05, 0.05, 4096)]).astype(np.float32)
    scales = int8._weight_scales(w, axis=0)
    absmax = np.abs(w).max(axis=1) / 127

    def error(scale):
        return np.square(np.clip(np.round(w / scale[:, None]), -127, 127) * scale[:, None] - w).sum(axis=1)

    assert scales[0] < absmax[0]  # the long-tailed channel is clipped
    assert scales[1] == pytest.approx(absmax[1], rel=0.03)  # a uniform one barely
    assert (error(scales) <= error(absmax)).all() and error(scales)[0] < error(absmax)[0]


def test_each_qdq_pair_follows_the_node_that_makes_its_activation(det_model_path):
    """On PP-OCRv4 det: Q/DQ are placed right after their activation's producer (linear in the nodes: the
    sensitivity ranking quantizes the model once per node), and the graph stays topological."""
    from jetpipe.convert import graph

    det = graph.simplify(graph.load(det_model_path))  # cleaned up, as convert plans it
    qplan = int8.plan(det, set())
    q = int8.quantize(det, qplan, {name: 1.0 for name in qplan.activations})  # the structure needs no real ranges
    nodes = list(q.graph.node)
    made = {i.name for i in q.graph.input} | {t.name for t in q.graph.initializer} | {""}
    for node in nodes:  # topological: each input made before
        assert all(i in made for i in node.input), node.name
        made.update(node.output)
    made_by = {out: k for k, node in enumerate(nodes) for out in node.output}
    inputs = {i.name for i in q.graph.input}
    pairs = 0
    for k, node in enumerate(nodes):
        if node.op_type == "QuantizeLinear" and node.input[0] not in inputs:
            assert made_by[node.input[0]] == k - 1 or nodes[k - 1].op_type == "DequantizeLinear", node.name
            assert nodes[k + 1].op_type == "DequantizeLinear" and nodes[k + 1].input[0] == node.output[0]
            pairs += 1
    assert pairs > 50


def test_a_graph_out_of_topological_order_is_still_sorted(model, data):
    shuffled = onnx.ModelProto()
    shuffled.CopyFrom(model)
    reordered = list(reversed([onnx.NodeProto.FromString(n.SerializeToString()) for n in shuffled.graph.node]))
    del shuffled.graph.node[:]
    shuffled.graph.node.extend(reordered)
    _, collected, want = _quantized(model, data)
    qplan = int8.plan(shuffled, set())
    got = int8.quantize(shuffled, qplan, collected.ranges("minmax", qplan.activations))
    onnx.checker.check_model(got)
    np.testing.assert_array_equal(cpu_session(got).run(None, {"x": data})[0],
                                  cpu_session(want).run(None, {"x": data})[0])
