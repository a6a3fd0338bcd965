"""The GPU's busy time over a run: the union of the batches' spans, not their sum (a batch's reduction on the
post stream overlaps the next batch's inference)."""

import numpy as np

from jetpipe.runtime.gpu_launch import busy_added_ms


def _union_ms(spans) -> float:
    """Brute force: 1 us cells covered by any span."""
    covered = np.zeros(int(max(end for _, end in spans) * 1000) + 1, bool)
    for start, end in spans:
        covered[int(round(start * 1000)):int(round(end * 1000))] = True
    return covered.sum() / 1000


def test_busy_time_summed_over_batches_is_the_union_of_their_spans():
    rng = np.random.default_rng(3)
    spans, start, end = [], 0.0, 0.0
    for _ in range(200):  # starts and ends in order (the compute stream, then the post stream, run them in
        #                   turn); a start before the last end (overlap), at it, or after it (a gap)
        start = max(start, end + rng.choice([-1.0, 0.0, 1.0]) * rng.uniform(0, 2))
        end = max(end, start) + rng.uniform(0.5, 4)
        spans.append((round(start, 3), round(end, 3)))
    busy = sum(busy_added_ms(e - s, (spans[k - 1][1] - s) if k else -1.0) for k, (s, e) in enumerate(spans))
    assert abs(busy - _union_ms(spans)) < 1e-6 * len(spans) + 0.01
    assert busy < sum(e - s for s, e in spans)  # the sum counts each overlap twice


def test_a_batch_inside_the_one_before_adds_nothing():
    assert busy_added_ms(2.0, 5.0) == 0.0      # started 5 ms before the previous end, lasted 2
    assert busy_added_ms(4.0, 1.0) == 3.0      # overlapped by 1 ms
    assert busy_added_ms(4.0, -3.0) == 4.0     # started 3 ms after it: a gap, all its own
