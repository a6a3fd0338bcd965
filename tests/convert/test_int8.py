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
