"""How many channels each group keeps so that the model loses a target share of its FLOPs.

`--prune RATIO` means "remove RATIO of the model's FLOPs" (the constraint
ModelOpt's pruning takes). Two allocations reach it:

- uniform: every group drops the same share of its channels (found by scanning
  that share), needs no data;
- sensitivity: each group's output error is measured alone at a few kept
  counts, then channels are taken greedily where they cost the least error per
  FLOP saved (the sensitivity analysis of Distiller / NNI, on ONNX).

Kept counts are multiples of `align` (8 by default: cuDNN and TensorRT pick
tensor-core kernels for channel counts that are multiples of 8, and a pruned
model with 13 channels can be slower than the dense one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from jetpipe.errors import ModelError


def candidates(channels: int, align: int, min_channels: int, max_share: float) -> list[int]:
    """Kept counts a group may take, largest first (the first is `channels`: not pruned)."""
    low = max(min_channels, math.ceil(channels * (1 - max_share)))
    return [channels] + [k for k in range(channels - 1, low - 1, -1) if k % align == 0]


@dataclass
class FlopModel:
    """FLOPs of the model as a function of the kept count of every group.

    A Conv's FLOPs scale with the kept share of its output channels and of its input channels; each
    side is a tuple of (group key, the group's fraction of that side's channels), empty where no
    group is pruned there (Concat and Split make a Conv read or write several groups)."""

    layers: list[tuple[int, tuple, tuple]]  # (dense FLOPs, output groups, input groups)
    channels: dict

    def total(self, kept: dict) -> float:
        def share(parts):
            return 1.0 - sum(f * (1 - kept.get(key, self.channels[key]) / self.channels[key]) for key, f in parts)

        return sum(flops * share(out) * share(inp) for flops, out, inp in self.layers)

    @property
    def dense(self) -> float:
        return self.total({})


def uniform(flop_model: FlopModel, options: dict[object, list[int]], target: float) -> dict:
    """The smallest uniform channel share (in steps of 0.5 %) whose kept counts remove `target` of the FLOPs."""
    dense = flop_model.dense
    for step in range(1, 200):
        share = step / 200
        kept = {key: min(ks, key=lambda k: (abs(k - ks[0] * (1 - share)), -k)) for key, ks in options.items()}
        if 1 - flop_model.total(kept) / dense >= target:
            return kept
    raise _unreachable(flop_model, options, target)


def greedy(flop_model: FlopModel, options: dict[object, list[int]], errors: dict[object, dict[int, float]],
           target: float) -> dict:
    """Keep taking the step (one group to a smaller kept count) with the least error per FLOP saved.

    errors[key][k]: measured output error with only that group pruned to k; counts between measured
    points are interpolated. Errors of different groups are assumed to add up."""
    dense = flop_model.dense
    curves = {key: _interpolate(errors[key], ks) for key, ks in options.items()}
    kept = {key: ks[0] for key, ks in options.items()}
    while 1 - flop_model.total(kept) / dense < target:
        now = flop_model.total(kept)
        best, best_rate = None, math.inf
        for key, ks in options.items():
            for k in ks[ks.index(kept[key]) + 1:]:
                saved = now - flop_model.total({**kept, key: k})
                rate = (curves[key][k] - curves[key][kept[key]]) / max(saved, 1e-9)
                if saved > 0 and rate < best_rate:
                    best, best_rate = (key, k), rate
        if best is None:
            raise _unreachable(flop_model, options, target)
        kept[best[0]] = best[1]
    return kept


def probe_points(ks: list[int], count: int = 4) -> list[int]:
    """The kept counts to measure a group's error at: evenly spread over its options (not the dense one)."""
    pruned = ks[1:]
    if len(pruned) <= count:
        return pruned
    picks = np.linspace(0, len(pruned) - 1, count).round().astype(int)
    return [pruned[i] for i in sorted(set(picks))]


def _interpolate(measured: dict[int, float], ks: list[int]) -> dict[int, float]:
    xs = sorted([ks[0], *measured])
    ys = [0.0 if x == ks[0] else measured[x] for x in xs]
    ys = np.maximum.accumulate(ys[::-1])[::-1]  # fewer channels never counts as less error
    return {k: float(np.interp(k, xs, ys)) for k in ks}


def _unreachable(flop_model: FlopModel, options: dict, target: float) -> ModelError:
    most = 1 - flop_model.total({key: ks[-1] for key, ks in options.items()}) / flop_model.dense
    return ModelError(f"--prune {target:g}: at most {most:.0%} of this model's FLOPs can be removed from the "
                      f"groups that can be pruned safely; choose a smaller ratio")
