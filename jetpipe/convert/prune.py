"""Structured channel pruning on ONNX: remove whole output channels of Conv layers.

Which channels must go together: prune_spaces (channel groups through residual
Adds, depthwise Convs, Concat and Split). How many channels each group keeps:
prune_alloc (a FLOPs target, uniform or by measured sensitivity). Which ones,
and the refit: prune_refit.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import onnx
from onnx import numpy_helper

from jetpipe.convert import flops, prune_alloc
from jetpipe.convert import prune_refit as refit
from jetpipe.convert.graph import GraphIndex, attribute, clone
from jetpipe.convert.prune_spaces import Space, analyse, conv_channels, kept_channels, resize_splits, unshare
from jetpipe.errors import ModelError
from jetpipe.progress import silent

log = logging.getLogger(__name__)

def _importance_l1(space: Space, weights: dict[str, np.ndarray], convs: dict[str, onnx.NodeProto]) -> np.ndarray:
    score = np.zeros(space.channels)
    for name, offset in space.producers:
        w = weights[convs[name].input[1]][offset:offset + space.channels]
        per = np.abs(w).reshape(w.shape[0], -1).sum(axis=1)
        score += per / max(per.mean(), 1e-12)  # producers weigh alike
    return score


METHODS = ("l1", "reconstruct")
ALLOCATIONS = ("uniform", "sensitivity")


def prune(model: onnx.ModelProto, ratio: float, method: str = "l1", exclude: set[str] = frozenset(),
          min_channels: int = 8, samples: np.ndarray | None = None, input_name: str | None = None,
          align: int = 8, allocation: str | None = None, max_share: float = 0.5,
          progress=silent, size_hw: tuple[int, int] | None = None,
          budget_s: float | None = None) -> tuple[onnx.ModelProto, dict]:
    """Remove `ratio` of the model's FLOPs by removing whole channels; returns (model, report).

    l1: rank by weight L1 norm. reconstruct: choose the channels the consumers can best do without on
    the calibration `samples` (least squares), then refit each consumer so its output is preserved.
    allocation (how many channels each group keeps): uniform (default for l1) or sensitivity
    (measured on `samples`, default for reconstruct); see prune_alloc.
    progress(total, what, unit): a bar for each long step (jetpipe.progress.bar). size_hw: the input size
    FLOPs are counted at, where the model's is dynamic. budget_s: where measuring every group's
    sensitivity would take longer (estimated from the first probes), uniform allocation is used instead."""
    allocation = allocation or ("sensitivity" if method == "reconstruct" else "uniform")
    _check_arguments(ratio, method, allocation, samples, align)
    spaces = analyse(model)
    unshared = unshare(model, spaces)
    if unshared is not model:  # merged constants copied per reader: the names in the spaces changed
        model, spaces = unshared, analyse(unshared)
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
        fit_samples = _within_memory(model, names, samples, input_name)
        acts = refit.activations(model, names, fit_samples, input_name)
    ranking = {}
    steps = progress(len(options), "pruning: ranking channels", "group")
    for key in options:
        ranking[key] = _ranking(spaces[key], weights, convs, acts, options[key][-1])
        steps.update(1)
    steps.close()
    flop_model = _flop_model(model, spaces, options, size_hw)
    errors, note = None, None
    if allocation == "sensitivity":
        steps = progress(sum(len(prune_alloc.probe_points(ks)) for ks in options.values()),
                         "pruning: sensitivity", "probe")
        try:
            errors = _sensitivity(model, spaces, options, ranking, weights, acts, samples, input_name, steps,
                                  budget_s)
        except _OverBudget as over:
            allocation = "uniform"
            note = (f"measuring sensitivity would take about {over.args[0] / 60:.0f} min, over the "
                    f"{budget_s / 60:g} min budget: uniform allocation instead (raise --prune-budget to measure)")
            log.warning("pruning: %s", note)
        steps.close()
    if allocation == "uniform":
        kept = prune_alloc.uniform(flop_model, options, ratio)
    else:
        kept = prune_alloc.greedy(flop_model, options, errors, ratio)
    keeps = {key: np.sort(ranking[key][:k]) for key, k in kept.items() if k < spaces[key].channels}
    pruned = apply(model, spaces, keeps)
    if method == "reconstruct":
        keep_in, keep_out = conv_channels(model, kept_channels(model, spaces, keeps))
        steps = progress(len(keep_in), "pruning: refit", "layer")
        pruned, not_refit = refit.reconstruct(weights, pruned, keep_in, keep_out, acts, fit_samples, input_name,
                                              steps)
        steps.close()
    report = _report(spaces, options, kept, skipped, errors, ratio, allocation, align, keeps)
    if method == "reconstruct":
        report["refit"], report["refit_too_wide"] = sorted(set(keep_in) - set(not_refit)), not_refit
    return pruned, {**report, **({"allocation_note": note} if note else {})}


ACTIVATION_BUDGET = 2 << 30  # bytes of layer inputs kept for the ranking and the refit


def _within_memory(model, names, samples: np.ndarray, input_name) -> np.ndarray:
    """The calibration samples whose layer inputs fit ACTIVATION_BUDGET (at least 2): a 512x512 DeepLabV3
    keeps about 0.4 GB of them per sample."""
    per_sample = sum(a.nbytes for a in refit.activations(model, names, samples[:1], input_name).values())
    count = int(np.clip(ACTIVATION_BUDGET // max(per_sample, 1), 2, len(samples)))
    if count < len(samples):
        log.info("pruning: the least-squares steps use %d of %d samples (their layer inputs take %.1f GB each)",
                 count, len(samples), per_sample / 2**30)
    return samples[:count]


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


def _options(spaces, exclude, min_channels, align, max_share) -> tuple[dict, dict]:
    """Kept-count options of every prunable group, and why the others are left alone."""
    options, skipped = {}, {}
    for key, space in spaces.items():
        if space.blocked or not space.producers:
            skipped[space.label] = space.blocked or "no producer"
        elif {conv for conv, _ in space.producers} & exclude:
            skipped[space.label] = "excluded"
        elif space.channels < min_channels:
            skipped[space.label] = f"{space.channels} channels (< {min_channels})"
        else:
            ks = prune_alloc.candidates(space.channels, align, min_channels, max_share)
            if len(ks) > 1:
                options[key] = ks
            else:
                skipped[space.label] = f"{space.channels} channels: no smaller multiple of {align} " \
                                         f"(>= {min_channels})"
    return options, skipped


def _flop_model(model, spaces, options, size_hw) -> prune_alloc.FlopModel:
    """Each Conv's FLOPs scale with the kept share of its output and of its input channels; a group
    holds the fraction (its channels / the Conv's) of either."""
    dims = {n.name: GraphIndex(model.graph).initializers[n.input[1]].dims
            for n in model.graph.node if n.op_type == "Conv" and len(n.input) > 1}
    out_parts, in_parts = {}, {}
    for key in options:
        space = spaces[key]
        for name, _ in [*space.producers, *space.depthwise]:
            out_parts.setdefault(name, []).append((key, space.channels / dims[name][0]))
        for name, _ in space.consumers:
            in_parts.setdefault(name, []).append((key, space.channels / dims[name][1]))
    layers = [(row["flops"], tuple(out_parts.get(row["node"], ())), tuple(in_parts.get(row["node"], ())))
              for row in flops.layer_costs(model, size_hw)]
    return prune_alloc.FlopModel(layers, {key: spaces[key].channels for key in options})


class _OverBudget(Exception):
    pass


ESTIMATE_AFTER = 3  # probes timed before the sensitivity step's duration is estimated (the first is slower)


def _sensitivity(model, spaces, options, ranking, weights, acts, samples, input_name, steps,
                 budget_s: float | None = None) -> dict:
    """Output error with one group alone pruned to each probe count (its consumers refit when acts are given).

    Raises _OverBudget (with the estimate) as soon as the probes done so far (at least ESTIMATE_AFTER) say
    that all of them would take over budget_s."""
    reference = refit.outputs(model, samples, input_name)
    rng = np.random.default_rng(0)
    errors, probes = {}, sum(len(prune_alloc.probe_points(ks)) for ks in options.values())
    done, started = 0, time.monotonic()
    for key, ks in options.items():
        space, errors[key] = spaces[key], {}
        for k in prune_alloc.probe_points(ks):
            estimate = (time.monotonic() - started) / max(done, 1) * probes
            if budget_s is not None and done >= ESTIMATE_AFTER and estimate > budget_s:
                raise _OverBudget(estimate)
            done += 1
            keep = {key: np.sort(ranking[key][:k])}
            candidate = apply(model, spaces, keep)
            if acts is not None:
                nodes = GraphIndex(candidate.graph).nodes
                keep_in, keep_out = conv_channels(model, kept_channels(model, spaces, keep))
                for name, cut in keep_in.items():
                    if refit.refittable(nodes[name], weights, cut):
                        x = acts[nodes[name].input[0]]
                        refit.refit_node(candidate, nodes[name], weights, x, x[:, cut], cut, keep_out, rng)
            errors[key][k] = refit.normalized_mse(reference, refit.outputs(candidate, samples, input_name))
            steps.update(1)
        log.debug("sensitivity %s: %s", space.label, errors[key])
    return errors


def apply(model: onnx.ModelProto, spaces: dict, keeps: dict) -> onnx.ModelProto:
    """A copy of `model` with each group in `keeps` cut to those channel indices."""
    kept = kept_channels(model, spaces, keeps)
    model = clone(model)
    g, index = model.graph, GraphIndex(model.graph)
    weights = {name: index.weight(name) for name, _ in kept}
    for (name, axis), indices in kept.items():
        weights[name] = np.take(weights[name], indices, axis=axis)
    for name, array in weights.items():
        index.initializers[name].CopyFrom(numpy_helper.from_array(array, name))
    resize_splits(model, spaces, keeps)
    for node in g.node:  # depthwise group counts follow their channels
        if node.op_type == "Conv" and attribute(node, "group", 1) > 1:
            k = index.initializers[node.input[1]].dims[0]
            for a in node.attribute:
                if a.name == "group":
                    a.i = k
    del g.value_info[:]
    return onnx.shape_inference.infer_shapes(model)


def _report(spaces, options, kept, skipped, errors, ratio, allocation, align, keeps) -> dict:
    report = {"target_flops_share": ratio, "allocation": allocation, "align": align, "pruned": {},
              "unchanged": {}, "skipped": skipped}
    for key in options:
        entry = {"channels": spaces[key].channels, "kept": int(kept[key])}
        if errors is not None:
            entry["sensitivity"] = {str(k): round(v, 6) for k, v in errors[key].items()}
        report["pruned" if key in keeps else "unchanged"][spaces[key].label] = entry
    return report
