import numpy as np
import pytest

from jetpipe.convert.stats import NUM_BINS, TensorStats, entropy_threshold, percentile_threshold


def test_streaming_histogram_matches_one_shot():
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal(20_000) * s for s in (0.5, 1.0, 4.0, 2.0)]  # range grows twice
    streamed = TensorStats()
    for b in batches:
        streamed.update(b.astype(np.float32))
    everything = np.abs(np.concatenate(batches))
    assert streamed.absmax == pytest.approx(float(everything.max()), rel=1e-6)
    assert streamed.count == everything.size and streamed.hist.sum() == everything.size
    one_shot, _ = np.histogram(everything, bins=NUM_BINS, range=(0, streamed.edge))
    # re-binning spreads counts linearly inside old bins: compare CDFs
    cdf_stream = np.cumsum(streamed.hist) / everything.size
    cdf_exact = np.cumsum(one_shot) / everything.size
    assert np.abs(cdf_stream - cdf_exact).max() < 0.01


def _held_bytes(stats) -> int:
    """Bytes of every array the statistics object holds."""
    return sum(v.nbytes for v in vars(stats).values() if isinstance(v, np.ndarray))


def test_memory_is_bounded_by_bins_not_data():
    stats = TensorStats()
    stats.update(np.random.default_rng(0).standard_normal(1_000).astype(np.float32))
    after_one = _held_bytes(stats)
    for seed in range(1, 6):  # 2.5 M more values, growing in range (the histogram re-bins)
        stats.update(np.random.default_rng(seed).standard_normal(500_000).astype(np.float32) * (seed + 1))
    assert _held_bytes(stats) == after_one == NUM_BINS * 8  # one int64 histogram, whatever the data
    assert stats.count == 1_000 + 2_500_000 and stats.hist.sum() == stats.count


def test_methods_against_independent_computations():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(200_000), [40.0, -55.0]]).astype(np.float32)  # two outliers
    stats = TensorStats()
    stats.update(x)
    assert stats.threshold("minmax") == pytest.approx(55.0)
    p = stats.threshold("percentile")
    assert p == pytest.approx(np.percentile(np.abs(x), 99.99), rel=0.02)
    e = stats.threshold("entropy")
    assert 2.0 < e < 20.0  # clips the outliers, keeps the Gaussian's bulk


def test_percentile_and_entropy_helpers_on_uniform_histogram():
    hist = np.full(NUM_BINS, 10, np.int64)
    assert percentile_threshold(hist, 1.0, 50.0) == pytest.approx(0.5, abs=1e-3)
    assert entropy_threshold(hist, 1.0) == pytest.approx(1.0, abs=0.01)  # nothing to clip


def test_non_finite_values_are_ignored_for_ranges():
    stats = TensorStats()
    stats.update(np.array([1.0, np.inf, -2.0, np.nan], np.float32))
    assert stats.absmax == 2.0
