"""Stored calibration: round trip, reuse only when model, method and data match, clear errors."""

import pytest

from jetpipe.convert import calib_cache
from jetpipe.convert.calib_cache import CalibrationResult
from jetpipe.errors import CalibrationError


def _result():
    return CalibrationResult("a" * 64, "percentile", "b" * 64, samples=8, skipped=1, ranges={"x": 1.5},
                             absmax={"x": 2.0, "y": 3.0}, auto_excluded={"conv1": "sensitive"})


def test_round_trip(tmp_path):
    calib_cache.save(_result(), tmp_path)
    assert calib_cache.load(tmp_path) == _result()
    assert calib_cache.load(tmp_path / "calibration.json") == _result()


def test_mismatch_names_what_differs():
    cached = _result()
    assert calib_cache.mismatch(cached, cached.key()) is None
    assert "calibration method differs" in calib_cache.mismatch(cached, {**cached.key(), "method": "entropy"})
    assert "its model differs" in calib_cache.mismatch(cached, {**cached.key(), "model_sha256": "c" * 64})
    assert "calibration data or preprocessing differs" in calib_cache.mismatch(
        cached, {**cached.key(), "data_fingerprint": "d" * 64})


def test_missing_and_corrupt_caches_are_one_line(tmp_path):
    with pytest.raises(CalibrationError, match="not found: pass a bundle folder"):
        calib_cache.load(tmp_path / "nowhere")
    (tmp_path / "calibration.json").write_text("{not json")
    with pytest.raises(CalibrationError, match="is not a jetpipe calibration file"):
        calib_cache.load(tmp_path)
