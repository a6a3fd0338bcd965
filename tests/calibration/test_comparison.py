import numpy as np
import pytest

from jetpipe.calibration import comparison as m
from jetpipe.errors import JetpipeError


def test_tensor_errors_against_independent_formulas():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(1000)
    noise = 0.01 * rng.standard_normal(1000)
    e = m.tensor_errors(ref, ref + noise)
    assert e["max_abs"] == pytest.approx(np.abs(noise).max())
    assert e["mean_abs"] == pytest.approx(np.abs(noise).mean())
    cosine = ref @ (ref + noise) / (np.linalg.norm(ref) * np.linalg.norm(ref + noise))
    assert e["cosine"] == pytest.approx(cosine)
    assert e["snr_db"] == pytest.approx(10 * np.log10((ref ** 2).sum() / (noise ** 2).sum()))
    assert m.tensor_errors(ref, ref)["snr_db"] == float("inf")


def test_budget_parsing():
    assert m.parse_budget("f1>=0.99") == ("f1", ">=", 0.99)
    assert m.parse_budget(" top1_drop <= 0.5 ") == ("top1_drop", "<=", 0.5)
    with pytest.raises(JetpipeError, match="metric 'speed'"):
        m.parse_budget("speed>=1")
    with pytest.raises(JetpipeError, match="f1 is bounded with >="):
        m.parse_budget("f1<=0.5")
    with pytest.raises(JetpipeError, match="write METRIC>=VALUE"):
        m.parse_budget("f1 0.9")
