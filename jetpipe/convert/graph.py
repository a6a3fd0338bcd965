"""Load, check and clean up an ONNX model; fix its input size and batch axis.

Each step takes and returns a ModelProto, so `pipeline.py` reads as a chain.
Clean-up (constant folding, BatchNorm fusion, dead-node removal) is done by
onnxslim: pure Python, maintained, and it keeps the graph runnable by ONNX Runtime.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from jetpipe.errors import ModelError

log = logging.getLogger(__name__)

MIN_QDQ_OPSET = 13  # per-channel QuantizeLinear/DequantizeLinear needs `axis` (opset 13)


@dataclass(frozen=True)
class InputInfo:
    name: str
    dims: tuple  # int for fixed axes, str for symbolic ones


def load(path: str | Path) -> onnx.ModelProto:
    """Read and check a model; every failure names the file and what to do."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model file {path} not found: pass the path of an .onnx file")
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise ModelError(
            f"{path} is not a readable ONNX model ({type(exc).__name__}); "
            "is the file truncated or not ONNX? Re-export it"
        ) from exc
    if not model.graph.node:
        raise ModelError(f"{path} holds no graph nodes: is it an ONNX model? Re-export it")
    check(model, str(path))
    return model


def check(model: onnx.ModelProto, what: str = "model") -> None:
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0].rstrip(".")
        raise ModelError(f"{what} fails the ONNX checker: {first}. Fix or re-export the model") from exc


def opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def upgrade_opset(model: onnx.ModelProto, minimum: int = MIN_QDQ_OPSET) -> onnx.ModelProto:
    current = opset(model)
    if current >= minimum:
        return model
    log.info("upgrading opset %d -> %d (per-channel Q/DQ needs it)", current, minimum)
    try:
        return onnx.version_converter.convert_version(model, minimum)
    except Exception as exc:
        raise ModelError(
            f"could not upgrade the model from opset {current} to {minimum}: {exc}. "
            f"Re-export it with opset >= {minimum}"
        ) from exc


def image_input(model: onnx.ModelProto) -> InputInfo:
    """The single NCHW float input jetpipe feeds with camera frames."""
    inits = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    if len(inputs) != 1:
        names = ", ".join(i.name for i in inputs)
        raise ModelError(f"jetpipe converts models with one image input; this one has {len(inputs)}: {names}")
    tensor = inputs[0].type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
                 for d in tensor.shape.dim)
    if tensor.elem_type != TensorProto.FLOAT or len(dims) != 4:
        raise ModelError(
            f"input {inputs[0].name!r} must be a float32 NCHW tensor; it is "
            f"{TensorProto.DataType.Name(tensor.elem_type)} with shape {list(dims)}"
        )
    return InputInfo(inputs[0].name, dims)


def fix_input_size(model: onnx.ModelProto, size_hw: tuple[int, int] | None) -> onnx.ModelProto:
    """Set dynamic H/W to `size_hw`; refuse a size that contradicts fixed H/W."""
    info = image_input(model)
    hw = info.dims[2:]
    dynamic = [isinstance(d, str) for d in hw]
    if size_hw is None:
        if any(dynamic):
            raise ModelError(
                f"input {info.name!r} has dynamic height/width {list(hw)}: pass --input-size HxW"
            )
        return model
    for axis, (current, wanted, is_dyn) in enumerate(zip(hw, size_hw, dynamic), start=2):
        if not is_dyn and current != wanted:
            raise ModelError(
                f"--input-size {size_hw[0]}x{size_hw[1]} contradicts the model's fixed input "
                f"{hw[0]}x{hw[1]}: drop --input-size or pass {hw[0]}x{hw[1]}"
            )
        _input_dim(model, info.name, axis).dim_value = wanted
    return model


def make_batch_dynamic(model: onnx.ModelProto) -> bool:
    """Turn a fixed batch of 1 into a symbolic axis; True when the graph was changed."""
    info = image_input(model)
    if isinstance(info.dims[0], str):
        return False
    if info.dims[0] != 1:
        raise ModelError(
            f"input {info.name!r} has a fixed batch of {info.dims[0]}: re-export with batch 1 "
            "or a dynamic batch axis"
        )
    _input_dim(model, info.name, 0).dim_param = "batch"
    for out in model.graph.output:
        dims = out.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value") and dims[0].dim_value == 1:
            dims[0].dim_param = "batch"
    del model.graph.value_info[:]  # stale shapes with batch 1; re-inferred by simplify()
    return True


def _input_dim(model: onnx.ModelProto, name: str, axis: int):
    graph_input = next(i for i in model.graph.input if i.name == name)
    return graph_input.type.tensor_type.shape.dim[axis]


def attribute(node: onnx.NodeProto, name: str, default):
    """A node attribute's value, or `default` where the node does not set it."""
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def clone(message):
    """A detached deep copy of a protobuf message (ModelProto, NodeProto...)."""
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def expose_outputs(model: onnx.ModelProto, names) -> onnx.ModelProto:
    """A copy whose graph outputs include `names` (intermediate tensors, read back by a session)."""
    probe = clone(model)
    existing = {o.name for o in probe.graph.output}
    for name in names:
        if name not in existing:
            probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    return probe


def simplify(model: onnx.ModelProto) -> onnx.ModelProto:
    """Fold constants, fuse Conv+BatchNorm, drop dead nodes (onnxslim), then re-check."""
    import onnxslim

    try:
        slim = onnxslim.slim(model)
    except Exception as exc:
        raise ModelError(f"graph clean-up (onnxslim) failed: {exc}") from exc
    if slim is None:
        raise ModelError("graph clean-up (onnxslim) returned no model")
    check(slim, "the cleaned-up model")
    return with_shapes(slim)


def with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:
        raise ModelError(f"ONNX shape inference failed: {exc}") from exc


def prove_dynamic_batch(model: onnx.ModelProto, sample: np.ndarray, batch: int = 3) -> float:
    """Batch-N output must equal N batch-1 outputs; returns the max abs difference."""
    from jetpipe.runtime.sessions import cpu_session

    info = image_input(model)
    stacked = np.concatenate([sample[:1]] * batch, axis=0)
    stacked = stacked + np.linspace(0, 0.1, batch, dtype=np.float32)[:, None, None, None]
    session = cpu_session(model)
    try:
        together = session.run(None, {info.name: stacked})
        problem = next((f"output {o.name} has shape {list(t.shape)} for a batch of {batch}"
                        for o, t in zip(model.graph.output, together) if t.shape[:1] != (batch,)),
                       None)
    except Exception as exc:
        problem = str(exc).splitlines()[0][:200]
    if problem:
        raise ModelError(
            f"the model was exported with batch 1 and its graph fixes that size ({problem}); "
            "re-export it with a dynamic batch axis, or convert with --max-batch 1"
        )
    worst = 0.0
    for i in range(batch):
        alone = session.run(None, {info.name: stacked[i:i + 1]})
        for a, b in zip(alone, together):
            scale = max(1.0, float(np.abs(a).max()))
            diff = float(np.abs(a[0] - b[i]).max()) / scale
            worst = max(worst, diff)
    if worst > 1e-4:
        raise ModelError(
            f"batching changes the model's results (relative difference {worst:.2e} between "
            "batch-N and batch-1 runs): the graph mixes samples; convert with --max-batch 1"
        )
    return worst
