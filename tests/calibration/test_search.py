"""The precision search's k: doubling, then bisection, measuring as few candidates as it can."""

import pytest

from jetpipe.calibration.search import smallest_meeting


@pytest.mark.parametrize("count", [1, 2, 5, 8, 32])
def test_finds_the_smallest_k_that_meets_with_few_measurements(count):
    for threshold in range(1, count + 1):
        measured = []

        def meets(k, threshold=threshold, measured=measured):
            measured.append(k)
            return k >= threshold

        assert smallest_meeting(count, meets) == threshold
        assert len(measured) <= 2 * count.bit_length() + 1, (threshold, measured)
        assert threshold in measured  # the answer was itself measured to meet


def test_none_when_even_all_candidates_miss():
    measured = []
    assert smallest_meeting(5, lambda k: measured.append(k) or False) is None
    assert measured == [5]  # every candidate at once: out of reach in one measurement
    assert smallest_meeting(0, lambda k: True) is None
    assert smallest_meeting(4, lambda k: k >= 9) is None
