import cv2
import numpy as np
import pytest

from jetpipe.geometry import Letterbox, fit
from jetpipe.runtime.postprocess_gpu import COMPONENT, SUM_SCALE
from jetpipe.tasks import TaskError, get
from jetpipe.tasks.classification import Classification
from jetpipe.tasks.detection_yolo import YoloDetection
from jetpipe.tasks.text_detection import TextDetection

IDENTITY = Letterbox(1.0, 1.0, 0, 0)


def _box_640(src_hw=(720, 1280)):
    return fit(src_hw, (640, 640), "letterbox")[1]


def _yolo_v5(boxes_xywh, scores, classes, num_classes=3, n=50):
    out = np.zeros((n, 5 + num_classes), np.float32)
    for i, (xywh, s, c) in enumerate(zip(boxes_xywh, scores, classes)):
        out[i, :4], out[i, 4], out[i, 5 + c] = xywh, 1.0, s
    return out


def test_yolov5_and_yolov8_layouts_decode_nms_and_map_back():
    box = _box_640()  # 1280x720 source: scale 0.5, pad_y 140
    objects = [(320, 320, 100, 50), (322, 321, 100, 50), (100, 200, 40, 40), (320, 320, 100, 50)]
    scores, classes = [0.9, 0.8, 0.7, 0.6], [0, 0, 1, 2]  # #1 overlaps #0 (same class): suppressed
    v5 = _yolo_v5(objects, scores, classes)[None]
    v8 = np.concatenate([v5[:, :, :4], v5[:, :, 5:] * v5[:, :, 4:5]], axis=2).transpose(0, 2, 1)
    for out in (v5, v8):
        result = YoloDetection()({"out": out}, [box], [(720, 1280)])[0]
        assert sorted(result["classes"]) == [0, 1, 2]   # class-aware: #3 survives despite overlapping #0
        i = result["classes"].index(0)
        np.testing.assert_allclose(result["boxes"][i], [540, 310, 740, 410], atol=0.2)  # (x-50, y-25)*2 ...
        assert result["scores"][i] == pytest.approx(0.9)


def test_yolox_grid_decoding():
    det = YoloDetection(layout="yolox", input_hw=(64, 64), strides=(8, 16, 32))
    n = 8 * 8 + 4 * 4 + 2 * 2
    out = np.zeros((n, 6), np.float32)
    out[9, :] = [0.5, 0.5, np.log(2.0), np.log(1.0), 1.0, 0.95]  # cell (x=1, y=1) of stride 8
    xyxy, score, cls = det.decode(out)
    np.testing.assert_allclose(xyxy[9], [12 - 8, 12 - 4, 12 + 8, 12 + 4])
    assert score[9] == pytest.approx(0.95)


def test_text_detection_boxes_in_source_pixels():
    prob = np.zeros((1, 1, 640, 640), np.float32)
    prob[0, 0, 200:220, 100:300] = 0.9     # one text region
    prob[0, 0, 400:402, 400:402] = 0.9     # too small: dropped
    box = _box_640()
    result = TextDetection()({"p": prob}, [box], [(720, 1280)])[0]
    assert len(result["boxes"]) == 1 and result["scores"][0] == pytest.approx(0.9, abs=1e-4)
    x0, y0, x1, y1 = result["boxes"][0]
    d = 200 * 20 * 1.5 / (2 * 220)  # unclip distance in network pixels
    np.testing.assert_allclose([x0, y0, x1, y1], [(100 - d) * 2, (200 - d - 140) * 2, (300 + d) * 2,
                                                  (220 + d - 140) * 2], atol=0.2)


def test_classification_top_k_from_logits_and_probabilities():
    logits = np.array([[0.1, 3.0, 1.0, -2.0]], np.float32)
    result = Classification(top_k=2)({"y": logits}, [None], [(1, 1)])[0]
    assert result["classes"] == [1, 2]
    probs = np.exp(logits) / np.exp(logits).sum()
    again = Classification(top_k=2)({"y": probs}, [None], [(1, 1)])[0]
    np.testing.assert_allclose(again["scores"], result["scores"], atol=1e-5)


def test_unknown_task():
    with pytest.raises(TaskError, match="task 'segmentation': choose one of text-detection, segmentation-yolo, "
                                      "pose-yolo, detection-yolo"):
        get("segmentation")


def test_text_regions_come_in_reading_order():
    prob = np.zeros((1, 1, 200, 400), np.float32)
    prob[0, 0, 100:104, 300:380] = 0.9   # top row 100 at x 300, then reaching left to x 50 ...
    prob[0, 0, 104:120, 50:380] = 0.9
    prob[0, 0, 100:102, 200:250] = 0.8   # ... comes before this one (row 100 at x 200: first in raster order)
    prob[0, 0, 20:30, 350:390] = 0.7     # the top one
    result = TextDetection()({"p": prob}, [IDENTITY], [(200, 400)])[0]
    assert result["scores"] == [0.7, 0.9, 0.8]  # by top, then left


def _record(xs, ys, total) -> tuple:
    """What the GPU's reduction writes for a region of these pixels (its own arithmetic, written out)."""
    n = xs.size
    sums = [int(v.sum()) for v in (xs, ys, xs * xs, ys * ys, xs * ys)]
    mx, my = sums[0] / n, sums[1] / n
    cxx, cyy, cxy = sums[2] / n - mx * mx, sums[3] / n - my * my, sums[4] / n - mx * my
    angle = (0.5 * np.arctan2(2 * cxy, cxx - cyy) + np.pi / 4) % (np.pi / 2) - np.pi / 4
    angle = float(np.float32(angle - np.pi / 2 if angle > np.pi / 4 - 1e-6 else angle))
    along = ((xs + 0.5) * np.cos(angle) + (ys + 0.5) * np.sin(angle)) * 16
    across = ((ys + 0.5) * np.cos(angle) - (xs + 0.5) * np.sin(angle)) * 16
    return (xs.min(), ys.min(), xs.max(), ys.max(), n, angle, round(total * SUM_SCALE), *sums,
            int(np.floor(along.min())), int(np.ceil(along.max())), int(np.floor(across.min())),
            int(np.ceil(across.max())))


def _components(records) -> np.ndarray:
    """What the GPU's reduction writes for filled rectangles (inclusive corners) with these sums."""
    found = np.zeros(8, COMPONENT)
    for i, (x0, y0, x1, y1, _area, total) in enumerate(records):
        ys, xs = np.mgrid[y0:y1 + 1, x0:x1 + 1]
        found[i] = _record(xs.ravel(), ys.ravel(), total)
    return found


def test_text_detection_from_gpu_components_matches_the_cpu_path():
    prob = np.zeros((1, 1, 640, 640), np.float32)
    prob[0, 0, 200:220, 100:300] = 0.9
    prob[0, 0, 400:402, 400:402] = 0.9   # area 4: dropped
    prob[0, 0, 500:510, 500:520] = 0.4   # mean below box_threshold: dropped
    post, box = TextDetection(), _box_640()
    cpu = post({"p": prob}, [box], [(720, 1280)])
    found = _components([(100, 200, 299, 219, 4000, 0.9 * 4000), (400, 400, 401, 401, 4, 3.6),
                         (500, 500, 519, 509, 200, 80.0)])
    gpu = post.reduced({"counts": np.array([3]), "components": found[None]}, [box], [(720, 1280)])
    assert gpu == cpu and len(cpu[0]["boxes"]) == 1


def _rotated_line(centre, length, height, degrees, shape=(400, 600)) -> np.ndarray:
    prob = np.zeros((1, 1, *shape), np.float32)
    corners = cv2.boxPoints((centre, (length, height), degrees))
    cv2.fillPoly(prob[0, 0], [np.round(corners * 16).astype(np.int32)], 0.9, shift=4)
    return prob


def test_a_tilted_line_gets_its_rotated_quadrilateral_and_an_upright_one_its_box():
    post = TextDetection(unclip_ratio=0.0)  # no growth: the quad is the region itself
    result = post({"p": _rotated_line((300, 200), 240, 30, 20)}, [IDENTITY], [(400, 600)])[0]
    quad = np.array(result["quads"][0])
    top = quad[1] - quad[0]
    assert np.degrees(np.arctan2(top[1], top[0])) == pytest.approx(20, abs=1)
    assert np.linalg.norm(top) == pytest.approx(240, abs=3)
    assert np.linalg.norm(quad[3] - quad[0]) == pytest.approx(30, abs=2.5)  # whole pixels along its edges
    np.testing.assert_allclose(quad.mean(axis=0), (300.5, 200.5), atol=1)
    assert result["boxes"][0] == pytest.approx([*quad.min(axis=0), *quad.max(axis=0)], abs=0.1)
    upright = TextDetection()({"p": _rotated_line((300, 200), 240, 30, 2)}, [IDENTITY], [(400, 600)])[0]
    x0, y0, x1, y1 = upright["boxes"][0]
    assert upright["quads"][0] == [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def test_tilted_quadrilaterals_from_gpu_moments_match_the_cpu_path():
    prob = _rotated_line((300, 200), 240, 30, -15)
    post = TextDetection()
    cpu = post({"p": prob}, [IDENTITY], [(400, 600)])
    ys, xs = np.nonzero(prob[0, 0] > post.threshold)
    found = np.zeros(8, COMPONENT)
    found[0] = _record(xs, ys, float(prob[0, 0][ys, xs].astype(np.float64).sum()))
    gpu = post.reduced({"counts": np.array([1]), "components": found[None]}, [IDENTITY], [(400, 600)])
    assert gpu[0]["quads"] == cpu[0]["quads"] and gpu[0]["boxes"] == cpu[0]["boxes"]


def test_text_detection_counts_frames_with_more_regions_than_the_gpu_list():
    post = TextDetection(min_area=1)
    found = _components([(i * 10, 0, i * 10 + 4, 4, 25, 20.0) for i in range(8)])
    result = post.reduced({"counts": np.array([12]), "components": found[None]}, [IDENTITY], [(640, 640)])
    assert len(result[0]["boxes"]) == 8 and post.truncated_frames == 1


def test_classification_from_gpu_top_k_matches_the_cpu_path():
    rng = np.random.default_rng(0)
    for logits in (rng.normal(0, 2, (3, 10)), rng.dirichlet(np.ones(10), 3)):
        post = Classification(top_k=3)
        cpu = post({"y": logits.astype(np.float32)}, [None] * 3, [(1, 1)] * 3)
        top = np.argsort(-logits, axis=1)[:, :3]
        stats = np.stack([logits.max(1), logits.min(1), logits.sum(1), np.exp(logits - logits.max(1, keepdims=True))
                          .sum(1)], axis=1)
        gpu = post.reduced({"top_index": top, "top_value": np.take_along_axis(logits, top, 1), "stats": stats},
                           [None] * 3, [(1, 1)] * 3)
        assert gpu == cpu


def test_yolo_keeps_the_best_max_detections():
    objects = [(40 + 60 * i, 100, 40, 40) for i in range(9)]  # nine separate boxes
    out = _yolo_v5(objects, [0.5 + 0.05 * i for i in range(9)], [0] * 9)[None]
    result = YoloDetection(max_detections=4)({"out": out}, [IDENTITY], [(640, 640)])[0]
    assert result["scores"] == pytest.approx([0.9, 0.85, 0.8, 0.75])
    detections = np.zeros((1, 4, 6), np.float32)
    detections[0, :2] = [[10, 20, 50, 60, 0.9, 2], [100, 20, 150, 60, 0.8, 0]]
    gpu = YoloDetection(max_detections=4).reduced({"counts": np.array([2]), "detections": detections}, [IDENTITY],
                                                  [(640, 640)])[0]
    assert gpu == {"boxes": [[10.0, 20.0, 50.0, 60.0], [100.0, 20.0, 150.0, 60.0]], "scores": [0.9, 0.8],
                   "classes": [2, 0]}


def test_joined_rows_map_each_row_through_its_own_frame_as_frame_by_frame():
    from jetpipe.tasks.base import JoinedRows, boxes_to_source

    rng = np.random.default_rng(0)
    limit, frames = 6, 3
    found = rng.uniform(-80, 720, (4, limit, 4)).astype(np.float32)  # a batch of 4, 3 frames used
    counts = np.array([2, 0, 9, 5])  # frame 2's count past the limit: its first `limit` rows
    boxes = [Letterbox(0.5, 0.5, 0, 140), Letterbox(2.0, 1.5, 7, 0), Letterbox(1 / 3, 0.25, 3, 11)]
    sizes = [(720, 1280), (300, 200), (1080, 1920)]
    rows = JoinedRows.kept(counts, frames, limit)
    assert rows.counts == [2, 0, limit]
    joined = rows.take(found)
    mapped = rows.split(rows.to_source(joined.reshape(-1, 2, 2), boxes, sizes).reshape(-1, 4).tolist())
    for frame in range(frames):
        expected = boxes_to_source(found[frame, :rows.counts[frame]], boxes[frame], *sizes[frame])
        assert mapped[frame] == expected.tolist()  # the same float64 arithmetic: equal, not close
