"""What the frame sinks draw for each task's records: class names where the bundle has them, read text."""

import numpy as np

from jetpipe.pipelines.annotate import draw


def _drawn(results) -> np.ndarray:
    image = np.zeros((120, 320, 3), np.uint8)
    return draw(image, results, (120, 320))


def _label_width(image, row) -> int:
    """Width of the filled label box on `row` (the label is drawn as a filled rectangle + text)."""
    return int(np.count_nonzero(image[row].any(axis=1)))


def test_boxes_are_labelled_with_class_names_where_the_record_has_them():
    box = {"boxes": [[10, 60, 100, 110]], "scores": [0.9], "classes": [1]}
    named = _drawn({**box, "labels": ["a-very-long-class-name"]})
    numbered = _drawn(box)
    assert _label_width(named, 52) > _label_width(numbered, 52) + 40


def test_a_recognizers_text_is_written_top_left():
    image = _drawn({"text": "jetpipe reads", "score": 0.97})
    assert _label_width(image, 8) > 60
    assert not _drawn({"text": "", "score": 0.0})[40:].any()
