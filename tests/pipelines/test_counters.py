"""Latency quantiles: the summary's cover the whole run, the live views the last results."""

import numpy as np
import pytest

from jetpipe.pipelines.counters import StreamCounters
from jetpipe.pipelines.quantiles import RunHistogram


def test_histogram_quantiles_within_one_percent_of_exact():
    values = np.random.default_rng(0).lognormal(mean=3.0, sigma=1.2, size=20000)
    histogram = RunHistogram()
    for v in values:
        histogram.add(float(v))
    for q in (0.5, 0.9, 0.99, 0.999):
        exact = np.quantile(values, q, method="inverted_cdf")
        assert histogram.quantile(q) == pytest.approx(exact, rel=0.01)
    assert histogram.quantile(1.0) == histogram.max == values.max()
    assert histogram.quantile(0.0) == histogram.min == values.min()


def test_histogram_out_of_range_values_are_the_exact_extremes():
    histogram = RunHistogram(low=1.0, high=100.0)
    for v in (0.25, 5.0, 5000.0):
        histogram.add(v)
    assert histogram.quantile(0.1) == 0.25
    assert histogram.quantile(0.5) == pytest.approx(5.0, rel=0.01)
    assert histogram.quantile(0.99) == 5000.0
    assert RunHistogram().quantile(0.5) is None


def test_summary_percentiles_cover_the_whole_run_not_its_end():
    """A run of 20,000 results at 10 ms that ends with 2,048 slow ones (the sources stopping): the run's p50
    and p90 are 10 ms; a window of the last results sees only the end (what the summary reported before)."""
    metrics = StreamCounters(streams=1, window=2048)
    for _ in range(20000):
        metrics.record_result(0, {"total": 10.0})
    for _ in range(2048):
        metrics.record_result(0, {"total": 500.0})
    run = metrics.percentiles("total")
    assert run[0.5] == pytest.approx(10.0, rel=0.01)
    assert run[0.9] == pytest.approx(10.0, rel=0.01)
    assert run[0.99] == pytest.approx(500.0, rel=0.01)  # 2,048 of 22,048 are slow: the tail is
    assert run["max"] == 500.0
    assert metrics.recent_percentiles("total")[0.5] == 500.0  # the live view: the last results
