"""The batch axis of a batch-1 export: free the literal 1s its graph bakes in, and prove the result.

The default export of the common detector families (Ultralytics YOLOv8 `export(format='onnx')`,
YOLOX) is static batch 1 and writes that 1 into Reshape targets, e.g. `[1, 4, 16, 8400]` in the
DFL head. Such a target's leading 1 can become -1 (the size is inferred) or 0 (copied from the
input's axis 0); whether the model then batches is not assumed but proved: batch N must give the
same outputs as N batch-1 runs. When it does not, the node that drops the batch is named.
Time-major outputs ([T, N, C], CRNN recognizers) batch on axis 1: a Transpose puts it first, as
jetpipe's runtime expects.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import numpy_helper

from jetpipe.convert.graph import (
    GraphIndex,
    attribute,
    clone,
    drop_unused_initializers,
    expose_outputs,
    image_input,
    make_batch_dynamic,
    relative_difference,
    with_shapes,
)
from jetpipe.errors import ModelError
from jetpipe.runtime.sessions import cpu_session

log = logging.getLogger(__name__)

PROOF_BATCH = 3
TOLERANCE = 1e-4  # relative difference between batch-N and batch-1 outputs


def free_batch_literals(model: onnx.ModelProto) -> list[str]:
    """Rewrite the leading 1 of every constant Reshape target to -1 (or 0 where a -1 is already taken);
    returns the Reshape nodes changed. Targets are copied, never edited in place (onnxslim shares equal
    constants between nodes)."""
    index = GraphIndex(model.graph)
    changed, made = [], {}
    for node in model.graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2 or node.input[1] not in index.initializers:
            continue
        target = numpy_helper.to_array(index.initializers[node.input[1]])
        if target.ndim != 1 or target.size < 2 or target[0] != 1:
            continue
        if -1 in target and attribute(node, "allowzero", 0):
            continue  # 0 would mean a zero-sized axis, and a second -1 is illegal
        free = target.copy()
        free[0] = 0 if -1 in target else -1
        name = made.get((node.input[1], int(free[0])))
        if name is None:
            name = f"{node.input[1]}__batch{'_copy' if free[0] == 0 else '_inferred'}"
            model.graph.initializer.append(numpy_helper.from_array(free.astype(target.dtype), name))
            made[(node.input[1], int(free[0]))] = name
        node.input[1] = name
        changed.append(node.name)
    if changed:
        drop_unused_initializers(model.graph)
        _reinfer(model, {o.name for o in model.graph.output})  # declared with the literal batch 1
    return changed


def expand_batch_constants(model: onnx.ModelProto) -> list[str]:
    """Constants with a leading 1 that a Concat joins to the batch along another axis, e.g. a ViT's class token
    [1, 1, D] beside its patch tokens [N, P, D] (torch's dynamo exporter folds the token's expand to batch 1
    into the constant): each is expanded to the batch of the Concat's first computed input, so batch N joins.
    Returns the Concat nodes changed."""
    index = GraphIndex(model.graph)
    changed, nodes = [], []
    for node in model.graph.node:
        computed = next((i for i in node.input if i and i not in index.initializers), None)
        if node.op_type == "Concat" and computed is not None:
            for k, name in enumerate(node.input):
                dims = list(index.initializers[name].dims) if name in index.initializers else []
                if len(dims) >= 2 and dims[0] == 1 and attribute(node, "axis", 0) % len(dims) != 0:
                    nodes += _expanded_to_batch(model, node, k, computed, dims)
                    changed.append(node.name)
        nodes.append(node)
    if changed:
        model.graph.ClearField("node")
        model.graph.node.extend(nodes)  # each expansion just before its Concat: the order stays topological
        _reinfer(model, {o.name for o in model.graph.output})
    return sorted(set(changed))


def _expanded_to_batch(model: onnx.ModelProto, concat: onnx.NodeProto, k: int, batched: str,
                       dims: list[int]) -> list[onnx.NodeProto]:
    """Nodes that expand the Concat's k-th input (a constant of `dims`) to [batch of `batched`, *dims[1:]]."""
    stem = f"{concat.name or concat.output[0]}__input{k}"
    model.graph.initializer.extend([numpy_helper.from_array(np.array([0], np.int64), f"{stem}__axis0"),
                                    numpy_helper.from_array(np.array(dims[1:], np.int64), f"{stem}__rest")])
    constant, concat.input[k] = concat.input[k], f"{stem}__batched"
    return [onnx.helper.make_node("Shape", [batched], [f"{stem}__shape"], name=f"{stem}__shape"),
            onnx.helper.make_node("Gather", [f"{stem}__shape", f"{stem}__axis0"], [f"{stem}__batch"],
                                  name=f"{stem}__batch", axis=0),
            onnx.helper.make_node("Concat", [f"{stem}__batch", f"{stem}__rest"], [f"{stem}__target"],
                                  name=f"{stem}__target", axis=0),
            onnx.helper.make_node("Expand", [constant, f"{stem}__target"], [concat.input[k]],
                                  name=f"{stem}__expand")]


def _reinfer(model: onnx.ModelProto, outputs: set[str]) -> None:
    """Shapes inferred again after an edit, the named outputs' declared shapes included."""
    for output in model.graph.output:
        if output.name in outputs:
            output.type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    model.CopyFrom(with_shapes(model))


def output_batch_axes(model: onnx.ModelProto, sample: np.ndarray,
                      batch: int = PROOF_BATCH) -> tuple[dict[str, tuple[int | None, int]], str | None]:
    """({output: (the axis that carries the batch, rank)}, why a batch does not run). The axis is the one of
    size 1 for one sample and `batch` for `batch` samples, every other axis unchanged: 0 for most
    models, 1 for a time-major recognizer ([T, N, C]); None where no axis does."""
    name, stacked = image_input(model).name, _stacked(sample, batch)
    try:
        session = cpu_session(model, quiet=True)
        many = session.run(None, {name: stacked})
        one = session.run(None, {name: stacked[:1]})
    except Exception as exc:  # ONNX Runtime names the node it failed in
        return {}, str(exc).splitlines()[0][:240]
    axes = {o.name: (_scaling_axis(a.shape, b.shape, batch), b.ndim) for o, a, b in zip(model.graph.output, one, many)}
    problem = next((f"output {o.name} has shape {list(b.shape)} for a batch of {batch}"
                    for o, b in zip(model.graph.output, many) if axes[o.name][0] is None), None)
    return axes, problem


def _scaling_axis(one: tuple, many: tuple, batch: int) -> int | None:
    if len(one) != len(many):
        return None
    return next((k for k in range(len(one)) if one[k] == 1 and many[k] == batch
                 and all(one[j] == many[j] for j in range(len(one)) if j != k)), None)


def move_batch_to_front(model: onnx.ModelProto, axes: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Put each output's batch axis first with a Transpose (the output keeps its name: the runtime
    batches on axis 0); axes: {output: (batch axis, rank)}; returns {output: the axis it was on}."""
    moved = {name: axis for name, (axis, _) in axes.items() if axis}
    for name, axis in moved.items():
        inner = f"{name}__batch_on_axis{axis}"
        for node in model.graph.node:
            node.output[:] = [inner if o == name else o for o in node.output]
            node.input[:] = [inner if i == name else i for i in node.input]
        perm = [axis, *[k for k in range(axes[name][1]) if k != axis]]
        model.graph.node.append(onnx.helper.make_node("Transpose", [inner], [name], name=f"{name}__batch_first",
                                                      perm=perm))
    if moved:
        _reinfer(model, set(moved))
    return moved


def batch_layout(model: onnx.ModelProto, sample: np.ndarray, made_dynamic: bool) -> dict:
    """Make a model batch on axis 0 of every output, changing `model` in place: a batch-1 export made
    dynamic gets its literal batch 1s freed where it does not run at batch N, and time-major outputs
    get their batch axis moved first. Refuses (naming the node) what cannot batch."""
    axes, rewritten, expanded = _batching_axes(model, sample, made_dynamic)
    moved = move_batch_to_front(model, axes)
    batch_name = image_input(model).dims[0]
    for output in model.graph.output:  # shown above: axis 0 of every output is the batch; name it so
        dims = output.type.tensor_type.shape.dim
        if dims and isinstance(batch_name, str):
            dims[0].dim_param = batch_name
    if moved:
        _announce_moved(moved)
    return {"rewritten_reshapes": rewritten, "expanded_concats": expanded, "moved_batch_axes": moved}


def _batching_axes(model: onnx.ModelProto, sample: np.ndarray, made_dynamic: bool,
                   announce: bool = True) -> tuple[dict[str, tuple[int, int]], list[str], list[str]]:
    """({output: (batch axis, rank)}, the Reshapes whose literal batch was freed, the Concats whose constants
    were expanded to the batch; `model` changed in place) for a model that batches; refuses (naming the node)
    one that does not. announce: log the rewrites (not for a probe)."""
    axes, problem = output_batch_axes(model, sample)
    rewritten: list[str] = []
    expanded: list[str] = []
    if problem and made_dynamic:
        candidate = clone(model)
        rewritten = free_batch_literals(candidate)
        if rewritten:
            axes, problem = output_batch_axes(candidate, sample)
        if problem:  # only then: the Reshapes' 1s are all most exports bake in
            expanded = expand_batch_constants(candidate)
            if expanded:
                axes, problem = output_batch_axes(candidate, sample)
        if problem is None and announce:
            _announce_rewrites(rewritten, expanded)
        if problem is None:
            model.CopyFrom(candidate)
    if problem:
        # where ONNX Runtime could not run the batch at all (no axes), its error names the node already; the
        # search would run the model again with every tensor an output, only to fail the same way (4 of the
        # 44 s a torch ViT-B/32 export took to be refused)
        culprit = node_dropping_batch(candidate if rewritten or expanded else model, sample) if axes else None
        tried = f"; {_rewrites(rewritten, expanded)} was not enough" if rewritten or expanded else ""
        exported = "was exported with batch 1 and its graph fixes that size" if made_dynamic else \
            "does not keep the batch in its outputs"
        raise ModelError(f"the model {exported} ({culprit or problem}{tried}); re-export it with a dynamic "
                         "batch axis, or convert with --max-batch 1")
    return axes, rewritten, expanded


def _rewrites(rewritten: list[str], expanded: list[str]) -> str:
    said = [f"rewriting the literal batch in {len(rewritten)} Reshape target(s)"] if rewritten else []
    said += [f"expanding the constants of {len(expanded)} Concat(s) to the batch"] if expanded else []
    return " and ".join(said)


def _announce_rewrites(rewritten: list[str], expanded: list[str]) -> None:
    for what, names in (("the export's literal batch 1 rewritten in %d Reshape target(s): %s", rewritten),
                        ("constants a Concat joins to the batch expanded to it in %d Concat(s): %s", expanded)):
        if names:
            log.info("batch axis: " + what, len(names), ", ".join(names[:5]) + (" ..." if len(names) > 5 else ""))


def _announce_moved(moved: dict[str, int]) -> None:
    log.info("batch axis: output(s) %s carry the batch on another axis (time-major); a Transpose puts it first",
             ", ".join(f"{n} (axis {a})" for n, a in moved.items()))


def batch_one_layout(model: onnx.ModelProto, sample: np.ndarray) -> dict:
    """--max-batch 1 keeps the model's batch as it is, but a time-major output still gets its batch axis
    first (the runtime takes a frame's result from axis 0 of each output). The axis is found on a copy
    made to batch; where the copy cannot batch, nothing is moved (a batch of 1 shows no axis)."""
    probe = clone(model)
    make_batch_dynamic(probe)
    try:
        axes, *_ = _batching_axes(probe, sample, made_dynamic=True, announce=False)
    except ModelError:
        return {}
    moved = move_batch_to_front(model, axes)
    if moved:
        _announce_moved(moved)
    return {"rewritten_reshapes": [], "expanded_concats": [], "moved_batch_axes": moved}


def node_dropping_batch(model: onnx.ModelProto, sample: np.ndarray, batch: int = PROOF_BATCH) -> str | None:
    """The first node whose input carries the batch and whose output does not, e.g.
    "Reshape '/head/Reshape_2' turns [3, 64, 400] into [1, 192, 400]" (None: none found)."""
    names = [o for n in model.graph.node for o in n.output if o]
    try:
        session = cpu_session(expose_outputs(model, names), quiet=True)
        values = dict(zip([o.name for o in session.get_outputs()],
                          session.run(None, {image_input(model).name: _stacked(sample, batch)})))
    except Exception:
        return None
    values[image_input(model).name] = _stacked(sample, batch)
    def batched(name):
        return values[name].ndim > 0 and values[name].shape[0] == batch

    for node in model.graph.node:
        carried = [values[i] for i in node.input if i in values and batched(i)]
        dropped = [values[o] for o in node.output if o in values and not batched(o)]
        if carried and dropped:
            return f"{node.op_type} {node.name!r} turns {list(carried[0].shape)} into {list(dropped[0].shape)}"
    return None


def prove(model: onnx.ModelProto, sample: np.ndarray, batch: int = PROOF_BATCH) -> float:
    """Batch-N outputs must equal N batch-1 outputs; returns the largest relative difference."""
    stacked = _stacked(sample, batch)
    session = cpu_session(model)
    name = image_input(model).name
    together = session.run(None, {name: stacked})
    worst = 0.0
    for i in range(batch):
        for alone, batched in zip(session.run(None, {name: stacked[i:i + 1]}), together):
            worst = max(worst, relative_difference(alone[0], batched[i]))
    return worst


def prove_rows(model: onnx.ModelProto, sample: np.ndarray) -> float:
    """Refuse a model whose batch-N rows differ from batch-1 runs (it mixes samples); returns the
    largest relative difference."""
    worst = prove(model, sample)
    if worst > TOLERANCE:
        raise ModelError(
            f"batching changes the model's results (relative difference {worst:.2e} between "
            "batch-N and batch-1 runs): the graph mixes samples; convert with --max-batch 1")
    return worst


def _stacked(sample: np.ndarray, batch: int) -> np.ndarray:
    """`batch` slightly different copies of the first sample (so that mixing samples shows)."""
    stacked = np.concatenate([sample[:1]] * batch, axis=0)
    return stacked + np.linspace(0, 0.1, batch, dtype=np.float32)[:, None, None, None]
