"""Automatic precision search: the fewest extra nodes in higher precision that meet a budget.

Candidates are ranked by measured sensitivity (INT8: each quantized node alone
against FP32; FP16: the error each node adds, by per-layer localisation), then
the top-k are kept in float for k = 1, 2, 4, ... until the budget is met, and
the smallest such k is found by bisection, re-measuring the task metric on the
full data each time.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from jetpipe.calibration import comparison as m
from jetpipe.calibration.evaluate import compare
from jetpipe.calibration.layers import localise
from jetpipe.convert import calib_cache, fp16, graph, int8, sensitivity
from jetpipe.errors import JetpipeError
from jetpipe.progress import silent
from jetpipe.tasks import agreement_metrics as task_metrics

log = logging.getLogger(__name__)


@dataclass
class SearchResult:
    metric: str
    bound: str
    met: bool
    value: float
    added: list[str] = field(default_factory=list)
    excluded_nodes: dict[str, str] = field(default_factory=dict)   # everything to keep in float
    trials: list[dict] = field(default_factory=list)
    why: str = ""


class Rebuilder:
    """Builds the bundle's precision from its FP32 base with a given set of float nodes."""

    def __init__(self, ctx, bundle_dir):
        self.ctx, self.precision = ctx, ctx.manifest["precision"]
        if self.precision not in ("int8", "fp16"):
            raise JetpipeError(f"a {self.precision} bundle has nothing to keep in higher precision")
        self.base = dict(ctx.manifest.get("excluded_nodes") or {})
        self.ranges, self.means = {}, {}
        if self.precision == "int8":
            cached = calib_cache.load(bundle_dir)
            self.ranges, self.means = cached.ranges, cached.means()

    def build(self, extra: set[str]):
        keep = set(self.base) | extra
        if self.precision == "int8":
            return int8.quantize(self.ctx.reference, int8.plan(self.ctx.reference, keep), self.ranges, self.means)
        return fp16.convert(self.ctx.reference, keep)

    def ranking(self, progress=silent) -> list[str]:
        fixed = graph.image_input(self.ctx.reference).dims[0]  # a batch-1 export takes one row per run
        sample = self.ctx.inputs[:min(2, fixed) if isinstance(fixed, int) else 2]
        if self.precision == "int8":
            full = int8.plan(self.ctx.reference, set(self.base))
            steps = progress(len(full.nodes), "precision search: ranking", "node")
            errors = sensitivity.rank_int8_nodes(self.ctx.reference, full, self.ranges, sample,
                                                 self.ctx.input_name, steps, self.means)
            steps.close()
            return sorted(errors, key=errors.get, reverse=True)
        ranked = localise(self.ctx.reference, self.build(set()), sample, self.ctx.input_name,
                          self.ctx.provider, top=10_000)
        return [r["node"] for r in ranked if r["node"] not in self.base and r["added_error"] > 0]


def search(ctx, bundle_dir, budget: str, max_nodes: int = 32, progress=silent) -> SearchResult:
    """progress(total, what, unit): a bar for the ranking and one for the trials (jetpipe.progress.bar)."""
    metric, op, bound = m.parse_budget(budget)
    rebuild = Rebuilder(ctx, bundle_dir)
    candidates = [n for n in rebuild.ranking(progress) if n not in rebuild.base][:max_nodes]
    result = SearchResult(metric, budget, False, float("nan"))
    cache: dict[int, float] = {}
    # every candidate first, then doubling and bisection: at most about 2 log2(candidates) + 1 trials
    trials = progress(2 * max(1, len(candidates)).bit_length() + 1, "precision search: trials", "trial")

    def value_at(k: int) -> float:
        if k not in cache:
            _, tm = compare(ctx, rebuild.build(set(candidates[:k])))
            trials.update(1)
            cache[k] = tm[metric]
            met = task_metrics.meets(tm[metric], op, bound)
            result.trials.append({"extra_nodes": k, metric: tm[metric], "met": met})
            log.info("precision search: %d extra node(s) in float -> %s = %.5g", k, metric, tm[metric])
        return cache[k]

    k = smallest_meeting(len(candidates), lambda i: task_metrics.meets(value_at(i), op, bound))
    trials.close()
    if k is None:
        best_k = max(cache, key=lambda i: cache[i] if op == ">=" else -cache[i]) if cache else 0
        result.value = cache.get(best_k, float("nan"))
        result.added = candidates[:best_k]
        result.why = (f"even with {len(candidates)} more node(s) in higher precision, the best {metric} was "
                      f"{result.value:.5g} (with {best_k}); the budget {budget} is out of reach of "
                      "per-node precision: recalibrate with more or better data, or relax it")
    else:
        result.met, result.value, result.added = True, cache[k], candidates[:k]
    result.excluded_nodes = {**rebuild.base, **{n: "precision search" for n in result.added}}
    return result


def smallest_meeting(count: int, meets) -> int | None:
    """The smallest k in 1..count with meets(k): k = count measured first (where even every candidate misses,
    one measurement says so, not a doubling's worth of them), then k = 1, 2, 4, ... then bisecting; None if
    k = count does not meet. Assumes meeting at k makes meeting at larger k likely, not certain: the k returned
    was itself measured to meet."""
    if count == 0 or not meets(count):
        return None
    k, low = 1, 0
    while k < count and not meets(k):
        low, k = k, k * 2
    high = min(k, count)
    while high - low > 1:
        mid = (low + high) // 2
        if meets(mid):
            high = mid
        else:
            low = mid
    return high


def excluded_from_report(path) -> dict[str, str]:
    """`jetpipe convert --exclude-from REPORT`: the nodes a precision search chose (all of them)."""
    from pathlib import Path

    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    try:
        report = json.loads(path.read_text())
        return dict(report["precision_search"]["excluded_nodes"])
    except FileNotFoundError:
        raise JetpipeError(f"--exclude-from {path}: no such report (run `jetpipe calibrate accuracy "
                           "... --budget ...` first)") from None
    except (json.JSONDecodeError, KeyError, TypeError):
        raise JetpipeError(f"--exclude-from {path}: not an accuracy report with a precision search") from None
