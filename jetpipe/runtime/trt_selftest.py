"""`jetpipe doctor --trt`: build a tiny engine and compare it with ONNX Runtime.

TensorRT proper (a Jetson, a desktop with TensorRT; with PyCUDA): build, run, compare.
TensorRT-RTX only: parse and build ahead of time (any x86_64 machine); running its
engines needs an RTX GPU (not run here).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from jetpipe.runtime.cuda import CudaDevice
from jetpipe.runtime.sessions import cpu_session
from jetpipe.runtime.trt_builder import BuildOptions, build_engine, make_logger


def tiny_model() -> onnx.ModelProto:
    """Conv 3->8 + Relu + GlobalAveragePool on a dynamic batch of 3x32x32 images."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["y"], name="pool")]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", 1, ["batch", 3, 32, 32])],
                          [helper.make_tensor_value_info("y", 1, ["batch", 8, 1, 1])], [w, b])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def run_selftest() -> int:
    import tensorrt as trt


    model = tiny_model()
    x = np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)
    expected = cpu_session(model).run(None, {"x": x})[0]
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path, plan_path = Path(tmp) / "tiny.onnx", Path(tmp) / "tiny.engine"
        onnx.save(model, str(onnx_path))
        facts = build_engine(onnx_path, plan_path, BuildOptions("x", (3, 32, 32), max_batch=4))
        plan = plan_path.read_bytes()
    y = np.empty_like(expected)
    with CudaDevice() as device, device.active():  # frees the buffers and stream, releases the context
        engine = trt.Runtime(make_logger(trt)).deserialize_cuda_engine(plan)
        if engine is None:
            print("error: TensorRT could not deserialize the engine it just built")
            return 1
        exec_ctx = engine.create_execution_context()
        stream = device.stream()
        d_x, d_y = device.alloc(x.nbytes), device.alloc(expected.nbytes)
        device.cuda.memcpy_htod_async(d_x, x, stream)
        exec_ctx.set_input_shape("x", x.shape)
        exec_ctx.set_tensor_address("x", int(d_x))
        exec_ctx.set_tensor_address("y", int(d_y))
        ok = exec_ctx.execute_async_v3(stream.handle)
        device.cuda.memcpy_dtoh_async(y, d_y, stream)
        stream.synchronize()
        del exec_ctx, engine  # before the context goes
    diff = float(np.abs(y - expected).max())
    print(f"trt selftest: TensorRT {facts['tensorrt']}, sm {facts['compute_capability']}, "
          f"execute {'ok' if ok else 'FAILED'}, max |TensorRT - ONNX Runtime| = {diff:.2e}")
    return 0 if ok and diff < 1e-3 else 1


def run_rtx_build_check() -> int:
    """Parse and build the tiny model with TensorRT-RTX for sm86, ahead of time (no GPU needed)."""

    with tempfile.TemporaryDirectory() as tmp:
        onnx_path, plan_path = Path(tmp) / "tiny.onnx", Path(tmp) / "tiny.engine"
        onnx.save(tiny_model(), str(onnx_path))
        facts = build_engine(onnx_path, plan_path, BuildOptions("x", (3, 32, 32), max_batch=4,
                                                                family="tensorrt-rtx", targets=("sm86",)))
        size = plan_path.stat().st_size
    print(f"trt selftest: TensorRT-RTX {facts['version']} parsed the tiny model and built a {size}-byte engine "
          f"ahead of time for {', '.join(facts['targets'])}; not run (TensorRT-RTX engines run on RTX GPUs: "
          "compute capability 7.5, 8.x, 12.x)")
    return 0
