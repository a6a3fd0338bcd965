"""Parameters and FLOPs per layer (Conv, ConvTranspose, Gemm, MatMul), from static shapes.

FLOPs count a multiply-add as 2. Used in manifests and on the console so that
pruning and sparsity steps report what they removed.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from jetpipe.convert.graph import GraphIndex, expose_outputs
from jetpipe.convert.ops import policy
from jetpipe.runtime.sessions import cpu_session


def _shapes(model: onnx.ModelProto, size_hw=None) -> dict[str, tuple]:
    dims = model.graph.input[0].type.tensor_type.shape.dim
    if size_hw is not None and any(not d.HasField("dim_value") for d in dims[2:]):
        return _measured_shapes(model, size_hw)
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for v in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]:
        dims = v.type.tensor_type.shape.dim
        shapes[v.name] = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims)  # batch 1
    return shapes


def _measured_shapes(model: onnx.ModelProto, size_hw) -> dict[str, tuple]:
    """Shapes of the compute nodes' tensors from one run at `size_hw` (a dynamic input size, such as a width
    range, leaves shape inference with expressions it cannot always carry through Shape -> Reshape)."""
    names = list(dict.fromkeys(t for n in model.graph.node if policy(n.op_type).weights is not None
                               for t in (n.input[0], n.output[0])))
    x = model.graph.input[0]
    sample = np.zeros((1, x.type.tensor_type.shape.dim[1].dim_value, *size_hw), np.float32)
    values = cpu_session(expose_outputs(model, names)).run(names, {x.name: sample})
    return {name: value.shape for name, value in zip(names, values)}


def largest_activation_bytes(model: onnx.ModelProto) -> int:
    """The largest tensor one sample makes as it runs (batch 1), from static shape inference; 0 where the
    shapes are not static enough to say."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 -- an estimate: a graph inference cannot take is run as it is
        return 0
    largest = 0
    for v in [*inferred.graph.value_info, *inferred.graph.output]:
        kind = v.type.tensor_type
        if not kind.HasField("shape") or not kind.elem_type:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else 1 for d in kind.shape.dim]
        size = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(kind.elem_type)).itemsize
        largest = max(largest, int(np.prod(dims, dtype=np.int64)) * size)
    return largest


def layer_costs(model: onnx.ModelProto, size_hw: tuple[int, int] | None = None) -> list[dict]:
    """Per compute node: weight parameters (non-zero and total) and FLOPs for one sample (of `size_hw`,
    where the input's height or width is dynamic)."""
    inits = GraphIndex(model.graph).initializers
    shapes = _shapes(model, size_hw)
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
