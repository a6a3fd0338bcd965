"""The typed per-frame result: arrays in, the same JSON out (to the byte), objects taken by a mask."""

import json
from pathlib import Path

import numpy as np
import pytest

from jetpipe.tasks.detections import NO_TRACK, Detections

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "records_golden.jsonl"

RESULTS = [  # each task's record as it has always been written
    {"boxes": [[5.9, 40.9, 46.1, 64.6], [1, 2, 3, 4]], "scores": [0.9947, 0.5], "quads": [[[5.9, 40.9]] * 4] * 2},
    {"boxes": [[10.0, 20.0, 30.5, 40.25]], "scores": [0.875], "classes": [2], "labels": ["car"],
     "keypoints": [[[1.0, 2.0, 0.9]] * 17]},
    {"boxes": [], "scores": [], "classes": [], "polygons": [], "mask_areas": []},
    {"classes": [3, 1, 0], "scores": [0.9, 0.05, 0.01], "labels": ["d", "b", "a"]},
    {"text": "hello", "score": 0.98},
    {"classes": [0, 4], "counts": [10, 20], "regions": [{"class": 4, "polygon": [[0, 0], [1, 0], [1, 1]]}]},
]


@pytest.mark.parametrize("results", RESULTS + [json.loads(line)["results"] for line in GOLDEN.read_text().splitlines()])
def test_a_results_dict_comes_back_as_it_was_to_the_byte(results):
    detections = Detections.from_results(results)
    assert json.dumps(detections.to_results()) == json.dumps(results)


def test_the_arrays_of_a_results_dict():
    det = Detections.from_results(RESULTS[1])
    assert len(det) == 1 and det.xyxy.dtype == np.float32 and det.xyxy.shape == (1, 4)
    assert det.class_id.tolist() == [2] and det.names() == ["car"] and det.data["keypoints"] == RESULTS[1]["keypoints"]
    assert det.tracker_id is None and det.track_ids.tolist() == [NO_TRACK] and det.has_boxes
    text = Detections.from_results(RESULTS[0])
    assert text.class_id is None and text.class_ids.tolist() == [0, 0] and text.names() is None
    classifier = Detections.from_results(RESULTS[3])
    assert len(classifier) == 0 and not classifier.has_boxes and classifier.frame_data["classes"] == [3, 1, 0]


def test_a_tracker_and_a_secondary_add_their_keys_at_the_end():
    det = Detections.from_results(RESULTS[0])
    det.tracker_id = np.array([7, NO_TRACK])
    det.secondary["text"] = [{"text": "a"}, None]
    assert list(det.to_results()) == ["boxes", "scores", "quads", "track_ids", "secondary"]
    written = det.to_results()
    assert written["track_ids"] == [7, None] and written["secondary"] == {"text": [{"text": "a"}, None]}


def test_objects_taken_by_a_mask_keep_every_per_object_value_together():
    det = Detections.from_results(RESULTS[0])
    det.tracker_id = np.array([7, 8])
    det.secondary["text"] = ["first", "second"]
    kept = det[det.confidence > 0.9]
    assert len(kept) == 1 and kept.tracker_id.tolist() == [7] and kept.secondary["text"] == ["first"]
    assert kept.to_results() == {"boxes": [[5.9, 40.9, 46.1, 64.6]], "scores": [0.9947],
                                 "quads": [[[5.9, 40.9]] * 4], "track_ids": [7], "secondary": {"text": ["first"]}}
    assert len(det[[1, 0]]) == 2 and det[[1, 0]].xyxy[0].tolist() == [1, 2, 3, 4]


def test_arrays_made_by_a_task_write_the_json_a_results_dict_would():
    quads = np.array([[[5.9, 40.9], [46.1, 40.9], [46.1, 64.6], [5.9, 64.6]]])
    made = Detections(np.array([[5.9, 40.9, 46.1, 64.6]]), np.array([0.9947]), data={"quads": quads},
                      layout=("boxes", "scores", "quads"))
    given = {"boxes": [[5.9, 40.9, 46.1, 64.6]], "scores": [0.9947], "quads": quads.tolist()}
    assert json.dumps(made.to_results()) == json.dumps(given)  # float32 boxes, rounded as the task rounds them
    named = Detections(np.zeros((2, 4)), np.ones(2), np.array([1, 5]), labels=("a", "b"),
                       layout=("boxes", "scores", "classes", "labels"))
    assert named.to_results()["labels"] == ["b", "5"] and named.to_results()["classes"] == [1, 5]
