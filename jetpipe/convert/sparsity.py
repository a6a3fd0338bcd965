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

from jetpipe.convert.graph import GraphIndex, attribute, clone
from jetpipe.convert.ops import policy


def _sparse_axes(op_type: str):
    """The weight axes of an op that can take the 2:4 pattern (Conv, Gemm, MatMul), else None."""
    axes = policy(op_type).weights
    return axes if axes is not None and axes.reduction is not None else None


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
    index = GraphIndex(out.graph)
    inits = index.initializers
    report = {}
    for node in out.graph.node:
        axes = _sparse_axes(node.op_type)
        if axes is None or len(node.input) < 2 or node.input[1] not in inits:
            continue
        if node.name in exclude:
            report[node.name] = "skipped: excluded"
            continue
        tensor = inits[node.input[1]]
        weight = numpy_helper.to_array(tensor)
        axis = axes.reduction(node)
        if axis is None:
            report[node.name] = f"skipped: grouped/depthwise conv (group {attribute(node, 'group', 1)})"
            continue
        if weight.shape[axis] < min_channels:
            report[node.name] = f"skipped: {weight.shape[axis]} input channels (< {min_channels})"
            continue
        if index.uses(node.input[1]) > 1:
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
