"""Per-layer error localisation: which layers of the processed graph add error, by name.

Each node's *local* error is measured: the part of the processed graph that
computes the node's outputs from its inputs (the node plus any Q/DQ or Cast
nodes inserted around it) is extracted and fed the FP32 reference's own input
values, and its outputs are compared with the reference's. Upstream error is
thereby excluded; the accumulated error at each tensor is reported beside it.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx

from jetpipe.convert.graph import expose_outputs
from jetpipe.runtime.sessions import ort_session

log = logging.getLogger(__name__)
FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)


def _types(model: onnx.ModelProto) -> dict[str, int]:
    return {v.name: v.type.tensor_type.elem_type for v in [*model.graph.value_info, *model.graph.output,
                                                          *model.graph.input]}


def _float_tensors(model: onnx.ModelProto) -> set[str]:
    typed = _types(model)
    return {o for n in model.graph.node for o in n.output if typed.get(o) in FLOATS}


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-12))


def localise(reference: onnx.ModelProto, processed: onnx.ModelProto, inputs: np.ndarray, input_name: str,
             provider: str = "cpu", top: int = 20) -> list[dict]:
    """Nodes ranked by the error they add themselves (relative L2 of their outputs)."""
    from onnx.utils import Extractor


    processed = onnx.shape_inference.infer_shapes(processed)
    shared = sorted(_float_tensors(reference) & _float_tensors(processed))

    def values(model):
        return dict(zip(shared, ort_session(expose_outputs(model, shared), provider).run(shared, {input_name: inputs})))

    ref_values, out_values = values(reference), values(processed)
    # pruned tensors have fewer channels than their FP32 namesakes: only like-shaped ones compare
    comparable = {n for n in shared if ref_values[n].shape == out_values[n].shape}
    ref_values[input_name] = inputs
    processed_types = _types(processed)
    extractor = Extractor(processed)
    ranked = []
    for node in reference.graph.node:
        outs = [o for o in node.output if o in comparable]
        ins = [i for i in node.input if i in comparable or i == input_name]
        if not outs or not ins:
            continue
        try:
            local = extractor.extract_model(ins, outs)
            feeds = {i: ref_values[i].astype(onnx.helper.tensor_dtype_to_np_dtype(processed_types.get(i, 1)))
                     for i in ins}
            got = ort_session(local, provider).run(outs, feeds)
        except Exception as exc:  # a node the extractor cannot isolate: skip it, say so at debug level
            log.debug("no local error for %s: %s", node.name, exc)
            continue
        ranked.append({"node": node.name, "op": node.op_type,
                       "added_error": max(_relative(ref_values[o], g) for o, g in zip(outs, got)),
                       "output_error": max(_relative(ref_values[o], out_values[o]) for o in outs)})
    ranked.sort(key=lambda r: -r["added_error"])
    return ranked[:top]
