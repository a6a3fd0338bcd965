"""Parameters and FLOPs per layer (Conv, ConvTranspose, Gemm, MatMul), from static shapes.

FLOPs count a multiply-add as 2. Used in manifests and on the console so that
pruning and sparsity steps report what they removed.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from jetpipe.convert.graph import GraphIndex
from jetpipe.convert.ops import policy


def _shapes(model: onnx.ModelProto) -> dict[str, tuple]:
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for v in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]:
        dims = v.type.tensor_type.shape.dim
        shapes[v.name] = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims)  # batch 1
    return shapes


def layer_costs(model: onnx.ModelProto) -> list[dict]:
    """Per compute node: weight parameters (non-zero and total) and FLOPs for one sample."""
    inits = GraphIndex(model.graph).initializers
    shapes = _shapes(model)
    rows = []
    for node in model.graph.node:
        if policy(node.op_type).weights is None:
            continue
        weight = next((inits[i] for i in node.input[1:2] if i in inits), None)
        if weight is None:
            continue
        w = numpy_helper.to_array(weight)
        out = shapes.get(node.output[0])
        if not out:
            continue
        if node.op_type in ("Conv", "ConvTranspose"):
            spatial = int(np.prod(out[2:])) if node.op_type == "Conv" else int(np.prod(shapes[node.input[0]][2:]))
            flops = 2 * int(w.size) * spatial
        else:
            rows_out = int(np.prod(out[:-1]))
            flops = 2 * int(w.size) * rows_out
        bias = next((inits[i] for i in node.input[2:3] if i in inits), None)
        params = int(w.size) + (int(np.prod(bias.dims)) if bias is not None else 0)
        rows.append({"node": node.name, "op": node.op_type, "weight_shape": list(w.shape), "params": params,
                     "nonzero_weights": int(np.count_nonzero(w)), "flops": flops})
    return rows


def totals(rows: list[dict]) -> dict:
    return {"params": sum(r["params"] for r in rows), "flops": sum(r["flops"] for r in rows),
            "nonzero_weights": sum(r["nonzero_weights"] for r in rows)}
