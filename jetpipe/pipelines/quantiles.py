"""Latency quantiles over a whole run, in fixed memory.

A window of the last N values (what the live status line and /metrics show) says
only how a run ended: a summary taken from one reports the moment the sources
were stopped, not the run. This histogram keeps every value in buckets 1 %
wide (relative), so a quantile is within 1 % of the exact one whatever the run's
length, and recording allocates nothing.
"""

from __future__ import annotations

import math

import numpy as np


class RunHistogram:
    """Counts of values (milliseconds) in logarithmic buckets from `low` to `high`; below and above go to
    bucket 0 and the last, and quantiles there are the exact minimum and maximum."""

    def __init__(self, low: float = 1e-3, high: float = 1e6, step: float = 0.01):
        if not 0 < low < high or not 0 < step < 1:
            raise ValueError("histogram: need 0 < low < high and 0 < step < 1")
        self._log_low, self._per_log = math.log(low), 1.0 / math.log1p(step)
        self._low, self._step = low, step
        buckets = int(math.ceil((math.log(high) - self._log_low) * self._per_log)) + 2
        self.counts = np.zeros(buckets, np.int64)
        self.count, self.min, self.max = 0, math.inf, -math.inf

    def add(self, value: float) -> None:
        index = 0 if value < self._low else min(int((math.log(value) - self._log_low) * self._per_log) + 1,
                                                len(self.counts) - 1)
        self.counts[index] += 1
        self.count += 1
        self.min, self.max = min(self.min, value), max(self.max, value)

    def merge(self, other: RunHistogram) -> None:
        """Add another histogram's values (one of the same buckets: another GPU's records)."""
        self.counts += other.counts
        self.count += other.count
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)

    def quantile(self, q: float) -> float | None:
        """The value at rank ceil(q * count) (nearest rank): its bucket's middle, within [min, max]."""
        if not self.count:
            return None
        rank = max(1, math.ceil(q * self.count))
        if rank == 1 or rank >= self.count:  # the extremes are kept exactly
            return self.min if rank == 1 else self.max
        index = int(np.searchsorted(np.cumsum(self.counts), rank))
        if index == 0 or index == len(self.counts) - 1:
            return self.min if index == 0 else self.max
        lower = self._low * (1 + self._step) ** (index - 1)
        middle = lower * math.sqrt(1 + self._step)
        return min(max(middle, self.min), self.max)
