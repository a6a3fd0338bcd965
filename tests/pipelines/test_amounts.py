"""Sizes and durations as people write them."""

import pytest

from jetpipe.pipelines.amounts import parse_bytes, parse_seconds, say_bytes


def test_sizes_are_decimal_units_and_binary_ones_where_named():
    assert parse_bytes("200MB") == 200_000_000
    assert parse_bytes("50 GB") == 50_000_000_000
    assert parse_bytes("1.5GiB") == 1_610_612_736
    assert parse_bytes("512k") == 512_000
    assert parse_bytes("4096") == parse_bytes(4096) == 4096
    assert say_bytes(parse_bytes("4.2GB")) == "4.2 GB"


def test_durations_read_seconds_minutes_hours_days_weeks():
    assert parse_seconds("7d") == 7 * 86400
    assert parse_seconds("12h") == 12 * 3600
    assert parse_seconds("90m") == parse_seconds("90min") == 5400
    assert parse_seconds("30") == parse_seconds(30) == 30.0
    assert parse_seconds("1w") == 7 * 86400


@pytest.mark.parametrize("bad", ["", "MB", "12 parsecs", "-5MB", "1e9", True, -1])
def test_a_size_that_does_not_parse_says_how_to_write_one(bad):
    with pytest.raises(ValueError, match="is not a size"):
        parse_bytes(bad)


@pytest.mark.parametrize("bad", ["", "d", "7 days", "3mo", "-1h", True, -2])
def test_a_duration_that_does_not_parse_says_how_to_write_one(bad):
    with pytest.raises(ValueError, match="is not a duration"):
        parse_seconds(bad)
