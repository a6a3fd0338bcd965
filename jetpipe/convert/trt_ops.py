"""Ops TensorRT's ONNX parser cannot build, caught before the build starts.

A conservative list (`tensorrt=False` in jetpipe.convert.ops, from onnx-tensorrt's
operator matrix). Anything outside the default ONNX domain needs a plugin. The
parser itself remains the final word.
"""

from __future__ import annotations

import onnx

from jetpipe.convert.ops import policy
from jetpipe.errors import ModelError


def unsupported_nodes(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(node name, op) of every node TensorRT cannot build."""
    return [(n.name or "<unnamed>", f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx")
             else n.op_type)
            for n in model.graph.node
            if not policy(n.op_type).tensorrt or n.domain not in ("", "ai.onnx")]


def check_tensorrt_ops(model: onnx.ModelProto) -> None:
    found = unsupported_nodes(model)
    if found:
        name, op = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ModelError(f"node {name!r} uses {op}, which TensorRT cannot build{more}: re-export the "
                         "model without it, or convert with --engine never to run it in ONNX Runtime only")
