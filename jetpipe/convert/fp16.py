"""FP16: float16 graph with float32 I/O, some nodes kept in float32.

Each node gets a precision; a Cast is inserted wherever a float tensor crosses
between the two, initializers are stored once per precision they are read in.
Which nodes stay float32 is decided by `choose_fp32_nodes` from calibration
ranges (values fp16 cannot hold, reductions whose sums overflow) and, if the
output error is still too large, by measured per-node sensitivity.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from jetpipe.convert import ops
from jetpipe.convert.graph import GraphIndex, clone, drop_unused_initializers
from jetpipe.convert.ops import policy

log = logging.getLogger(__name__)

FP16_MAX = 65504.0
FLOAT, HALF = TensorProto.FLOAT, TensorProto.FLOAT16


def _value_types(model: onnx.ModelProto) -> dict[str, int]:
    g = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.value_info, *g.input, *g.output]}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def convert(model: onnx.ModelProto, keep_fp32: set[str]) -> onnx.ModelProto:
    """A float16 copy of `model` with float32 I/O; nodes named in keep_fp32 stay float32."""
    model = clone(model)
    graph = model.graph
    types = _value_types(model)
    inits = GraphIndex(graph).initializers
    nodes = [clone(n) for n in graph.node]
    half = [n.name not in keep_fp32 and policy(n.op_type).fp16 != ops.FLOAT32 and n.domain in ("", "ai.onnx")
            for n in nodes]
    produced: dict[str, int] = {i.name: FLOAT for i in graph.input}  # actual dtype of each float tensor
    casts: dict[tuple[str, int], str] = {}
    converted_inits: dict[tuple[str, int], str] = {}
    new_nodes: list[onnx.NodeProto] = []

    def as_dtype(name: str, dtype: int) -> str:
        if name in inits:
            if inits[name].data_type == dtype:
                return name
            key = (name, dtype)
            if key not in converted_inits:
                array = numpy_helper.to_array(inits[name])
                cast = array.astype(np.float16 if dtype == HALF else np.float32)
                new_name = f"{name}__{'fp16' if dtype == HALF else 'fp32'}"
                graph.initializer.append(numpy_helper.from_array(cast, new_name))
                converted_inits[key] = new_name
            return converted_inits[key]
        if produced.get(name, FLOAT) == dtype:
            return name
        key = (name, dtype)
        if key not in casts:
            out = f"{name}__cast_{'fp16' if dtype == HALF else 'fp32'}"
            new_nodes.append(helper.make_node("Cast", [name], [out], to=dtype, name=out))
            casts[key] = out
        return casts[key]

    for node, is_half in zip(nodes, half):
        fixed = policy(node.op_type).fp32_inputs
        for i, name in enumerate(node.input):
            if name and types.get(name) == FLOAT:
                node.input[i] = as_dtype(name, HALF if is_half and i not in fixed else FLOAT)
        if is_half:
            _retype_attributes(node)
        for out in node.output:
            if types.get(out) == FLOAT:
                produced[out] = HALF if is_half else FLOAT
        new_nodes.append(node)

    _restore_float_outputs(graph, produced, new_nodes)
    del graph.node[:]
    graph.node.extend(new_nodes)
    drop_unused_initializers(graph)
    del graph.value_info[:]
    return onnx.shape_inference.infer_shapes(model)


def _retype_attributes(node: onnx.NodeProto) -> None:
    """Attributes that fix an output dtype must follow the node to float16."""
    for attr in node.attribute:
        if node.op_type == "Cast" and attr.name == "to" and attr.i == FLOAT:
            attr.i = HALF
        elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == FLOAT:
            attr.t.CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(attr.t).astype(np.float16), attr.t.name))


def _restore_float_outputs(graph, produced: dict[str, int], nodes: list) -> None:
    """Graph outputs stay float32: rename the fp16 producer's output and cast back."""
    for out in graph.output:
        if produced.get(out.name) != HALF:
            continue
        inner = f"{out.name}__fp16"
        for node in nodes:
            node.output[:] = [inner if o == out.name else o for o in node.output]
            node.input[:] = [inner if i == out.name else i for i in node.input]
        nodes.append(helper.make_node("Cast", [inner], [out.name], to=FLOAT, name=f"{out.name}__to_fp32"))


def range_rules(model: onnx.ModelProto, absmax: dict[str, float], data_max: float) -> dict[str, str]:
    """Nodes that must stay float32 by their calibration ranges: node name -> reason."""
    keep: dict[str, str] = {}
    shapes = _static_sizes(model)
    inits = GraphIndex(model.graph).initializers
    for node in model.graph.node:
        io = [n for n in [*node.input, *node.output] if n in absmax]
        peak = max((absmax[n] for n in io), default=0.0)
        if peak > data_max:
            keep[node.name] = f"|x| reaches {peak:.4g} (> {data_max:g})"
            continue
        if policy(node.op_type).fp16 == ops.REDUCTION and node.input and node.input[0] in absmax:
            reduced = shapes.get(node.input[0], 1) // max(1, shapes.get(node.output[0], 1))
            if absmax[node.input[0]] * reduced > FP16_MAX:
                keep[node.name] = f"sum of {reduced} values up to {absmax[node.input[0]]:.4g} overflows fp16"
                continue
        for name in node.input:
            if name in inits and inits[name].data_type == FLOAT:
                w = np.abs(numpy_helper.to_array(inits[name]))
                if w.size and float(w.max()) > FP16_MAX:
                    keep[node.name] = f"initializer {name} exceeds the fp16 range"
    return keep


def _static_sizes(model: onnx.ModelProto) -> dict[str, int]:
    """Elements per sample (batch axis excluded) of tensors with known shapes."""
    sizes = {}
    for v in [*model.graph.value_info, *model.graph.output]:
        dims = v.type.tensor_type.shape.dim[1:]
        if dims and all(d.HasField("dim_value") for d in dims):
            sizes[v.name] = int(np.prod([d.dim_value for d in dims]))
    return sizes
