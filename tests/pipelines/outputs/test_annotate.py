"""What the frame sinks draw for each task's records: class names where the bundle has them, speeds, read text."""

import numpy as np

from jetpipe.pipelines.outputs.annotate import draw


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


def test_a_tracked_box_on_a_calibrated_stream_shows_its_speed():
    box = {"boxes": [[10, 60, 100, 110]], "scores": [0.9], "classes": [1], "track_ids": [4]}
    fast = _drawn({**box, "ground_m": [[3.0, 20.0]], "speed_kmh": [48.2], "heading_deg": [90]})
    unknown = _drawn({**box, "ground_m": [[3.0, 20.0]], "speed_kmh": [None], "heading_deg": [None]})
    assert _label_width(fast, 52) > _label_width(unknown, 52) + 30 == _label_width(_drawn(box), 52) + 30


def test_a_recognizers_text_is_written_top_left():
    image = _drawn({"text": "jetpipe reads", "score": 0.97})
    assert _label_width(image, 8) > 60
    assert not _drawn({"text": "", "score": 0.0})[40:].any()


def test_zones_and_lines_are_drawn_with_their_counts_and_the_in_side():
    from jetpipe.pipelines.outputs.annotate import draw_scene

    image = np.zeros((400, 400, 3), np.uint8)
    scene = [("line", [(400.0, 0.0), (400.0, 800.0)], "door: in 2, out 3"),  # source pixels, drawn top to bottom
             ("zone", [(40.0, 500.0), (300.0, 500.0), (300.0, 780.0), (40.0, 780.0)], "waiting: 1 in, 4 entered")]
    draw_scene(image, scene, (800, 800))  # the image is half the source's size
    cyan = (image[..., 0] > 100) & (image[..., 1] > 100) & (image[..., 2] < 60)  # anti-aliased
    assert cyan[100:300, 199:202].any(axis=1).all()  # the line at x = 400 / 2, all along
    assert cyan[260, 20:150].any() and cyan[250:390, 20].any()  # the zone's top and left edges
    # the "in" arrow: from the middle of the line towards larger x (a line drawn downwards counts moving right
    # as "in"), nothing of it to the left
    assert cyan[200, 205:225].all() and not cyan[195:205, 175:195].any()
