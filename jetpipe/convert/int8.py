"""INT8 explicit quantization: symmetric Q/DQ placed the way TensorRT fuses them.

- Inputs of Conv / ConvTranspose / Gemm / MatMul get Q/DQ: activations per
  tensor, weights per output channel with an explicit `axis`, stored as INT8
  initializers behind a DequantizeLinear. Zero points are 0; biases stay float.
- A residual Add whose one input comes from a Conv gets Q/DQ on its other
  (skip) input, so TensorRT can fuse Conv+Add with an INT8 residual.
- Which ops are compute ops and their weights' channel axis: jetpipe.convert.ops
  (one policy per op type, like ONNX Runtime's quantization/registry.py).
- Each weight channel's scale is the one of its clip values (from its absmax down to half of it) with the
  least squared rounding + clipping error: an outlier weight no longer coarsens the whole channel.
- Bias correction (Nagel et al., "Data-Free Quantization", empirical form): rounding the weights moves a
  Conv's output mean by (W_int8 - W) . E[x]; with the mean of each input channel measured on the calibration
  data, that shift is taken out of the Conv's bias. PP-OCRv4 rec, weights alone in INT8: character error
  against FP32 1.6 % -> 0.6 % on 96 held-out lines.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from jetpipe.convert.graph import GraphIndex, clone
from jetpipe.convert.ops import policy


@dataclass(frozen=True)
class QuantPlan:
    """What to quantize: activation tensors (per tensor) and weights (per channel)."""

    activations: tuple[str, ...]
    weights: tuple[tuple[str, int], ...]   # (initializer, axis)
    nodes: tuple[str, ...]                 # quantized compute nodes
    uses: tuple[tuple[str, int], ...]      # (node, input index) that read the DQ output


def plan(model: onnx.ModelProto, exclude: set[str]) -> QuantPlan:
    """The Q/DQ placement with `exclude` kept in float: always a subset of the placement without it.

    Keeping a node in float only removes quantization. Placed afresh, the residual-Add
    rule would move the Add's Q/DQ to its other input when the Conv it preferred is
    excluded: new quantization error (the precision search got worse as it kept more
    nodes in float) on a tensor calibration never needed (calibration failed)."""
    reduced = _place(model, set(exclude))
    if not exclude:
        return reduced
    allowed = set(_place(model, set()).uses)
    uses = tuple(u for u in reduced.uses if u in allowed)
    nodes = GraphIndex(model.graph).nodes
    read = {nodes[node].input[index] for node, index in uses}
    return QuantPlan(tuple(a for a in reduced.activations if a in read), reduced.weights, reduced.nodes, uses)


def _place(model: onnx.ModelProto, exclude: set[str]) -> QuantPlan:
    """TensorRT's placement for the nodes not in `exclude`."""
    graph, index = model.graph, GraphIndex(model.graph)
    inits, producers = index.initializers, index.producer
    activations: list[str] = []
    weights: dict[str, int] = {}
    nodes: list[str] = []
    uses: list[tuple[str, int]] = []

    def add_activation(node, index):
        name = node.input[index]
        if name in inits:
            return
        if name not in activations:
            activations.append(name)
        uses.append((node.name, index))

    for node in graph.node:
        axes = policy(node.op_type).weights
        if axes is None or node.name in exclude:
            continue
        # input 0 is the activation, input 1 the weight; activation x activation MatMuls (attention) stay float
        if len(node.input) < 2 or node.input[1] not in inits or inits[node.input[1]].data_type != TensorProto.FLOAT:
            continue
        add_activation(node, 0)
        weights[node.input[1]] = axes.output(node)
        nodes.append(node.name)

    quantized = set(nodes)
    for node in graph.node:  # residual Adds: quantize the skip branch
        if node.op_type != "Add" or node.name in exclude or len(node.input) != 2:
            continue
        from_conv = [producers.get(i) is not None and producers[i].name in quantized
                     and producers[i].op_type == "Conv" for i in node.input]
        if from_conv.count(True) >= 1 and not all(i in inits for i in node.input):
            skip = 1 if from_conv[0] else 0
            if node.input[skip] in producers:
                add_activation(node, skip)
    return QuantPlan(tuple(activations), tuple(weights.items()), tuple(nodes), tuple(uses))


def conv_inputs(model: onnx.ModelProto, qplan: QuantPlan) -> set[str]:
    """The activations feeding the plan's Convs: bias correction needs each one's channel means."""
    nodes = GraphIndex(model.graph).nodes
    return {nodes[name].input[0] for name in qplan.nodes if nodes[name].op_type == "Conv"}


def quantize(model: onnx.ModelProto, qplan: QuantPlan, ranges: dict[str, float],
             channel_means: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """Insert Q/DQ for the plan; `ranges` maps activation -> |x| clip value; `channel_means` (a Conv input ->
    the mean of each of its channels on the calibration data) turns on bias correction for those Convs."""
    out = clone(model)
    graph = out.graph
    new_nodes: list[onnx.NodeProto] = []
    rewired: dict[str, str] = {}
    for name in qplan.activations:
        amax = ranges.get(name)
        if not amax or not np.isfinite(amax):
            continue  # never observed non-zero: leave in float
        scale = np.float32(amax / 127.0)
        rewired[name] = _add_qdq(graph, new_nodes, name, np.array(scale, np.float32), axis=None)
    weight_errors = {name: _quantize_weight(graph, name, axis) for name, axis in qplan.weights}
    if channel_means:
        _correct_biases(graph, qplan, weight_errors, channel_means)
    uses = set(qplan.uses)
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in rewired and (node.name, i) in uses:
                node.input[i] = rewired[name]
    _insert_sorted(graph, new_nodes)
    del graph.value_info[:]
    return onnx.shape_inference.infer_shapes(out)


def _add_qdq(graph, new_nodes, name: str, scale: np.ndarray, axis: int | None) -> str:
    base = name.replace(":", "_")
    scale_name, zero_name = f"{base}__scale", f"{base}__zero"
    graph.initializer.append(numpy_helper.from_array(scale, scale_name))
    graph.initializer.append(numpy_helper.from_array(np.zeros(scale.shape, np.int8), zero_name))
    kwargs = {} if axis is None else {"axis": axis}
    q, dq = f"{base}__q", f"{base}__dq"
    new_nodes.append(helper.make_node("QuantizeLinear", [name, scale_name, zero_name], [q],
                                      name=q, **kwargs))
    new_nodes.append(helper.make_node("DequantizeLinear", [q, scale_name, zero_name], [dq],
                                      name=dq, **kwargs))
    return dq


def _quantize_weight(graph, name: str, axis: int) -> np.ndarray:
    """Replace a float weight by INT8 values + per-channel DequantizeLinear (same output name); returns the
    rounding error (dequantized - float)."""
    index = next(i for i, t in enumerate(graph.initializer) if t.name == name)
    w = numpy_helper.to_array(graph.initializer[index]).astype(np.float32)
    scale = _weight_scales(w, axis)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    error = q.astype(np.float32) * scale.reshape(shape) - w
    del graph.initializer[index]
    graph.initializer.extend([
        numpy_helper.from_array(q, f"{name}__int8"),
        numpy_helper.from_array(scale, f"{name}__wscale"),
        numpy_helper.from_array(np.zeros(scale.shape, np.int8), f"{name}__wzero"),
    ])
    graph.node.insert(0, helper.make_node(
        "DequantizeLinear", [f"{name}__int8", f"{name}__wscale", f"{name}__wzero"], [name],
        name=f"{name}__dq", axis=axis))
    return error


CLIP_FACTORS = np.linspace(0.5, 1.0, 26)  # a weight channel's clip value, as a share of its absmax


def _weight_scales(w: np.ndarray, axis: int) -> np.ndarray:
    """Per output channel: the scale (clip / 127) whose rounding + clipping error is least."""
    channels = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    amax = np.abs(channels).max(axis=1)
    best_scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    best_error = np.full(len(amax), np.inf)
    for factor in CLIP_FACTORS:
        scale = np.where(amax > 0, factor * amax / 127.0, 1.0).astype(np.float32)[:, None]
        error = np.square(np.clip(np.round(channels / scale), -127, 127) * scale - channels).sum(axis=1)
        better = error < best_error
        best_error[better], best_scale[better] = error[better], scale[better, 0]
    return best_scale


def _correct_biases(graph, qplan: QuantPlan, weight_errors: dict[str, np.ndarray],
                    channel_means: dict[str, np.ndarray]) -> None:
    """Take each quantized Conv's output mean shift, (W_int8 - W) . E[x], out of its bias."""
    index = GraphIndex(graph)
    quantized = set(qplan.nodes)
    for node in graph.node:
        mean = channel_means.get(node.input[0]) if node.op_type == "Conv" and node.name in quantized else None
        error = weight_errors.get(node.input[1]) if mean is not None else None
        if error is None or index.uses(node.input[1]) != 1 or error.shape[1] * _group(node) != len(mean):
            continue  # a weight two Convs share would take two corrections
        shift = _conv_mean_shift(error, _group(node), np.asarray(mean, np.float32))
        _subtract_from_bias(graph, index, node, shift)


def _group(node) -> int:
    return next((a.i for a in node.attribute if a.name == "group"), 1)


def _conv_mean_shift(error: np.ndarray, group: int, mean: np.ndarray) -> np.ndarray:
    """Per output channel: sum over its kernel of the weight error times its input channel's mean."""
    per_input = error.reshape(error.shape[0], error.shape[1], -1).sum(axis=2)  # (out, in / group)
    group_of = np.arange(error.shape[0]) // (error.shape[0] // group)
    return np.einsum("oc,oc->o", per_input, mean.reshape(group, -1)[group_of])


def _subtract_from_bias(graph, index: GraphIndex, node, shift: np.ndarray) -> None:
    if len(node.input) > 2 and node.input[2]:
        name = node.input[2]
        if name not in index.initializers or index.uses(name) != 1:
            return  # a computed or shared bias: left as it is
        tensor = index.initializers[name]
        bias = numpy_helper.to_array(tensor).astype(np.float32)
        tensor.CopyFrom(numpy_helper.from_array((bias - shift).astype(np.float32), name))
        return
    name = f"{node.name}__corrected_bias"
    graph.initializer.append(numpy_helper.from_array((-shift).astype(np.float32), name))
    while len(node.input) < 2:
        node.input.append("")
    node.input.append(name)


def _insert_sorted(graph, new_nodes) -> None:
    """Add the Q/DQ nodes in topological order: each pair right after the node that makes its input, the graph's
    own order otherwise. Linear in the nodes: sorting level by level took seconds a model, and the sensitivity
    ranking and the precision search quantize the model once for each node they try. A graph whose own order is
    not topological is still sorted level by level."""
    nodes = [clone(n) for n in graph.node]
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    ordered = _after_producers(nodes, new_nodes, set(available))
    if ordered is None:
        ordered = _by_levels(nodes + new_nodes, available)
    del graph.node[:]
    graph.node.extend(ordered)


def _after_producers(nodes: list, new_nodes: list, available: set) -> list | None:
    """nodes with each new node right after the node that makes its first input (a Q: its activation; a DQ: its
    Q's output); None where the nodes are not in topological order."""
    readers: dict[str, list] = {}
    for node in new_nodes:
        readers.setdefault(node.input[0], []).append(node)
    first = [n for name in list(readers) if name in available for n in readers.pop(name)]  # a graph input's Q
    ordered = []
    for node in [*first, *nodes]:
        stack = [node]
        while stack:
            n = stack.pop()
            if not all(i in available for i in n.input):
                return None
            ordered.append(n)
            for out in n.output:
                available.add(out)
                stack.extend(reversed(readers.pop(out, [])))
    return None if readers else ordered


def _by_levels(nodes: list, available: set) -> list:
    """Kahn's sort a level at a time: every node whose inputs are all made, in the given order, then again."""
    ordered, pending = [], nodes
    while pending:
        ready = [n for n in pending if all(i in available for i in n.input)]
        if not ready:
            raise RuntimeError("graph has a cycle after Q/DQ insertion")
        ready_ids = {id(n) for n in ready}
        for n in ready:
            ordered.append(n)
            available.update(n.output)
        pending = [n for n in pending if id(n) not in ready_ids]
    return ordered
