"""pose-yolo and segmentation-yolo: the CPU path against Ultralytics' own postprocessing (tests/data/
ultralytics_reference.npz, written by scripts/make_ultralytics_reference.py with Ultralytics 8.4: its
non_max_suppression, its pose predictor's keypoints, its process_mask), recognition from the outputs and
metadata real exports carry, records, the metric and the drawing."""

from pathlib import Path

import cv2
import numpy as np
import pytest

from jetpipe.geometry import Letterbox, fit
from jetpipe.pipelines.outputs.annotate import draw
from jetpipe.tasks import ModelFacts, TaskError, TaskOptions, choose, detect, for_bundle, get
from jetpipe.tasks.segmentation_yolo import polygon_mask

REFERENCE = Path(__file__).parents[1] / "data" / "ultralytics_reference.npz"
IDENTITY = Letterbox(1.0, 1.0, 0, 0)
# the I/O and metadata of real exports (Ultralytics 8.4.190, yolov8n-pose.yaml / yolov8n-seg.yaml, imgsz 320)
POSE_EXPORT = ModelFacts((("output0", ("batch", 56, 2100)),), (320, 320),
                         {"task": "pose", "kpt_shape": "[17, 3]", "names": "{0: '0'}", "imgsz": "[320, 320]"})
SEG_EXPORT = ModelFacts((("output0", ("batch", 116, 2100)), ("output1", ("batch", 32, 80, 80))), (320, 320),
                        {"task": "segment", "names": str({i: str(i) for i in range(80)}), "imgsz": "[320, 320]"})


@pytest.fixture(scope="module")
def ref():
    return dict(np.load(REFERENCE))


def _options(task, facts):
    return TaskOptions.of(facts, get(task).labels(facts))


def _pose_facts(ref, metadata=None):
    size = int(ref["size"])
    return ModelFacts((("output0", tuple(ref["pose_head"].shape)),), (size, size),
                      {"task": "pose", "kpt_shape": "[17, 3]"} if metadata is None else metadata)


def _seg_facts(ref):
    size = int(ref["size"])
    return ModelFacts((("output0", tuple(ref["seg_head"].shape)), ("output1", tuple(ref["seg_protos"].shape))),
                      (size, size), {"task": "segment"})


def test_pose_results_are_ultralytics_own(ref):
    size = int(ref["size"])
    post = get("pose-yolo").postprocessor(_options("pose-yolo", _pose_facts(ref)))
    assert (post.classes, post.keypoints) == (1, (17, 3))
    result = post({"output0": ref["pose_head"]}, [IDENTITY], [(size, size)])[0]
    assert len(result["boxes"]) == len(ref["pose_boxes"]) == 7
    np.testing.assert_allclose(result["boxes"], ref["pose_boxes"], atol=0.051)
    np.testing.assert_allclose(result["scores"], ref["pose_scores"], atol=5e-5)
    assert result["classes"] == ref["pose_classes"].astype(int).tolist()
    np.testing.assert_allclose(result["keypoints"], ref["pose_keypoints"], atol=5e-4)


def test_segmentation_results_and_masks_are_ultralytics_own(ref):
    size = int(ref["size"])
    post = get("segmentation-yolo").postprocessor(_options("segmentation-yolo", _seg_facts(ref)))
    assert (post.classes, post.coefficients) == (3, 32)
    # output order as the export writes it: the prototypes may come first
    result = post({"output1": ref["seg_protos"], "output0": ref["seg_head"]}, [IDENTITY], [(size, size)])[0]
    assert len(result["boxes"]) == len(ref["seg_boxes"]) == 6
    np.testing.assert_allclose(result["boxes"], ref["seg_boxes"], atol=0.051)
    np.testing.assert_allclose(result["scores"], ref["seg_scores"], atol=5e-5)
    assert result["classes"] == ref["seg_classes"].astype(int).tolist()
    masks = np.unpackbits(ref["seg_masks"], axis=-1, count=size).astype(bool)
    for polygon, area, mask in zip(result["polygons"], result["mask_areas"], masks):
        assert area == pytest.approx(mask.sum(), abs=max(2, 0.01 * mask.sum()))  # its pixels, not the outline's
        count, parts = cv2.connectedComponents(mask.astype(np.uint8), connectivity=8)
        largest = parts == 1 + np.argmax([(parts == k).sum() for k in range(1, count)])
        drawn = polygon_mask(polygon, (size, size))
        assert (drawn & largest).sum() >= 0.95 * largest.sum()  # the outline goes around the largest part
        assert (drawn & mask).sum() >= 0.8 * drawn.sum()  # and little else (holes inside it)


def test_keypoints_and_outlines_are_mapped_to_the_source(ref):
    size = int(ref["size"])
    letterbox = fit((90, 160), (size, size), "letterbox")[1]  # content 160x90 centred: pad 35 above
    pose = get("pose-yolo").postprocessor(_options("pose-yolo", _pose_facts(ref)))
    plain = pose({"o": ref["pose_head"]}, [IDENTITY], [(size, size)])[0]
    mapped = pose({"o": ref["pose_head"]}, [letterbox], [(90, 160)])[0]
    expected = letterbox.to_source(np.asarray(plain["keypoints"])[..., :2])
    expected[..., 0], expected[..., 1] = expected[..., 0].clip(0, 160), expected[..., 1].clip(0, 90)
    np.testing.assert_allclose(np.asarray(mapped["keypoints"])[..., :2], expected, atol=2e-3)
    np.testing.assert_allclose(np.asarray(mapped["keypoints"])[..., 2], np.asarray(plain["keypoints"])[..., 2])
    seg = get("segmentation-yolo").postprocessor(_options("segmentation-yolo", _seg_facts(ref)))
    outputs = {"output0": ref["seg_head"], "output1": ref["seg_protos"]}
    plain, mapped = seg(outputs, [IDENTITY], [(size, size)])[0], seg(outputs, [letterbox], [(90, 160)])[0]
    for a, b in zip(plain["polygons"], mapped["polygons"]):
        np.testing.assert_allclose(b, np.round(letterbox.to_source(np.asarray(a)), 1), atol=0.051)
    np.testing.assert_allclose(mapped["mask_areas"], np.asarray(plain["mask_areas"]) / letterbox.scale_x ** 2,
                               rtol=1e-3)


def test_a_frame_with_nothing_gives_empty_lists(ref):
    size = int(ref["size"])
    quiet = ref["pose_head"].copy()
    quiet[:, 4] = 0.01
    result = get("pose-yolo").postprocessor(_options("pose-yolo", _pose_facts(ref)))(
        {"o": quiet}, [IDENTITY], [(size, size)])[0]
    assert result["boxes"] == [] and result["keypoints"] == []
    head = ref["seg_head"].copy()
    head[:, 4:7] = 0.01
    result = get("segmentation-yolo").postprocessor(_options("segmentation-yolo", _seg_facts(ref)))(
        {"output0": head, "output1": ref["seg_protos"]}, [IDENTITY], [(size, size)])[0]
    assert result["boxes"] == [] and result["polygons"] == [] and result["mask_areas"] == []


def test_real_exports_are_recognized_and_other_tasks_refuse_them():
    assert detect(POSE_EXPORT)[0].name == "pose-yolo"
    assert detect(SEG_EXPORT)[0].name == "segmentation-yolo"
    # without the export's metadata, 56 rows are a 52-class detector as much as a pose head: not picked unasked
    assert detect(ModelFacts(POSE_EXPORT.outputs, (320, 320), {}))[0].name == "detection-yolo"
    # the prototypes' shape is distinctive: a seg head is picked without metadata too
    assert detect(ModelFacts(SEG_EXPORT.outputs, (320, 320), {}))[0].name == "segmentation-yolo"
    with pytest.raises(TaskError, match="Ultralytics 'pose' model, not a detector"):
        choose("detection-yolo", POSE_EXPORT)
    with pytest.raises(TaskError, match="Ultralytics 'segment' model, not a detector"):
        choose("detection-yolo", SEG_EXPORT)
    with pytest.raises(TaskError, match=r"expects one output .*the model has 2: output0"):
        choose("detection-yolo", ModelFacts(SEG_EXPORT.outputs, (320, 320), {}))
    with pytest.raises(TaskError, match="Ultralytics 'pose' model, not a segmentation model"):
        choose("segmentation-yolo", POSE_EXPORT)
    with pytest.raises(TaskError, match="expects two outputs"):
        choose("segmentation-yolo", ModelFacts(POSE_EXPORT.outputs, (320, 320), {}))
    with pytest.raises(TaskError, match="prototypes of 80x80"):
        choose("segmentation-yolo", ModelFacts((SEG_EXPORT.outputs[0], ("output1", ("batch", 32, 40, 40))),
                                               (320, 320), {}))
    assert get("segmentation-yolo").postprocessor(_options("segmentation-yolo", SEG_EXPORT)).classes == 80


def test_a_bundle_keeps_the_metadata_serve_recognizes_the_task_by():
    manifest = {"io": {"outputs": [{"name": "output0", "shape": ["batch", 56, 2100]}]}, "input_size": [320, 320],
                "labels": ["person"], "metadata": {"task": "pose", "kpt_shape": "[17, 3]"}}
    task, options = for_bundle(manifest)
    assert task.name == "pose-yolo" and options.metadata["kpt_shape"] == "[17, 3]"
    with pytest.raises(TaskError, match="not a detector"):
        for_bundle(manifest, "detection-yolo")
    old = {**manifest, "metadata": None, "labels": None}  # a bundle written before bundles kept it: as before
    assert for_bundle(old)[0].name == "detection-yolo"


def test_the_metrics_see_keypoints_and_masks_move(ref):
    pose_options = _options("pose-yolo", _pose_facts(ref))
    moved = ref["pose_head"].copy()
    moved[:, 5::3] += 3.0  # every keypoint 3 px to the right; boxes unchanged
    same = get("pose-yolo").metric([ref["pose_head"]], [ref["pose_head"]], pose_options)
    shifted = get("pose-yolo").metric([ref["pose_head"]], [moved], pose_options)
    assert same["oks"] == 1.0 and same["box_f1"] == 1.0
    assert shifted["box_f1"] == 1.0 and 0.2 < shifted["oks"] < 0.95
    seg_options = _options("segmentation-yolo", _seg_facts(ref))
    flipped = ref["seg_protos"].copy()
    flipped[:, :, :, :] = flipped[:, :, ::-1, :]  # other masks, same boxes
    outputs = [ref["seg_head"], ref["seg_protos"]]
    assert get("segmentation-yolo").metric(outputs, outputs, seg_options)["mask_iou"] == 1.0
    other = get("segmentation-yolo").metric(outputs, [ref["seg_head"], flipped], seg_options)
    assert other["box_f1"] == 1.0 and other["mask_iou"] < 0.8


def test_masks_and_skeletons_are_drawn():
    image = np.zeros((200, 200, 3), np.uint8)
    square = [[50, 50], [150, 50], [150, 150], [50, 150]]
    draw(image, {"boxes": [[50, 50, 150, 150]], "scores": [0.9], "classes": [0], "polygons": [square],
                 "mask_areas": [10000.0]}, (200, 200))
    assert image[100, 100].any() and not image[20, 100].any()  # filled inside, nothing outside
    assert image[100, 100].max() < 255  # translucent: blended with the (black) frame
    image = np.zeros((200, 200, 3), np.uint8)
    points = [[0, 0, 0.0]] * 17
    points[5], points[7] = [60, 60, 0.9], [140, 140, 0.9]  # left shoulder -> left elbow: a limb of COCO's
    draw(image, {"boxes": [[40, 40, 160, 160]], "scores": [0.9], "classes": [0], "keypoints": [points]}, (200, 200))
    assert image[100, 100].any()  # on the limb
    assert not image[1, 1].any()  # the unseen keypoint at the corner is not drawn


def _pack_masks(post, head, protos, capacity: int) -> dict:
    """What the yolo-seg reduction hands back for one frame, written here from its documented layout: the CPU
    path's kept boxes (float32) and each box's mask over mask_region, one bit a pixel (bit i of a word: its
    i-th pixel from the left), rows padded to words, box after box, none past `capacity` words."""
    from jetpipe.tasks.detection_yolo import nms_yolov8
    from jetpipe.tasks.segmentation_yolo import mask_region, region_words

    columns, xyxy, score, cls = nms_yolov8(head[0], post.classes, post.score_threshold, post.iou_threshold,
                                           post.max_detections)
    detections = np.zeros((1, post.max_detections, 6), np.float32)
    detections[0, :len(columns)] = np.concatenate([xyxy, score[:, None], cls[:, None]], axis=1)
    words, start = np.zeros((1, capacity), np.uint32), 0
    coefficients = head[0][4 + post.classes:, columns].T
    for corners, c in zip(detections[0, :len(columns), :4], coefficients):
        x0, y0, x1, y1 = mask_region(corners, post.input_hw)
        count = int(region_words(np.array([[x0, y0, x1, y1]]))[0])
        if count and start + count <= capacity:
            mask, *_ = post.object_mask(c, protos[0], corners.astype(np.float64))
            padded = np.zeros((y1 - y0, count // (y1 - y0) * 32), np.uint8)
            padded[:, :x1 - x0] = mask
            words[0, start:start + count] = np.packbits(padded, axis=1, bitorder="little").view(np.uint32).ravel()
        start += count
    return {"counts": np.array([len(columns)], np.int32), "detections": detections, "masks": words}


def test_masks_handed_back_as_bits_are_finished_as_the_cpu_path(ref, caplog):
    """reduced() reads each mask the GPU hands back as words (its outline did not fit the device) and traces it as
    the CPU path does; boxes past the words' capacity get no outline, said once."""
    size = int(ref["size"])
    post = get("segmentation-yolo").postprocessor(_options("segmentation-yolo", _seg_facts(ref)))
    outputs = {"output0": ref["seg_head"], "output1": ref["seg_protos"]}
    cpu = post(outputs, [IDENTITY], [(size, size)])[0]
    packed = _pack_masks(post, ref["seg_head"], ref["seg_protos"], capacity=8 * size * size // 32)
    gpu = post.reduced(_outline_table(post, packed, set(range(6))), [IDENTITY], [(size, size)])[0]
    assert gpu["polygons"] == cpu["polygons"] and gpu["mask_areas"] == cpu["mask_areas"]
    assert gpu["classes"] == cpu["classes"] and len(cpu["polygons"]) == 6
    np.testing.assert_allclose(gpu["boxes"], cpu["boxes"], atol=0.051)
    small = _pack_masks(post, ref["seg_head"], ref["seg_protos"], capacity=300)  # room for the first few only
    small = _outline_table(post, small, set(range(6)))
    caplog.clear()  # what reduced() says, not the table's tracing
    with caplog.at_level("WARNING"):
        cut = post.reduced(small, [IDENTITY], [(size, size)])[0]
    kept = sum(1 for p in cut["polygons"] if p)
    assert 0 < kept < 6 and cut["polygons"][:kept] == cpu["polygons"][:kept]
    assert all(p == [] for p in cut["polygons"][kept:]) and cut["mask_areas"][kept:] == [0.0] * (6 - kept)
    assert "have no outline" in caplog.text


def _outline_table(post, packed: dict, spilled: set[int]) -> dict:
    """The yolo-seg reduction's outlines for `packed` as its layout documents them (first point, points, pixels;
    int16 points in the order the boxes took their room), traced here; the boxes in `spilled` marked -1 with
    their words kept (the device had no room), the others' words cleared; boxes past the words marked -2."""
    from dataclasses import replace

    from jetpipe.tasks.segmentation_yolo import OUTLINE_TOLERANCE, mask_regions, region_words, trace_outlines

    count = int(packed["counts"][0])
    kept = packed["detections"][0, :count, :4]
    tracer = replace(post)  # its warning of masks past the words is not the one under test
    outlines, pixels = trace_outlines(tracer.unpack(kept, packed["masks"][0]), OUTLINE_TOLERANCE)
    table, points, first = np.zeros((1, count, 3), np.int32), np.zeros((1, 4096, 2), np.int16), 0
    words, ends = np.zeros_like(packed["masks"]), np.cumsum(region_words(mask_regions(kept, post.input_hw)))
    for box in reversed(range(count)):  # the device's boxes take their room in any order
        n = len(outlines[box])
        if ends[box] > packed["masks"].shape[1]:
            table[0, box] = (0, -2, 0)
            continue
        table[0, box] = (first, -1 if box in spilled else n, pixels[box])
        if box in spilled:
            start = ends[box - 1] if box else 0
            words[0, start:ends[box]] = packed["masks"][0, start:ends[box]]
        else:
            points[0, first:first + n] = outlines[box]
            first += n
    return {**packed, "masks": words, "outlines": table, "points": points}


def test_outlines_handed_back_are_the_cpu_paths_and_masks_spilled_are_traced(ref):
    """reduced() takes each box's outline from the GPU's table and points; a box the device had no room for is
    traced here from its words: the records are the CPU path's either way."""
    size = int(ref["size"])
    post = get("segmentation-yolo").postprocessor(_options("segmentation-yolo", _seg_facts(ref)))
    cpu = post({"output0": ref["seg_head"], "output1": ref["seg_protos"]}, [IDENTITY], [(size, size)])[0]
    packed = _pack_masks(post, ref["seg_head"], ref["seg_protos"], capacity=8 * size * size // 32)
    for spilled in (set(), {1, 4}, set(range(6))):
        gpu = post.reduced(_outline_table(post, packed, spilled), [IDENTITY], [(size, size)])[0]
        assert gpu["polygons"] == cpu["polygons"] and gpu["mask_areas"] == cpu["mask_areas"]
        assert len(cpu["polygons"]) == 6 and all(cpu["polygons"])


def test_outlines_are_simplified_to_within_half_a_pixel(ref):
    """Each polygon keeps to within half a network pixel of its mask's traced outline (OpenCV's, as Ultralytics'
    masks.xy) with fewer points: what a record carries and a JSON sink writes, 30 objects a frame."""
    from jetpipe.tasks.segmentation_yolo import OUTLINE_TOLERANCE, trace_outlines

    assert OUTLINE_TOLERANCE == 0.5
    size = int(ref["size"])
    masks = np.unpackbits(ref["seg_masks"], axis=-1, count=size).astype(bool)
    outlines, pixels = trace_outlines([(m, 0, 0) for m in masks], OUTLINE_TOLERANCE)
    traced, _ = trace_outlines([(m, 0, 0) for m in masks], 0.0)
    assert pixels.tolist() == [float(m.sum()) for m in masks]
    assert sum(map(len, outlines)) < 0.75 * sum(map(len, traced))
    for polygon, full in zip(outlines, traced):
        contour = polygon.astype(np.float32).reshape(-1, 1, 2)
        assert max(abs(cv2.pointPolygonTest(contour, (float(x), float(y)), True)) for x, y in full) <= 0.5 + 1e-6
    post = get("segmentation-yolo").postprocessor(_options("segmentation-yolo", _seg_facts(ref)))
    result = post({"output0": ref["seg_head"], "output1": ref["seg_protos"]}, [IDENTITY], [(size, size)])[0]
    assert [len(p) for p in result["polygons"]] == [len(o) for o in outlines]
