"""Load, check and clean up an ONNX model; fix its input size and batch axis.

Each step takes and returns a ModelProto, so `chain.py` reads as a chain.
Clean-up (constant folding, BatchNorm fusion, dead-node removal) is done by
onnxslim: pure Python, maintained, and it keeps the graph runnable by ONNX Runtime.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
from onnx import TensorProto
from onnx.external_data_helper import ExternalDataInfo, load_external_data_for_model, uses_external_data

from jetpipe.errors import ModelError
from jetpipe.runtime.sessions import cpu_session

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
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise ModelError(
            f"{path} is not a readable ONNX model ({type(exc).__name__}); "
            "is the file truncated or not ONNX? Re-export it"
        ) from exc
    _load_external_data(model, path)
    if not model.graph.node:
        raise ModelError(f"{path} holds no graph nodes: is it an ONNX model? Re-export it")
    check(model, str(path))
    return model


def _load_external_data(model: onnx.ModelProto, path: Path) -> None:
    """Weights kept beside the .onnx (large exports): each data file must be there (a missing one was called a
    truncated model)."""
    files = {ExternalDataInfo(t).location for t in model.graph.initializer if uses_external_data(t)}
    missing = sorted(f for f in files if not (path.parent / f).is_file())
    if missing:
        raise ModelError(f"{path} keeps its weights in {', '.join(missing)}, which is not beside it in "
                         f"{path.parent}: copy the data file(s) next to the .onnx, or re-export with the weights "
                         "inside")
    if files:
        load_external_data_for_model(model, str(path.parent))


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


WIDTH = "width"  # the symbolic input width a width range keeps


def fix_input_size(model: onnx.ModelProto, size_hw: tuple[int, int] | None,
                   width_range: tuple[int, int] | None = None) -> onnx.ModelProto:
    """Set dynamic H/W to `size_hw`; refuse a size that contradicts fixed H/W. With `width_range`, the
    width stays dynamic (named WIDTH) and must be dynamic in the model."""
    info = image_input(model)
    hw = info.dims[2:]
    dynamic = [isinstance(d, str) for d in hw]
    if size_hw is None:
        if any(dynamic):
            raise ModelError(
                f"input {info.name!r} has dynamic height/width {list(hw)}: pass --input-size HxW"
            )
        return model
    if width_range is not None and not dynamic[1]:
        raise ModelError(f"--input-size {size_hw[0]}x{width_range[0]}:{size_hw[1]}:{width_range[1]}: a width "
                         f"range needs a dynamic input width, and this model's is fixed at {hw[1]}: pass "
                         f"{hw[0]}x{hw[1]}, or re-export with a dynamic width axis")
    for axis, (current, wanted, is_dyn) in enumerate(zip(hw, size_hw, dynamic), start=2):
        if not is_dyn and current != wanted:
            raise ModelError(
                f"--input-size {size_hw[0]}x{size_hw[1]} contradicts the model's fixed input "
                f"{hw[0]}x{hw[1]}: drop --input-size or pass {hw[0]}x{hw[1]}"
            )
        if axis == 3 and width_range is not None:
            _input_dim(model, info.name, axis).dim_param = WIDTH
        else:
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


class GraphIndex:
    """Name lookups over one graph, built once (onnx-graphsurgeon's `Graph.tensors()` and node
    lists, in small): nodes by name, initializers by name, the producer and the readers of each
    tensor. A snapshot: rebuild it after changing the graph."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.nodes = {n.name: n for n in graph.node}
        self.initializers = {t.name: t for t in graph.initializer}
        self.producer = {o: n for n in graph.node for o in n.output if o}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in dict.fromkeys(i for i in node.input if i):
                self.readers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in graph.output}

    def uses(self, name: str) -> int:
        """How many node inputs read tensor `name` (a node reading it twice counts twice)."""
        return sum(list(n.input).count(name) for n in self.readers.get(name, ()))

    def weight(self, name: str) -> np.ndarray:
        return onnx.numpy_helper.to_array(self.initializers[name])

    def of_type(self, op_type: str) -> dict[str, onnx.NodeProto]:
        return {name: n for name, n in self.nodes.items() if n.op_type == op_type}


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
    """Fold constants, fuse Conv+BatchNorm, drop dead nodes (onnxslim), then re-check.

    The declared output shapes are withheld from onnxslim: an export may declare what its outputs
    are not (a CRNN declaring [1, seqlen] for a [T, 1, C] output), and folding trusted them."""
    import onnxslim

    undeclared = clone(model)
    for output in undeclared.graph.output:
        output.type.tensor_type.ClearField("shape")
    try:
        slim = onnxslim.slim(undeclared)
    except Exception as exc:
        raise ModelError(f"graph clean-up (onnxslim) failed: {exc}") from exc
    if slim is None:
        raise ModelError("graph clean-up (onnxslim) returned no model")
    slim = with_shapes(slim)  # first: an onnxslim (0.1.40) that leaves the outputs' shapes cleared fails the checker
    check(slim, "the cleaned-up model")
    return slim


def clean_up(model: onnx.ModelProto, sample: np.ndarray, reference=None) -> tuple[onnx.ModelProto, dict]:
    """simplify(), kept only where the cleaned graph gives the source's outputs on `sample` (names, shapes,
    values); otherwise the graph as exported, with a warning and the reason for the manifest.
    reference: the source's outputs on `sample`, where the caller has them already."""
    try:
        cleaned = simplify(model)
    except ModelError as exc:  # a clean-up that fails is not the model's fault: keep the graph as exported
        cleaned, why = None, str(exc)
    else:
        why = outputs_differ(model, cleaned, sample, reference)
    if why is None:
        return cleaned, {"applied": True}
    log.warning("graph clean-up (onnxslim) not kept (%s): the bundle keeps the graph as exported", why)
    return with_shapes(model), {"applied": False, "reason": why}


def outputs_differ(source: onnx.ModelProto, other: onnx.ModelProto, sample: np.ndarray, reference=None,
                   tolerance: float = 1e-3) -> str | None:
    """How `other`'s outputs differ from `source`'s on one input (None: same names, shapes and values);
    reference: `source`'s outputs on it, where already computed."""
    feed = {image_input(source).name: sample}
    if reference is None:
        reference = cpu_session(source).run(None, feed)
    want = dict(zip([o.name for o in source.graph.output], reference))
    got = dict(zip([o.name for o in other.graph.output], cpu_session(other).run(None, feed)))
    if list(want) != list(got):
        return f"outputs {list(got)} instead of {list(want)}"
    for name, ref in want.items():
        if ref.shape != got[name].shape:
            return f"output {name} has shape {list(got[name].shape)} instead of {list(ref.shape)}"
        diff = relative_difference(ref, got[name])
        if diff > tolerance:
            return f"output {name} differs by {diff:.2e} (relative)"
    return None


def relative_difference(reference: np.ndarray, other: np.ndarray) -> float:
    """Largest |reference - other|, relative to the reference's largest magnitude (at least 1)."""
    if not reference.size:
        return 0.0
    scale = max(1.0, float(np.abs(reference).max()))
    return float(np.abs(reference.astype(np.float64) - other).max()) / scale


def drop_unused_initializers(graph: onnx.GraphProto) -> None:
    """Remove initializers no node reads any more."""
    used = {i for n in graph.node for i in n.input}
    keep = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)


def with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:
        raise ModelError(f"ONNX shape inference failed: {exc}") from exc
