import numpy as np
import onnx
from onnx import TensorProto

from jetpipe.convert import fp16, stats
from jetpipe.convert.graph import simplify
from jetpipe.runtime.sessions import cpu_session
from tests.helpers import residual_cnn, upsample_net


def test_float16_graph_with_float32_io():
    model = simplify(residual_cnn())
    half = fp16.convert(model, set())
    onnx.checker.check_model(half)
    assert half.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert half.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert all(t.data_type == TensorProto.FLOAT16 for t in half.graph.initializer)
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    ref = cpu_session(model).run(None, {"x": x})[0]
    out = cpu_session(half).run(None, {"x": x})[0]
    assert np.abs(out - ref).max() < 2e-3


def test_resize_scales_stay_float32_and_kept_nodes_stay_float32():
    model = simplify(upsample_net())
    half = fp16.convert(model, {"conv2"})
    inits = {t.name: t.data_type for t in half.graph.initializer}
    resize = next(n for n in half.graph.node if n.op_type == "Resize")
    assert inits[resize.input[2]] == TensorProto.FLOAT
    conv2 = next(n for n in half.graph.node if n.name == "conv2")
    assert inits[conv2.input[1]] == TensorProto.FLOAT
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    ref = cpu_session(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(cpu_session(half).run(None, {"x": x})[0], ref, atol=2e-3, rtol=2e-3)


def test_range_rules_keep_values_fp16_cannot_hold():
    model = simplify(upsample_net(gain=3e4))  # activations far beyond fp16's safe range
    x = np.random.default_rng(2).standard_normal((2, 3, 8, 8)).astype(np.float32)
    collected = stats.collect(model, [x], "x", set())
    keep = fp16.range_rules(model, collected.absmax(), data_max=16384)
    assert "amplify" in keep and "|x| reaches" in keep["amplify"]
    assert "conv1" not in keep
    ref = cpu_session(model).run(None, {"x": x})[0]
    naive = cpu_session(fp16.convert(model, set())).run(None, {"x": x})[0]
    guarded = cpu_session(fp16.convert(model, set(keep))).run(None, {"x": x})[0]
    assert not np.isfinite(naive).all() or np.abs(naive - ref).max() > np.abs(guarded - ref).max()
    assert np.isfinite(guarded).all()
    assert np.abs(guarded - ref).max() / np.abs(ref).max() < 1e-2


def test_reduction_overflow_rule():
    model = simplify(residual_cnn(size=64))
    absmax = {n: 0.0 for n in stats.float_tensors(model)}
    absmax["s"] = 100.0  # 64*64 values of 100 sum to 409,600 > 65,504
    keep = fp16.range_rules(model, absmax, data_max=16384)
    assert "pool" in keep and "overflows fp16" in keep["pool"]
