"""Structured channel pruning on ONNX: remove whole output channels of Conv layers.

Channel spaces are followed through the graph: a Conv (group 1) creates one;
channel-wise ops (activations, per-channel constants, pooling, Resize) pass it
on; a binary op between two activations (a residual Add, an SE block's Mul)
makes both sides one group that must be pruned alike; a depthwise Conv slices
its weights and passes the space on; a group-1 Conv consumes it (its input
channels are sliced). A space that reaches anything else (Concat, Reshape,
Gemm, a graph output...) is left alone, and the report says why.

How many channels each group keeps: prune_alloc (a FLOPs target, uniform or by
measured sensitivity). Which ones, and the refit: prune_refit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from jetpipe.convert import flops, prune_alloc
from jetpipe.convert import prune_refit as refit
from jetpipe.convert.graph import GraphIndex, attribute, clone
from jetpipe.convert.ops import policy
from jetpipe.errors import ModelError
from jetpipe.progress import silent

log = logging.getLogger(__name__)

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


def analyse(model: onnx.ModelProto) -> dict[int, Space]:
    """Channel spaces of the graph (root key -> Space)."""
    walk = _ChannelWalk(GraphIndex(model.graph))
    for node in model.graph.node:
        if node.op_type == "Conv" and len(node.input) > 1 and node.input[1] in walk.index.initializers:
            walk.conv(node)
        else:
            walk.other(node)
    return walk.finish()


class _ChannelWalk:
    """Follows channel spaces through the graph in topological order (see the module docstring)."""

    def __init__(self, index: GraphIndex):
        self.index, self.groups = index, _Groups()
        self.space_of: dict[str, int] = {}  # tensor -> key of the space its channels belong to

    def space(self, key: int) -> Space:
        return self.groups.spaces[self.groups.find(key)]

    def conv(self, node: onnx.NodeProto) -> None:
        k, c = self.index.initializers[node.input[1]].dims[:2]
        group = attribute(node, "group", 1)
        src = self.space_of.get(node.input[0])
        if group == 1:
            if src is not None:
                self.space(src).consumers.append((node.name, 1))
            key = self.groups.new(k)
            self.groups.spaces[key].producers.append(node.name)
            self.space_of[node.output[0]] = key
        elif group == k and c == 1 and src is not None:  # depthwise: the same space continues
            self.space(src).depthwise.append(node.name)
            self.space_of[node.output[0]] = self.groups.find(src)
        elif src is not None:
            self.space(src).blocked = f"grouped conv {node.name}"

    def other(self, node: onnx.NodeProto) -> None:
        inputs = [i for i in node.input if i]
        acts = [i for i in inputs if i not in self.index.initializers]
        keys = [self.space_of[i] for i in acts if i in self.space_of]
        if not keys:
            return
        rule = policy(node.op_type)
        if not (rule.channelwise or (rule.elementwise and len(acts) <= 2)):
            for key in keys:
                self.space(key).blocked = f"{node.op_type} {node.name}"
            return
        root = keys[0]
        for other in keys[1:]:
            root = self.groups.union(self.groups.find(root), other)
        space = self.space(root)
        if rule.elementwise and len(acts) == 2 and len(keys) == 1:
            space.blocked = f"{node.op_type} {node.name} mixes a pruned and an unpruned tensor"
        for name in inputs:
            if name in self.index.initializers:
                self._constant(node, name, space)
        self.space_of[node.output[0]] = self.groups.find(root)

    def _constant(self, node: onnx.NodeProto, name: str, space: Space) -> None:
        """A constant operand of a channel-wise op: sliced with the space, or it blocks it."""
        shape = list(self.index.initializers[name].dims)
        if len(shape) >= 3 and shape[-3] == space.channels:
            space.constants.append((name, len(shape) - 3))
        elif np.prod(shape) <= 1 or node.op_type in ("Resize", "Pad"):
            return  # a scalar, or sizes and scales rather than per-channel values
        elif node.op_type == "BatchNormalization":
            space.constants.append((name, 0))
        else:
            space.blocked = f"constant {name} of {node.op_type} {node.name}"

    def finish(self) -> dict[int, Space]:
        for name, key in self.space_of.items():
            if name in self.index.outputs:
                self.space(key).blocked = f"graph output {name}"
        spaces = {k: self.groups.spaces[k] for k in {self.groups.find(k) for k in self.groups.spaces}}
        for space in spaces.values():
            space.constants = list(dict.fromkeys(space.constants))  # one slice per tensor
            names = _weights_of(space, self.index) + [c for c, _ in space.constants]
            shared = [n for n in names if self.index.uses(n) > 1]
            if shared:
                space.blocked = space.blocked or f"initializer {shared[0]} is shared by several nodes"
        return spaces


def _weights_of(space: Space, index: GraphIndex) -> list[str]:
    names = set(space.producers) | set(space.depthwise) | {c for c, _ in space.consumers}
    return [i for n in names for i in index.nodes[n].input[1:3] if i]


def _importance_l1(space: Space, weights: dict[str, np.ndarray], convs: dict[str, onnx.NodeProto]) -> np.ndarray:
    score = np.zeros(space.channels)
    for name in space.producers:
        w = weights[convs[name].input[1]]
        per = np.abs(w).reshape(w.shape[0], -1).sum(axis=1)
        score += per / max(per.mean(), 1e-12)  # producers weigh alike
    return score


METHODS = ("l1", "reconstruct")
ALLOCATIONS = ("uniform", "sensitivity")


def prune(model: onnx.ModelProto, ratio: float, method: str = "l1", exclude: set[str] = frozenset(),
          min_channels: int = 8, samples: np.ndarray | None = None, input_name: str | None = None,
          align: int = 8, allocation: str | None = None, max_share: float = 0.75,
          progress=silent) -> tuple[onnx.ModelProto, dict]:
    """Remove `ratio` of the model's FLOPs by removing whole channels; returns (model, report).

    l1: rank by weight L1 norm. reconstruct: choose the channels the consumers can best do without on
    the calibration `samples` (least squares), then refit each consumer so its output is preserved.
    allocation (how many channels each group keeps): uniform (default for l1) or sensitivity
    (measured on `samples`, default for reconstruct); see prune_alloc.
    progress(total, what, unit): a bar for each long step (jetpipe.progress.bar)."""
    allocation = allocation or ("sensitivity" if method == "reconstruct" else "uniform")
    _check_arguments(ratio, method, allocation, samples, align)
    spaces = analyse(model)
    options, skipped = _options(spaces, set(exclude), min_channels, align, max_share)
    if not options:
        reasons = "; ".join(f"{k}: {v}" for k, v in list(skipped.items())[:3])
        raise ModelError(f"--prune: nothing in this model can be pruned safely ({reasons})")
    index = GraphIndex(model.graph)
    weights = {name: index.weight(name) for name in index.initializers}
    convs = index.of_type("Conv")
    acts = None
    if method == "reconstruct":
        names = sorted({convs[c].input[0] for key in options for c, _ in spaces[key].consumers})
        acts = refit.activations(model, names, samples, input_name)
    ranking = {}
    steps = progress(len(options), "pruning: ranking channels", "group")
    for key in options:
        ranking[key] = _ranking(spaces[key], weights, convs, acts, options[key][-1])
        steps.update(1)
    steps.close()
    flop_model = _flop_model(model, spaces, options)
    errors = None
    if allocation == "uniform":
        kept = prune_alloc.uniform(flop_model, options, ratio)
    else:
        steps = progress(sum(len(prune_alloc.probe_points(ks)) for ks in options.values()),
                         "pruning: sensitivity", "probe")
        errors = _sensitivity(model, spaces, options, ranking, weights, acts, samples, input_name, steps)
        steps.close()
        kept = prune_alloc.greedy(flop_model, options, errors, ratio)
    keeps = {key: np.sort(ranking[key][:k]) for key, k in kept.items() if k < spaces[key].channels}
    pruned = apply(model, spaces, keeps)
    if method == "reconstruct":
        steps = progress(len({c for k in keeps for c, _ in spaces[k].consumers}), "pruning: refit", "layer")
        pruned = refit.reconstruct(weights, pruned, spaces, keeps, acts, samples, input_name, steps)
        steps.close()
    return pruned, _report(spaces, options, kept, skipped, errors, ratio, allocation, align, method, keeps)


def _ranking(space, weights, convs, acts, keep_at_least) -> np.ndarray:
    """Channel indices, most important first."""
    if acts is None:
        return np.argsort(-_importance_l1(space, weights, convs), kind="stable")
    return refit.obs_ranking(space, weights, convs, acts, keep_at_least, np.random.default_rng(0))


def _check_arguments(ratio, method, allocation, samples, align) -> None:
    if not 0 < ratio < 1:
        raise ModelError(f"--prune {ratio}: the ratio (share of FLOPs to remove) must be between 0 and 1 "
                         f"(exclusive), e.g. 0.2")
    if method not in METHODS:
        raise ModelError(f"--prune-method {method!r}: choose one of {', '.join(METHODS)}")
    if allocation not in ALLOCATIONS:
        raise ModelError(f"--prune-allocation {allocation!r}: choose one of {', '.join(ALLOCATIONS)}")
    if samples is None and (method == "reconstruct" or allocation == "sensitivity"):
        raise ModelError(f"--prune-method {method} with {allocation} allocation needs calibration data: "
                         f"pass --calib")
    if align < 1:
        raise ModelError(f"--prune-align {align}: must be 1 (any count) or more, e.g. 8")


def _label(space: Space) -> str:
    return ",".join(space.producers) or "?"


def _options(spaces, exclude, min_channels, align, max_share) -> tuple[dict, dict]:
    """Kept-count options of every prunable group, and why the others are left alone."""
    options, skipped = {}, {}
    for key, space in spaces.items():
        if space.blocked or not space.producers:
            skipped[_label(space)] = space.blocked or "no producer"
        elif set(space.producers) & exclude:
            skipped[_label(space)] = "excluded"
        elif space.channels < min_channels:
            skipped[_label(space)] = f"{space.channels} channels (< {min_channels})"
        else:
            ks = prune_alloc.candidates(space.channels, align, min_channels, max_share)
            if len(ks) > 1:
                options[key] = ks
            else:
                skipped[_label(space)] = f"{space.channels} channels: no smaller multiple of {align} " \
                                         f"(>= {min_channels})"
    return options, skipped


def _flop_model(model, spaces, options) -> prune_alloc.FlopModel:
    out_group, in_group = {}, {}
    for key in options:
        for name in [*spaces[key].producers, *spaces[key].depthwise]:
            out_group[name] = key
        for name, _ in spaces[key].consumers:
            in_group[name] = key
    layers = [(row["flops"], out_group.get(row["node"]), in_group.get(row["node"]))
              for row in flops.layer_costs(model)]
    return prune_alloc.FlopModel(layers, {key: spaces[key].channels for key in options})


def _sensitivity(model, spaces, options, ranking, weights, acts, samples, input_name, steps) -> dict:
    """Output error with one group alone pruned to each probe count (its consumers refit when acts are given)."""
    reference = refit.outputs(model, samples, input_name)
    rng = np.random.default_rng(0)
    errors = {}
    for key, ks in options.items():
        space, errors[key] = spaces[key], {}
        for k in prune_alloc.probe_points(ks):
            keep = np.sort(ranking[key][:k])
            candidate = apply(model, spaces, {key: keep})
            if acts is not None:
                nodes = GraphIndex(candidate.graph).nodes
                keep_out = {p: keep for p in space.producers}
                for name, _ in space.consumers:
                    x = acts[nodes[name].input[0]]
                    refit.refit_node(candidate, nodes[name], weights, x, x[:, keep], keep, keep_out, rng)
            errors[key][k] = refit.normalized_mse(reference, refit.outputs(candidate, samples, input_name))
            steps.update(1)
        log.debug("sensitivity %s: %s", _label(space), errors[key])
    return errors


def apply(model: onnx.ModelProto, spaces: dict, keeps: dict) -> onnx.ModelProto:
    """A copy of `model` with each group in `keeps` cut to those channel indices."""
    model = clone(model)
    g, index = model.graph, GraphIndex(model.graph)
    weights = {name: index.weight(name) for name in index.initializers}
    convs = index.of_type("Conv")
    changed = set()
    for key, keep in keeps.items():
        changed |= _slice_space(spaces[key], keep, weights, convs)
    for name in changed:
        index.initializers[name].CopyFrom(numpy_helper.from_array(weights[name], name))
    for node in g.node:  # depthwise group counts follow their channels
        if node.op_type == "Conv" and attribute(node, "group", 1) > 1:
            k = weights[node.input[1]].shape[0]
            for a in node.attribute:
                if a.name == "group":
                    a.i = k
    del g.value_info[:]
    return onnx.shape_inference.infer_shapes(model)


def _report(spaces, options, kept, skipped, errors, ratio, allocation, align, method, keeps) -> dict:
    report = {"target_flops_share": ratio, "allocation": allocation, "align": align, "pruned": {},
              "unchanged": {}, "skipped": skipped}
    for key in options:
        entry = {"channels": spaces[key].channels, "kept": int(kept[key])}
        if errors is not None:
            entry["sensitivity"] = {str(k): round(v, 6) for k, v in errors[key].items()}
        report["pruned" if key in keeps else "unchanged"][_label(spaces[key])] = entry
    if method == "reconstruct":
        report["refit"] = sorted({c for k in keeps for c, _ in spaces[k].consumers})
    return report


def _slice_space(space: Space, keep, weights, convs) -> set[str]:
    """Cut every tensor of the group to the `keep` channels; returns the initializer names changed."""
    changed = set()
    for name in [*space.producers, *space.depthwise]:
        node = convs[name]
        for tensor in node.input[1:3]:
            if tensor in weights:
                weights[tensor] = weights[tensor][keep]
                changed.add(tensor)
    for tensor, axis in [(convs[name].input[1], axis) for name, axis in space.consumers] + space.constants:
        weights[tensor] = np.take(weights[tensor], keep, axis=axis)
        changed.add(tensor)
    return changed
