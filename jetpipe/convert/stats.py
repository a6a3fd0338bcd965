"""Streaming activation statistics and INT8 range selection.

ONNX Runtime's calibrators keep every activation of every batch (8.9 GB for 16
images of 640x480 on PP-OCRv4 det). Here each batch is folded into a fixed-size
histogram of |x| per tensor and then dropped, so memory is bounded by one
batch's activations plus NUM_BINS counters per tensor, whatever the data size.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx

from jetpipe.convert.graph import expose_outputs
from jetpipe.runtime.sessions import cpu_session

NUM_BINS = 2048
METHODS = ("entropy", "percentile", "minmax")
PERCENTILE = 99.99


@dataclass
class TensorStats:
    """|x| histogram over [0, edge) that widens (re-binning) when larger values arrive."""

    absmax: float = 0.0
    edge: float = 0.0
    hist: np.ndarray | None = None
    count: int = 0
    with_hist: bool = True
    with_means: bool = False               # the mean of each channel (axis 1): a Conv input's, for bias correction
    channel_sum: np.ndarray | None = None
    channel_count: int = 0

    def update(self, x: np.ndarray) -> None:
        if self.with_means and x.ndim >= 3:
            sums = x.sum(axis=(0, *range(2, x.ndim)), dtype=np.float64)
            self.channel_sum = sums if self.channel_sum is None else self.channel_sum + sums
            self.channel_count += x.size // x.shape[1]
        a = np.abs(x.reshape(-1), dtype=np.float32)
        batch_max = float(a.max()) if a.size else 0.0
        if not np.isfinite(batch_max):
            a = a[np.isfinite(a)]
            batch_max = float(a.max()) if a.size else 0.0
        self.absmax = max(self.absmax, batch_max)
        self.count += a.size
        if not self.with_hist:
            return
        if self.hist is None:
            self.hist, self.edge = np.zeros(NUM_BINS, np.int64), max(batch_max, 1e-12)
        elif batch_max > self.edge:
            self._widen(batch_max * 1.25)  # headroom: fewer re-binnings
        # in place on |x| (its own copy): the bins as floats, clipped to the last, then counted
        np.multiply(a, np.float32(NUM_BINS / self.edge), out=a)
        np.minimum(a, np.float32(NUM_BINS - 1), out=a)
        self.hist += np.bincount(a.astype(np.intp), minlength=NUM_BINS)

    def _widen(self, new_edge: float) -> None:
        """Redistribute counts onto wider bins, linearly inside each old bin."""
        old_edges = np.linspace(0, self.edge, NUM_BINS + 1)
        new_edges = np.linspace(0, new_edge, NUM_BINS + 1)
        cumulative = np.concatenate([[0], np.cumsum(self.hist)]).astype(np.float64)
        resampled = np.interp(new_edges, old_edges, cumulative, right=cumulative[-1])
        rounded = np.round(resampled).astype(np.int64)
        self.hist, self.edge = np.diff(rounded), new_edge

    def threshold(self, method: str) -> float:
        """The |x| value mapped to 127 in INT8."""
        if method == "minmax" or self.hist is None or self.absmax == 0.0:
            return self.absmax
        if method == "percentile":
            return min(self.absmax, percentile_threshold(self.hist, self.edge, PERCENTILE))
        if method == "entropy":
            return min(self.absmax, entropy_threshold(self.hist, self.edge))
        raise ValueError(method)


def percentile_threshold(hist: np.ndarray, edge: float, percentile: float) -> float:
    cdf = np.cumsum(hist) / max(1, hist.sum())
    index = int(np.searchsorted(cdf, percentile / 100.0))
    return (min(index, len(hist) - 1) + 1) * edge / len(hist)


def entropy_threshold(hist: np.ndarray, edge: float, levels: int = 128) -> float:
    """TensorRT's KL-divergence calibration: the clip value whose 128-level
    quantization loses the least information about the |x| distribution."""
    hist = hist.astype(np.float64)
    nbins = len(hist)
    best_i, best_kl = nbins, np.inf
    for i in range(levels, nbins + 1, 8):
        p = hist[:i].copy()
        p[i - 1] += hist[i:].sum()  # clipped outliers land in the last bin
        nonzero = p > 0
        if not nonzero.any():
            continue
        # quantize the first i bins into `levels` groups, spread back over non-zero bins
        groups = np.arange(i) * levels // i
        group_sum = np.bincount(groups, weights=hist[:i], minlength=levels)
        group_nonzero = np.bincount(groups, weights=nonzero.astype(np.float64), minlength=levels)
        q = np.where(nonzero, group_sum[groups] / np.maximum(group_nonzero[groups], 1), 0.0)
        p_sum, q_sum = p.sum(), q.sum()
        if q_sum == 0:
            continue
        pn, qn = p[nonzero] / p_sum, q[nonzero] / q_sum
        qn = np.maximum(qn, 1e-12)
        kl = float(np.sum(pn * np.log(pn / qn)))
        if kl < best_kl:
            best_kl, best_i = kl, i
    return best_i * edge / nbins


@dataclass
class Statistics:
    """Per-tensor statistics from one pass over the calibration data."""

    tensors: dict[str, TensorStats] = field(default_factory=dict)
    samples: int = 0

    def ranges(self, method: str, names: Iterable[str]) -> dict[str, float]:
        return {n: self.tensors[n].threshold(method) for n in names if n in self.tensors}

    def absmax(self) -> dict[str, float]:
        return {n: s.absmax for n, s in self.tensors.items()}

    def channel_means(self) -> dict[str, list[float]]:
        return {n: [float(v) for v in s.channel_sum / s.channel_count] for n, s in self.tensors.items()
                if s.channel_sum is not None and s.channel_count}


def float_tensors(model: onnx.ModelProto) -> list[str]:
    """Names of float32 activations (node outputs) in graph order."""
    typed = {v.name: v.type.tensor_type.elem_type
             for v in [*model.graph.value_info, *model.graph.output, *model.graph.input]}
    names = []
    for node in model.graph.node:
        names += [o for o in node.output if o and typed.get(o) == onnx.TensorProto.FLOAT]
    return names


def collect(model: onnx.ModelProto, batches: Iterable[np.ndarray], input_name: str,
            hist_tensors: set[str], all_absmax: bool = True, progress=None,
            mean_tensors: frozenset[str] | set[str] = frozenset()) -> Statistics:
    """Run the model over the batches, folding activations into Statistics.

    Histograms are kept for `hist_tensors` (INT8 candidates), per-channel means for `mean_tensors` (a subset:
    the inputs of quantized Convs); with `all_absmax` every float activation's absmax is kept too (FP16 needs
    those). Only the tensors asked for are exposed as outputs: each one is held until the run ends.
    """

    names = [n for n in float_tensors(model) if all_absmax or n in hist_tensors]
    session = cpu_session(expose_outputs(model, names), optimize=False, arena=False)
    stats = Statistics({n: TensorStats(with_hist=n in hist_tensors, with_means=n in mean_tensors) for n in names})
    for name in (set(hist_tensors) | set(mean_tensors)) - set(names):  # graph inputs feeding quantized ops
        stats.tensors[name] = TensorStats(with_hist=name in hist_tensors, with_means=name in mean_tensors)
    for batch in batches:
        outputs = session.run(names, {input_name: batch})
        for name, value in zip(names, outputs):
            stats.tensors[name].update(value)
        if input_name in stats.tensors:
            stats.tensors[input_name].update(batch)
        del outputs
        stats.samples += len(batch)
        if progress is not None:
            progress.update(len(batch))
    return stats
