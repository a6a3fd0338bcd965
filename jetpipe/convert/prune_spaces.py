"""Channel groups of a graph: which Conv output channels must be pruned together, and what else to cut.

Channel spaces are followed through the graph: a Conv (group 1) creates one;
channel-wise ops (activations, per-channel constants, pooling, Resize) pass it
on; a binary op between two activations (a residual Add, an SE block's Mul)
makes both sides one group that must be pruned alike; a depthwise Conv slices
its weights and passes the space on; a group-1 Conv consumes it (its input
channels are sliced).

A tensor's channels are a *layout*: a list of segments (space, channel count),
so a Concat along channels joins its inputs' layouts and a Split cuts one
(YOLOv8's C2f and SPPF blocks). Where a Split or an Add cuts through the middle
of a space, the Convs producing it are split there into two spaces and the
graph is walked again. A space that reaches anything else (Reshape, Gemm,
Slice, a graph output...) is left alone, and the report says why.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import onnx

from jetpipe.convert.graph import GraphIndex, attribute, clone, opset
from jetpipe.convert.ops import policy

CHANNEL_AXES = (1, -3)  # NCHW


@dataclass
class Space:
    """One channel group: where its channels are produced, read and sliced."""

    channels: int
    producers: list[tuple[str, int]] = field(default_factory=list)  # (Conv, offset among its output channels)
    consumers: list[tuple[str, int]] = field(default_factory=list)  # (Conv, offset among its input channels)
    depthwise: list[tuple[str, int]] = field(default_factory=list)  # (depthwise Conv, offset)
    constants: list[tuple[str, int, int]] = field(default_factory=list)  # (initializer, channel axis, offset)
    # (Split node, output index, the Split's sizes) whose output holds these channels
    splits: list[tuple[str, int, tuple[int, ...]]] = field(default_factory=list)
    blocked: str | None = None
    label: str = "?"


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
        for name in ("producers", "consumers", "depthwise", "constants", "splits"):
            getattr(sa, name).extend(getattr(sb, name))
        sa.blocked = sa.blocked or sb.blocked
        return ra


class _Recut(Exception):
    """A Split or a binary op cuts a space in its middle: its producers were given a new cut; walk again."""


def analyse(model: onnx.ModelProto) -> dict[int, Space]:
    """Channel spaces of the graph (root key -> Space)."""
    index = GraphIndex(model.graph)
    channels = _channel_counts(model)
    cuts: dict[str, set[int]] = defaultdict(set)  # Conv -> offsets where its output channels are split
    while True:
        walk = _ChannelWalk(index, channels, cuts)
        try:
            for node in model.graph.node:
                walk.visit(node)
        except _Recut:
            continue
        return walk.finish()


def _channel_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Axis-1 size of every tensor whose shape inference knows it (Concat inputs no space tracks)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    counts = {t.name: t.dims[1] for t in model.graph.initializer if len(t.dims) > 1}
    for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        dims = v.type.tensor_type.shape.dim
        if len(dims) > 1 and dims[1].HasField("dim_value"):
            counts[v.name] = dims[1].dim_value
    return counts


class _ChannelWalk:
    """Follows channel layouts through the graph in topological order (see the module docstring)."""

    def __init__(self, index: GraphIndex, channels: dict[str, int], cuts: dict[str, set[int]]):
        self.index, self.channels, self.cuts, self.groups = index, channels, cuts, _Groups()
        self.layout_of: dict[str, list[tuple[int | None, int]]] = {}  # tensor -> [(space key or None, count)]

    def space(self, key: int) -> Space:
        return self.groups.spaces[self.groups.find(key)]

    def spans(self, layout) -> list[tuple[int | None, int, int]]:
        """(root key or None, offset, count) of each segment."""
        out, offset = [], 0
        for key, count in layout:
            out.append((None if key is None else self.groups.find(key), offset, count))
            offset += count
        return out

    def block(self, layout, why: str) -> None:
        for key, _, _ in self.spans(layout):
            if key is not None:
                self.space(key).blocked = self.space(key).blocked or why

    def visit(self, node: onnx.NodeProto) -> None:
        if node.op_type == "Conv" and len(node.input) > 1 and node.input[1] in self.index.initializers:
            self.conv(node)
        elif node.op_type == "Concat":
            self.concat(node)
        elif node.op_type == "Split":
            self.split(node)
        else:
            self.other(node)

    def conv(self, node: onnx.NodeProto) -> None:
        k, c = self.index.initializers[node.input[1]].dims[:2]
        group = attribute(node, "group", 1)
        src = self.layout_of.get(node.input[0])
        if group == 1:
            for key, offset, _ in self.spans(src or []):
                if key is not None:
                    self.space(key).consumers.append((node.name, offset))
            self.layout_of[node.output[0]] = self._produce(node.name, k)
        elif group == k and c == 1 and src is not None:  # depthwise: the same spaces continue
            for key, offset, _ in self.spans(src):
                if key is not None:
                    self.space(key).depthwise.append((node.name, offset))
            self.layout_of[node.output[0]] = src
        elif src is not None:
            self.block(src, f"grouped conv {node.name}")

    def _produce(self, conv: str, k: int) -> list[tuple[int, int]]:
        bounds = [0, *sorted(self.cuts.get(conv, ())), k]
        layout = []
        for start, end in zip(bounds, bounds[1:]):
            key = self.groups.new(end - start)
            self.groups.spaces[key].producers.append((conv, start))
            layout.append((key, end - start))
        return layout

    def concat(self, node: onnx.NodeProto) -> None:
        tracked = [self.layout_of[i] for i in node.input if i in self.layout_of]
        if not tracked:
            return
        parts = [self.layout_of.get(i) or [(None, self.channels.get(i))] for i in node.input if i]
        if attribute(node, "axis", 0) not in CHANNEL_AXES or any(n is None for p in parts for _, n in p):
            for layout in tracked:
                self.block(layout, f"Concat {node.name}")
            return
        self.layout_of[node.output[0]] = [segment for part in parts for segment in part]

    def split(self, node: onnx.NodeProto) -> None:
        layout = self.layout_of.get(node.input[0])
        if layout is None:
            return
        sizes = self._split_sizes(node, sum(n for _, n in layout))
        if attribute(node, "axis", 0) not in CHANNEL_AXES or sizes is None:
            self.block(layout, f"Split {node.name}")
            return
        bounds = np.cumsum([0, *sizes])
        layout = self._cut(layout, bounds)
        for i, (start, end) in enumerate(zip(bounds, bounds[1:])):
            part = [(key, n) for key, offset, n in self.spans(layout) if start <= offset < end]
            self.layout_of[node.output[i]] = part
            for key, _ in part:
                if key is not None:
                    self.space(key).splits.append((node.name, i, tuple(sizes)))

    def _split_sizes(self, node: onnx.NodeProto, total: int) -> list[int] | None:
        if len(node.input) > 1 and node.input[1]:
            if node.input[1] not in self.index.initializers:
                return None  # computed at run time
            return [int(s) for s in self.index.weight(node.input[1])]
        sizes = attribute(node, "split", None)
        if sizes is not None:
            return list(sizes)
        parts = len(node.output)
        return [total // parts] * parts if total % parts == 0 else None

    def _cut(self, layout, bounds) -> list:
        """The layout with segments split at `bounds`; a space cut in its middle makes its producers recut."""
        out, recut = [], False
        for key, offset, n in self.spans(layout):
            inner = [int(b) - offset for b in bounds if offset < b < offset + n]
            if inner and key is not None:
                new = {(conv, start + p) for conv, start in self.space(key).producers for p in inner}
                new = {(conv, at) for conv, at in new if at not in self.cuts[conv]}
                for conv, at in new:
                    self.cuts[conv].add(at)
                recut |= bool(new)
                if not new:  # cannot happen while every space has producers; never loop
                    self.space(key).blocked = f"cut at channels {inner} where its producers are not"
            edges = [0, *inner, n]
            out.extend((key, b - a) if not inner else (None, b - a) for a, b in zip(edges, edges[1:]))
        if recut:
            raise _Recut()
        return out

    def other(self, node: onnx.NodeProto) -> None:
        inputs = [i for i in node.input if i]
        acts = [i for i in inputs if i not in self.index.initializers]
        layouts = [self.layout_of[i] for i in acts if i in self.layout_of]
        if not layouts:
            return
        rule = policy(node.op_type)
        if not (rule.channelwise or (rule.elementwise and len(acts) <= 2)):
            for layout in layouts:
                self.block(layout, f"{node.op_type} {node.name}")
            return
        layout = self._join(node, layouts)
        if rule.elementwise and len(acts) == 2 and len(layouts) == 1:
            self.block(layout, f"{node.op_type} {node.name} mixes a pruned and an unpruned tensor")
        for name in inputs:
            if name in self.index.initializers:
                self._constant(node, name, layout)
        self.layout_of[node.output[0]] = layout

    def _join(self, node: onnx.NodeProto, layouts: list) -> list:
        """One layout for inputs that meet channel by channel: their spaces become one, segment by segment."""
        if len(layouts) == 1:
            return layouts[0]
        totals = {sum(n for _, n in layout) for layout in layouts}
        if len(totals) > 1:  # broadcast across channels
            for layout in layouts:
                self.block(layout, f"{node.op_type} {node.name} broadcasts across channels")
            return layouts[0]
        bounds = sorted({offset for layout in layouts for _, offset, _ in self.spans(layout)} | totals)
        layouts = [self._cut(layout, bounds) for layout in layouts]
        joined = list(layouts[0])
        for layout in layouts[1:]:
            for i, ((a, n), (b, _)) in enumerate(zip(joined, layout)):
                if a is not None and b is not None:
                    joined[i] = (self.groups.union(a, b), n)
                elif (a, b) != (None, None):
                    why = f"{node.op_type} {node.name} mixes a pruned and an unpruned tensor"
                    self.block([(a if a is not None else b, n)], why)
        return joined

    def _constant(self, node: onnx.NodeProto, name: str, layout) -> None:
        """A constant operand of a channel-wise op: sliced with the spaces, or it blocks them."""
        shape = list(self.index.initializers[name].dims)
        total = sum(n for _, n in layout)
        if len(shape) >= 3 and shape[-3] == total:
            axis = len(shape) - 3
        elif np.prod(shape) <= 1 or node.op_type in ("Resize", "Pad"):
            return  # a scalar, or sizes and scales rather than per-channel values
        elif node.op_type == "BatchNormalization":
            axis = 0
        else:
            self.block(layout, f"constant {name} of {node.op_type} {node.name}")
            return
        for key, offset, _ in self.spans(layout):
            if key is not None:
                self.space(key).constants.append((name, axis, offset))

    def finish(self) -> dict[int, Space]:
        for name, layout in self.layout_of.items():
            if name in self.index.outputs:
                self.block(layout, f"graph output {name}")
        spaces = {k: self.groups.spaces[k] for k in {self.groups.find(k) for k in self.groups.spaces}}
        for space in spaces.values():
            space.constants = list(dict.fromkeys(space.constants))  # one slice per tensor and offset
            space.label = ",".join(self._name(conv, offset, space.channels) for conv, offset in space.producers)
            shared = [n for n in sliced_tensors(space, self.index) if self.index.uses(n) > 1]
            if shared:
                space.blocked = space.blocked or f"initializer {shared[0]} is shared by several nodes"
        return spaces

    def _name(self, conv: str, offset: int, channels: int) -> str:
        whole = self.index.initializers[self.index.nodes[conv].input[1]].dims[0] == channels
        return conv if whole else f"{conv}[{offset}:{offset + channels}]"


def sliced_tensors(space: Space, index: GraphIndex) -> list[str]:
    """Initializers that pruning the space cuts: its Convs' weights and biases, its per-channel constants."""
    convs = {c for c, _ in space.producers} | {c for c, _ in space.depthwise}
    names = [i for c in convs for i in index.nodes[c].input[1:3] if i]
    names += [index.nodes[c].input[1] for c, _ in space.consumers]
    return names + [name for name, _, _ in space.constants]


def unshare(model: onnx.ModelProto, spaces: dict[int, Space] | None = None) -> onnx.ModelProto:
    """A copy in which each initializer that pruning would cut has one reader per copy (`model` itself
    where none is shared); spaces: analyse(model), where the caller has it.

    Exporters and onnxslim merge equal constants (all-zero biases of freshly initialized BatchNorms,
    equal Split sizes), and a tensor two groups cut differently must not be one tensor."""
    index = GraphIndex(model.graph)
    spaces = analyse(model) if spaces is None else spaces
    wanted = {n for space in spaces.values() for n in sliced_tensors(space, index) if index.uses(n) > 1}
    if not wanted:
        return model
    model = clone(model)
    inits = GraphIndex(model.graph).initializers
    seen: dict[str, int] = defaultdict(int)
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name in wanted:
                seen[name] += 1
                if seen[name] > 1:
                    copy = clone(inits[name])
                    copy.name = f"{name}__{seen[name]}"
                    model.graph.initializer.append(copy)
                    node.input[i] = copy.name
    return model


def kept_channels(model: onnx.ModelProto, spaces: dict[int, Space], keeps: dict) -> dict[tuple[str, int], np.ndarray]:
    """For every (initializer, axis) that pruning cuts: the indices that stay (each space's `keeps`
    at its offset; channels of unpruned spaces all stay)."""
    index = GraphIndex(model.graph)
    removed: dict[tuple[str, int], list[np.ndarray]] = defaultdict(list)
    for key, keep in keeps.items():
        space = spaces[key]
        gone = np.setdiff1d(np.arange(space.channels), keep)
        for conv, offset in [*space.producers, *space.depthwise]:
            for tensor in index.nodes[conv].input[1:3]:
                if tensor:
                    removed[(tensor, 0)].append(offset + gone)
        for conv, offset in space.consumers:
            removed[(index.nodes[conv].input[1], 1)].append(offset + gone)
        for name, axis, offset in space.constants:
            removed[(name, axis)].append(offset + gone)
    return {(name, axis): np.setdiff1d(np.arange(index.initializers[name].dims[axis]), np.concatenate(parts))
            for (name, axis), parts in removed.items()}


def conv_channels(model: onnx.ModelProto, kept: dict) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(kept input channels, kept output channels) of every Conv whose weight is cut."""
    keep_in, keep_out = {}, {}
    for node in model.graph.node:
        if node.op_type == "Conv" and len(node.input) > 1:
            if (node.input[1], 1) in kept:
                keep_in[node.name] = kept[(node.input[1], 1)]
            if (node.input[1], 0) in kept:
                keep_out[node.name] = kept[(node.input[1], 0)]
    return keep_in, keep_out


def resize_splits(model: onnx.ModelProto, spaces: dict[int, Space], keeps: dict) -> None:
    """Give each Split that pruned channels pass through its new sizes (in place)."""
    sizes: dict[str, list[int]] = {}
    for key, keep in keeps.items():
        for split, output, before in spaces[key].splits:
            sizes.setdefault(split, list(before))[output] -= spaces[key].channels - len(keep)
    nodes = GraphIndex(model.graph).nodes
    for name, new in sizes.items():
        _set_sizes(model, nodes[name], new)


def _set_sizes(model: onnx.ModelProto, node: onnx.NodeProto, sizes: list[int]) -> None:
    """Sizes as input 1 from opset 13 (replacing opset 18's equal-split `num_outputs`), else the attribute."""
    if opset(model) >= 13:
        name = f"{node.name}__sizes"
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(sizes, np.int64), name))
        if len(node.input) < 2:
            node.input.append(name)
        else:
            node.input[1] = name
        _drop_attribute(node, "num_outputs")
    else:
        _drop_attribute(node, "split")
        node.attribute.append(onnx.helper.make_attribute("split", sizes))


def _drop_attribute(node: onnx.NodeProto, name: str) -> None:
    others = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(others)
