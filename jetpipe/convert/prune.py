"""Structured channel pruning on ONNX: remove whole output channels of Conv layers.

Channel spaces are followed through the graph: a Conv (group 1) creates one;
channel-wise ops (activations, per-channel constants, pooling, Resize) pass it
on; a binary op between two activations (a residual Add, an SE block's Mul)
makes both sides one group that must be pruned alike; a depthwise Conv slices
its weights and passes the space on; a group-1 Conv consumes it (its input
channels are sliced). A space that reaches anything else (Concat, Reshape,
Gemm, a graph output...) is left alone, and the report says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from jetpipe.convert.graph import clone
from jetpipe.errors import ModelError

PASS_THROUGH = {"Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "LeakyRelu", "Tanh", "Elu", "Selu",
                "Softplus", "Identity", "Resize", "Upsample", "MaxPool", "AveragePool", "GlobalAveragePool",
                "GlobalMaxPool", "Pad", "BatchNormalization", "Neg", "Abs"}
BINARY = {"Add", "Mul", "Sub", "Div"}


@dataclass
class Space:
    """One channel space: producers (Conv outputs), channel count, consumers and tensors to slice."""

    channels: int
    producers: list[str] = field(default_factory=list)        # Conv nodes whose output channels these are
    consumers: list[tuple[str, int]] = field(default_factory=list)  # (Conv node, input-channel axis of W)
    depthwise: list[str] = field(default_factory=list)        # depthwise Convs in the space
    constants: list[tuple[str, int]] = field(default_factory=list)  # (initializer, channel axis)
    blocked: str | None = None


class _Groups:
    """Union-find over channel spaces."""

    def __init__(self):
        self.parent: dict[int, int] = {}
        self.spaces: dict[int, Space] = {}

    def new(self, channels: int) -> int:
        key = len(self.parent)
        self.parent[key], self.spaces[key] = key, Space(channels)
        return key

    def find(self, key: int) -> int:
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return ra
        sa, sb = self.spaces[ra], self.spaces.pop(rb)
        self.parent[rb] = ra
        if sa.channels != sb.channels:
            sa.blocked = sa.blocked or f"channel counts {sa.channels} and {sb.channels} meet"
        for name in ("producers", "consumers", "depthwise", "constants"):
            getattr(sa, name).extend(getattr(sb, name))
        sa.blocked = sa.blocked or sb.blocked
        return ra


def _attr(node, name, default):
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def analyse(model: onnx.ModelProto) -> dict[int, Space]:
    """Channel spaces of the graph (root key -> Space)."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    groups, space_of = _Groups(), {}
    outputs = {o.name for o in g.output}
    for node in g.node:
        ins = [i for i in node.input if i]
        acts = [i for i in ins if i not in inits]
        if node.op_type == "Conv" and len(ins) > 1 and ins[1] in inits:
            w = inits[ins[1]]
            k, c = w.dims[0], w.dims[1]
            group = _attr(node, "group", 1)
            src = space_of.get(ins[0])
            if group == 1:
                if src is not None:
                    groups.spaces[groups.find(src)].consumers.append((node.name, 1))
                key = groups.new(k)
                groups.spaces[key].producers.append(node.name)
                space_of[node.output[0]] = key
            elif group == k and c == 1 and src is not None:  # depthwise: same space continues
                root = groups.find(src)
                groups.spaces[root].depthwise.append(node.name)
                space_of[node.output[0]] = root
            else:
                if src is not None:
                    groups.spaces[groups.find(src)].blocked = f"grouped conv {node.name}"
                continue
            continue
        spaces = [space_of[i] for i in acts if i in space_of]
        if not spaces:
            continue
        root = groups.find(spaces[0])
        if node.op_type in PASS_THROUGH or (node.op_type in BINARY and len(acts) <= 2):
            for other in spaces[1:]:
                root = groups.union(root, other)
            if node.op_type in BINARY and len(acts) == 2 and len(spaces) == 1:
                groups.spaces[root].blocked = f"{node.op_type} {node.name} mixes a pruned and an unpruned tensor"
            for name in ins:
                if name in inits:
                    shape = list(inits[name].dims)
                    if len(shape) >= 3 and shape[-3] == groups.spaces[root].channels:
                        groups.spaces[root].constants.append((name, len(shape) - 3))
                    elif np.prod(shape) > 1 and node.op_type != "Resize" and node.op_type != "Pad":
                        if node.op_type == "BatchNormalization":
                            groups.spaces[root].constants.append((name, 0))
                        else:
                            groups.spaces[root].blocked = f"constant {name} of {node.op_type} {node.name}"
            if node.op_type == "GlobalAveragePool" or node.op_type in PASS_THROUGH or node.op_type in BINARY:
                space_of[node.output[0]] = groups.find(root)
        else:
            for s in spaces:
                groups.spaces[groups.find(s)].blocked = f"{node.op_type} {node.name}"
    for name, key in space_of.items():
        if name in outputs:
            groups.spaces[groups.find(key)].blocked = f"graph output {name}"
    uses: dict[str, int] = {}
    for node in g.node:
        for name in node.input:
            if name in inits:
                uses[name] = uses.get(name, 0) + 1
    spaces = {k: groups.spaces[k] for k in {groups.find(k) for k in groups.spaces}}
    for space in spaces.values():
        space.constants = list(dict.fromkeys(space.constants))  # one slice per tensor
        names = [convs_w for convs_w in _weights_of(space, g)] + [c for c, _ in space.constants]
        shared = [n for n in names if uses.get(n, 0) > 1]
        if shared:
            space.blocked = space.blocked or f"initializer {shared[0]} is shared by several nodes"
    return spaces


def _weights_of(space: Space, graph) -> list[str]:
    nodes = {n.name: n for n in graph.node}
    names = set(space.producers) | set(space.depthwise) | {c for c, _ in space.consumers}
    return [i for n in names for i in nodes[n].input[1:3] if i]


def _importance_l1(space: Space, weights: dict[str, np.ndarray], convs: dict[str, onnx.NodeProto]) -> np.ndarray:
    score = np.zeros(space.channels)
    for name in space.producers:
        w = weights[convs[name].input[1]]
        per = np.abs(w).reshape(w.shape[0], -1).sum(axis=1)
        score += per / max(per.mean(), 1e-12)  # producers weigh alike
    return score


METHODS = ("l1", "reconstruct")


def prune(model: onnx.ModelProto, ratio: float, method: str = "l1", exclude: set[str] = frozenset(),
          min_channels: int = 8, samples: np.ndarray | None = None,
          input_name: str | None = None) -> tuple[onnx.ModelProto, dict]:
    """Remove `ratio` of the channels of every prunable space; returns (model, report).

    l1: rank by weight L1 norm. reconstruct: rank by what each channel feeds its consumers on the
    calibration `samples`, then refit each consumer by least squares so its output is preserved."""
    if not 0 < ratio < 1:
        raise ModelError(f"--prune {ratio}: the ratio must be between 0 and 1 (exclusive), e.g. 0.3")
    if method not in METHODS:
        raise ModelError(f"--prune-method {method!r}: choose one of {', '.join(METHODS)}")
    if method == "reconstruct" and samples is None:
        raise ModelError("--prune-method reconstruct needs calibration data: pass --calib")
    original = model
    model = clone(model)
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    weights = {name: numpy_helper.to_array(t) for name, t in inits.items()}
    convs = {n.name: n for n in g.node if n.op_type == "Conv"}
    report = {"pruned": {}, "skipped": {}}
    spaces = analyse(model)
    acts = None
    if method == "reconstruct":
        inputs = sorted({convs[c].input[0] for s in spaces.values() for c, _ in s.consumers})
        acts = _activations(original, inputs, samples, input_name)
    keeps: dict[int, np.ndarray] = {}
    for key, space in spaces.items():
        label = ",".join(space.producers) or "?"
        if space.blocked or not space.producers:
            report["skipped"][label] = space.blocked or "no producer"
            continue
        if set(space.producers) & set(exclude) or space.channels < min_channels:
            report["skipped"][label] = "excluded" if set(space.producers) & set(exclude) else \
                f"{space.channels} channels (< {min_channels})"
            continue
        drop = math.floor(space.channels * ratio)
        if drop == 0:
            continue
        importance = (_importance_l1(space, weights, convs) if acts is None
                      else _importance_activations(space, weights, convs, acts))
        keep = np.sort(np.argsort(-importance)[: space.channels - drop])
        keeps[key] = keep
        _slice_space(space, keep, weights, convs)
        report["pruned"][label] = {"channels": space.channels, "kept": int(len(keep))}
    for name, array in weights.items():
        inits[name].CopyFrom(numpy_helper.from_array(array, name))
    for node in g.node:  # depthwise group counts follow their channels
        if node.op_type == "Conv" and _attr(node, "group", 1) > 1:
            k = weights[node.input[1]].shape[0]
            for a in node.attribute:
                if a.name == "group":
                    a.i = k
    del g.value_info[:]
    if not report["pruned"]:
        reasons = "; ".join(f"{k}: {v}" for k, v in list(report["skipped"].items())[:3])
        raise ModelError(f"--prune: nothing in this model can be pruned safely ({reasons})")
    model = onnx.shape_inference.infer_shapes(model)
    if method == "reconstruct":
        model = _reconstruct(original, model, spaces, keeps, acts, samples, input_name)
        report["refit"] = sorted({c for k in keeps for c, _ in spaces[k].consumers})
    return model, report


def _reconstruct(original, model, spaces, keeps, acts, samples, input_name) -> onnx.ModelProto:
    """Refit every consumer of a pruned space, in graph order, on the pruned model's own inputs."""
    rng = np.random.default_rng(0)
    old = {t.name: numpy_helper.to_array(t) for t in original.graph.initializer}
    keep_in = {c: keeps[k] for k in keeps for c, _ in spaces[k].consumers}
    keep_out = {p: keeps[k] for k in keeps for p in spaces[k].producers}
    for node in list(model.graph.node):
        if node.name not in keep_in:
            continue
        x_new = _activations(model, [node.input[0]], samples, input_name)[node.input[0]]
        w_old = old[node.input[1]]
        b_old = old[node.input[2]] if len(node.input) > 2 and node.input[2] else None
        out = keep_out.get(node.name, np.arange(w_old.shape[0]))
        w_new, b_new = _refit(node, w_old, b_old, acts[node.input[0]], x_new, keep_in[node.name], out, rng)
        _set_weights(model, node, w_new, b_new)
    return model


def _set_weights(model, node, w, b) -> None:
    inits = {t.name: t for t in model.graph.initializer}
    inits[node.input[1]].CopyFrom(numpy_helper.from_array(w, node.input[1]))
    if len(node.input) > 2 and node.input[2]:
        inits[node.input[2]].CopyFrom(numpy_helper.from_array(b, node.input[2]))
    else:
        name = f"{node.input[1]}__bias"
        model.graph.initializer.append(numpy_helper.from_array(b, name))
        if len(node.input) == 2:
            node.input.append(name)
        else:
            node.input[2] = name


def _slice_space(space: Space, keep, weights, convs) -> None:
    for name in space.producers:
        node = convs[name]
        weights[node.input[1]] = weights[node.input[1]][keep]
        if len(node.input) > 2 and node.input[2] in weights:
            weights[node.input[2]] = weights[node.input[2]][keep]
    for name in space.depthwise:
        node = convs[name]
        weights[node.input[1]] = weights[node.input[1]][keep]
        if len(node.input) > 2 and node.input[2] in weights:
            weights[node.input[2]] = weights[node.input[2]][keep]
    for name, axis in space.consumers:
        w = convs[name].input[1]
        weights[w] = np.take(weights[w], keep, axis=axis)
    for name, axis in space.constants:
        weights[name] = np.take(weights[name], keep, axis=axis)


# --- reconstruct: activation-based ranking and least-squares refit of the consumers ------------------

def _activations(model: onnx.ModelProto, names: list[str], samples: np.ndarray, input_name: str) -> dict:
    from jetpipe.convert.graph import expose_outputs
    from jetpipe.convert.ort import cpu_session

    session = cpu_session(expose_outputs(model, names), optimize=False)
    return dict(zip(names, session.run(names, {input_name: samples})))


def _importance_activations(space: Space, weights, convs, acts) -> np.ndarray:
    """How much each channel feeds the consumers: mean |x_c| x ||W[:, c]||, summed over consumers."""
    score = np.zeros(space.channels)
    for name, axis in space.consumers:
        node = convs[name]
        x = np.abs(acts[node.input[0]]).mean(axis=(0, 2, 3))
        w = np.linalg.norm(np.moveaxis(weights[node.input[1]], axis, 0).reshape(space.channels, -1), axis=1)
        score += x * w / max(float((x * w).mean()), 1e-12)
    return score


def _patches(x: np.ndarray, node, kernel, positions) -> np.ndarray:
    """im2col at sampled output positions: (P, C*kh*kw) in the weight's (c, ky, kx) order."""
    kh, kw = kernel
    strides = _attr(node, "strides", [1, 1])
    pads = _attr(node, "pads", [0, 0, 0, 0])
    dil = _attr(node, "dilations", [1, 1])
    padded = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    n, oy, ox = positions
    cols = [padded[n, :, oy * strides[0] + ky * dil[0], ox * strides[1] + kx * dil[1]]
            for ky in range(kh) for kx in range(kw)]
    return np.stack(cols, axis=2).reshape(len(n), -1)


def _refit(node, w_old, b_old, x_old, x_new, keep_in, keep_out, rng, max_positions=8192):
    """W', b' minimising ||conv(x_new, W') + b' - conv(x_old, W_old)|| on sampled positions (ridge)."""
    k, _, kh, kw = w_old.shape
    strides = _attr(node, "strides", [1, 1])
    pads = _attr(node, "pads", [0, 0, 0, 0])
    dil = _attr(node, "dilations", [1, 1])
    out_h = (x_old.shape[2] + pads[0] + pads[2] - dil[0] * (kh - 1) - 1) // strides[0] + 1
    out_w = (x_old.shape[3] + pads[1] + pads[3] - dil[1] * (kw - 1) - 1) // strides[1] + 1
    total = x_old.shape[0] * out_h * out_w
    pick = rng.choice(total, size=min(total, max_positions), replace=False)
    positions = np.unravel_index(pick, (x_old.shape[0], out_h, out_w))
    target = _patches(x_old, node, (kh, kw), positions) @ w_old.reshape(k, -1).T + (b_old if b_old is not None else 0)
    target = target[:, keep_out]
    assert x_new.shape[1] == len(keep_in), (x_new.shape, len(keep_in))
    a = _patches(x_new, node, (kh, kw), positions)
    a = np.concatenate([a, np.ones((len(a), 1), a.dtype)], axis=1).astype(np.float64)
    gram = a.T @ a
    gram += np.eye(len(gram)) * 1e-4 * np.trace(gram) / len(gram)
    solution = np.linalg.solve(gram, a.T @ target.astype(np.float64))
    w_new = solution[:-1].T.reshape(len(keep_out), len(keep_in), kh, kw).astype(np.float32)
    return w_new, solution[-1].astype(np.float32)
