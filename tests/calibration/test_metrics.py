import numpy as np
import pytest

from jetpipe.calibration import metrics as m
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


def test_topk_and_f1():
    ref = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1], [0.2, 0.3, 0.5]])
    cand = np.array([[0.2, 0.7, 0.1], [0.3, 0.6, 0.1], [0.6, 0.1, 0.3]])
    assert m.topk_agreement(ref, cand, 1) == pytest.approx(1 / 3)
    assert m.topk_agreement(ref, cand, 2) == pytest.approx(3 / 3)
    a = np.zeros((4, 4))
    a[:2] = 1
    b = np.zeros((4, 4))
    b[1:3] = 1
    assert m.binary_f1(a, b) == pytest.approx(2 * 4 / (8 + 8))
    assert m.binary_f1(np.zeros(3), np.zeros(3)) == 1.0


def test_detection_map():
    ref = [{"boxes": [[0, 0, 10, 10], [20, 20, 30, 30]], "scores": [1, 1], "classes": [0, 1]}]
    assert m.detection_map(ref, ref) == pytest.approx(1.0)
    half = [{"boxes": [[0, 0, 10, 10]], "scores": [0.9], "classes": [0]}]
    assert m.detection_map(ref, half) == pytest.approx(0.5)  # class 1 missed entirely
    shifted = [{"boxes": [[5, 5, 15, 15], [20, 20, 30, 30]], "scores": [0.9, 0.9], "classes": [0, 1]}]
    assert m.detection_map(ref, shifted) == pytest.approx(0.5)  # IoU 25/175 < 0.5 for class 0


def test_budget_parsing():
    assert m.parse_budget("f1>=0.99") == ("f1", ">=", 0.99)
    assert m.parse_budget(" top1_drop <= 0.5 ") == ("top1_drop", "<=", 0.5)
    with pytest.raises(JetpipeError, match="metric 'speed'"):
        m.parse_budget("speed>=1")
    with pytest.raises(JetpipeError, match="f1 is bounded with >="):
        m.parse_budget("f1<=0.5")
    with pytest.raises(JetpipeError, match="write METRIC>=VALUE"):
        m.parse_budget("f1 0.9")
