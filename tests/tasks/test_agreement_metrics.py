"""The tasks' agreement metrics against hand-computed cases."""

import numpy as np
import pytest

from jetpipe.tasks import agreement_metrics


def test_topk_and_f1():
    ref = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1], [0.2, 0.3, 0.5]])
    cand = np.array([[0.2, 0.7, 0.1], [0.3, 0.6, 0.1], [0.6, 0.1, 0.3]])
    assert agreement_metrics.topk_agreement(ref, cand, 1) == pytest.approx(1 / 3)
    assert agreement_metrics.topk_agreement(ref, cand, 2) == pytest.approx(3 / 3)
    a = np.zeros((4, 4))
    a[:2] = 1
    b = np.zeros((4, 4))
    b[1:3] = 1
    assert agreement_metrics.binary_f1(a, b) == pytest.approx(2 * 4 / (8 + 8))
    assert agreement_metrics.binary_f1(np.zeros(3), np.zeros(3)) == 1.0


def test_detection_map():
    ref = [{"boxes": [[0, 0, 10, 10], [20, 20, 30, 30]], "scores": [1, 1], "classes": [0, 1]}]
    assert agreement_metrics.detection_map(ref, ref) == pytest.approx(1.0)
    half = [{"boxes": [[0, 0, 10, 10]], "scores": [0.9], "classes": [0]}]
    assert agreement_metrics.detection_map(ref, half) == pytest.approx(0.5)  # class 1 missed entirely
    shifted = [{"boxes": [[5, 5, 15, 15], [20, 20, 30, 30]], "scores": [0.9, 0.9], "classes": [0, 1]}]
    assert agreement_metrics.detection_map(ref, shifted) == pytest.approx(0.5)  # IoU 25/175 < 0.5 for class 0


def test_box_agreement_matches_one_to_one_by_class_and_reports_score_error():
    ref = [{"boxes": [[0, 0, 10, 10], [20, 20, 30, 30]], "scores": [0.9, 0.8], "classes": [0, 1]},
           {"boxes": [[0, 0, 10, 10]], "scores": [0.7], "classes": [2]}]
    cand = [{"boxes": [[0, 0, 10, 10], [20, 20, 30, 30], [50, 50, 60, 60]], "scores": [0.6, 0.8, 0.5],
             "classes": [0, 0, 1]},  # the second box has the wrong class: no match
            {"boxes": [[1, 0, 11, 10]], "scores": [0.75], "classes": [2]}]  # IoU 9/11
    a = agreement_metrics.box_agreement(ref, cand)
    assert (a["boxes_fp32"], a["boxes"]) == (3, 4)
    assert a["box_f1"] == pytest.approx(2 * 2 / 7)
    assert a["box_f1_min"] == pytest.approx(2 * 1 / 5)
    assert a["score_mae"] == pytest.approx((0.3 + 0.05) / 2)
    empty = [{"boxes": [], "scores": []}]
    assert agreement_metrics.box_agreement(empty, empty)["box_f1"] == 1.0


def test_box_agreement_sees_boxes_that_vanish():
    """What the old single relative-MAE figure hid: all boxes gone is F1 0, whatever the tensors' error."""
    ref = [{"boxes": [[0, 0, 10, 10]], "scores": [0.9], "classes": [0]}]
    gone = [{"boxes": [], "scores": [], "classes": []}]
    assert agreement_metrics.box_agreement(ref, gone)["box_f1"] == 0.0


def test_edit_distance_and_text_agreement():
    assert agreement_metrics.edit_distance("kitten", "sitting") == 3
    assert agreement_metrics.edit_distance("", "abc") == 3 and agreement_metrics.edit_distance("abc", "abc") == 0
    a = agreement_metrics.text_agreement(["hello", "world", "ab"], ["hello", "word", "abc"])
    assert a["exact"] == pytest.approx(1 / 3)
    assert a["cer"] == pytest.approx((0 + 1 + 1) / 12)
