"""2:4 structured sparsity: in every group of 4 consecutive input channels, keep the 2 largest weights.

This is the pattern TensorRT's sparse tensor cores use (SPARSE_WEIGHTS): along
the input-channel axis of Conv weights (K, C, R, S) and the reduction axis of
Gemm / MatMul weights. Layers that cannot take the pattern are skipped, with
the reason. Accuracy must be measured after it (`jetpipe calibrate accuracy`):
without fine-tuning, 2:4 pruning removes half of each eligible layer's weights.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from jetpipe.convert.graph import clone


def _reduction_axis(node: onnx.NodeProto, weight: np.ndarray) -> tuple[int | None, str]:
    attrs = {a.name: a for a in node.attribute}
    if node.op_type == "Conv":
        group = attrs["group"].i if "group" in attrs else 1
        if group != 1:
            return None, f"grouped/depthwise conv (group {group})"
        return 1, ""
    if node.op_type == "Gemm":
        return (1 if attrs.get("transB") and attrs["transB"].i else 0), ""
    if node.op_type == "MatMul":
        return 0, ""
    return None, "not a Conv/Gemm/MatMul"


def prune_2_4(weight: np.ndarray, axis: int) -> np.ndarray:
    """Zero the 2 smallest |w| of every 4 consecutive entries along `axis` (padding a short tail)."""
    moved = np.moveaxis(weight, axis, -1)
    size = moved.shape[-1]
    pad = (-size) % 4
    padded = np.concatenate([moved, np.zeros((*moved.shape[:-1], pad), moved.dtype)], axis=-1) if pad else moved
    groups = padded.reshape(*padded.shape[:-1], -1, 4)
    order = np.argsort(np.abs(groups), axis=-1)
    mask = np.ones_like(groups, dtype=bool)
    np.put_along_axis(mask, order[..., :2], False, axis=-1)
    pruned = (groups * mask).reshape(padded.shape)[..., :size]
    return np.moveaxis(pruned, -1, axis)


def apply_2_4(model: onnx.ModelProto, exclude: set[str] = frozenset(),
              min_channels: int = 8) -> tuple[onnx.ModelProto, dict[str, str]]:
    """(pruned copy, {node: what happened}) for every Conv/Gemm/MatMul with an initializer weight."""
    out = clone(model)
    inits = {t.name: t for t in out.graph.initializer}
    consumers: dict[str, int] = {}
    for node in out.graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    report = {}
    for node in out.graph.node:
        if node.op_type not in ("Conv", "Gemm", "MatMul") or len(node.input) < 2 or node.input[1] not in inits:
            continue
        if node.name in exclude:
            report[node.name] = "skipped: excluded"
            continue
        tensor = inits[node.input[1]]
        weight = numpy_helper.to_array(tensor)
        axis, why = _reduction_axis(node, weight)
        if axis is None:
            report[node.name] = f"skipped: {why}"
            continue
        if weight.shape[axis] < min_channels:
            report[node.name] = f"skipped: {weight.shape[axis]} input channels (< {min_channels})"
            continue
        if consumers.get(node.input[1], 0) > 1:
            report[node.name] = "skipped: weight shared with another node"
            continue
        tensor.CopyFrom(numpy_helper.from_array(prune_2_4(weight, axis).astype(weight.dtype), tensor.name))
        report[node.name] = "2:4"
    return out, report


def is_2_4(weight: np.ndarray, axis: int) -> bool:
    """Every group of 4 along `axis` has at most 2 non-zeros."""
    moved = np.moveaxis(weight, axis, -1)
    size = moved.shape[-1] - moved.shape[-1] % 4
    groups = moved[..., :size].reshape(*moved.shape[:-1], -1, 4)
    return bool((np.count_nonzero(groups, axis=-1) <= 2).all())
