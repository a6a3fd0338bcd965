"""GPU postprocessing (marker gpu) against the CPU postprocessors, which CI runs everywhere.

Text detection on real PP-OCRv4 det outputs and on made-up probability maps whose
components are hard for union-find (diagonal links, U shapes, one pixel wide);
classification on logits and probabilities; YOLO (v8, v5, YOLOX layouts) on made-up
outputs with many overlapping boxes, a frame with none and a frame with more than K; pose
keypoints and instance masks on real outputs of Ultralytics exports (tests/data) and on
made-up crowds; semantic class maps with ties and more than 256 classes.
"""

from pathlib import Path

import numpy as np
import pytest

from jetpipe.frames import from_bgr
from jetpipe.geometry import Letterbox, fit
from jetpipe.runtime.api import Frame, Reduction, TensorSpec
from jetpipe.synth import render_text_image
from jetpipe.tasks.classification import Classification
from jetpipe.tasks.detection_yolo import YoloDetection, nms_yolov8
from jetpipe.tasks.pose_yolo import YoloPose
from jetpipe.tasks.segmentation_yolo import OUTLINE_TOLERANCE, YoloSegmentation, polygon_mask, trace_outlines
from jetpipe.tasks.semantic_segmentation import SemanticSegmentation
from jetpipe.tasks.text_detection import TextDetection

pytestmark = pytest.mark.gpu

IDENTITY = Letterbox(1.0, 1.0, 0, 0)


@pytest.fixture(scope="module")
def module(device):
    from jetpipe.runtime.kernels import SOURCE, compile_module
    from jetpipe.runtime.postprocess_gpu import SOURCE_NAME

    with device.active():
        return compile_module(SOURCE.with_name(SOURCE_NAME))


def _reduce(device, module, reduction, outputs, letterboxes=None) -> dict:
    """Upload `outputs` (one array, or a list: the model's outputs in order), run the reducer (told where the
    frames are by `letterboxes` if given), return its compact host arrays and, as "written", the bytes its
    kernels wrote into mapped host memory."""
    from jetpipe.runtime.postprocess_gpu import make_reducer

    arrays = [np.ascontiguousarray(o, np.float32) for o in (outputs if isinstance(outputs, list) else [outputs])]
    specs = [TensorSpec(f"out{i}", np.dtype(np.float32), a.shape[1:]) for i, a in enumerate(arrays)]
    batch = len(arrays[0])
    with device.active():
        reducer = make_reducer(reduction, device, module, batch, 1, specs)
        stream = device.stream()
        buffers = [device.alloc(a.nbytes) for a in arrays]
        for buffer, array in zip(buffers, arrays):
            device.cuda.memcpy_htod(buffer, array)
        if letterboxes is not None:
            reducer.place(0, letterboxes)
        reducer.launch(0, batch, [int(b) for b in buffers], stream)
        reducer.download(0, batch, stream)
        stream.synchronize()
        arrays = {**{k: v.copy() for k, v in reducer.host(0, batch).items()}, "written": reducer.written(0, batch)}
        if hasattr(reducer, "cap_words"):  # instance masks: the words the outlines were traced from, too
            arrays["device_words"] = np.zeros((batch, reducer.cap_words), np.uint32)
            device.cuda.memcpy_dtoh(arrays["device_words"], reducer.words)
        return arrays


def _same_text_results(gpu: list[dict], cpu: list[dict]) -> None:
    for g, c in zip(gpu, cpu, strict=True):
        assert len(g["boxes"]) == len(c["boxes"])
        if c["boxes"]:
            np.testing.assert_allclose(g["boxes"], c["boxes"], atol=1.0)
            # the same rectangles (a region at 45 degrees may name its corners from either side)
            np.testing.assert_allclose(np.sort(g["quads"], axis=1), np.sort(c["quads"], axis=1), atol=1.0)
            np.testing.assert_allclose(g["scores"], c["scores"], atol=1e-3)


def _hard_maps() -> np.ndarray:
    rng = np.random.default_rng(3)
    maps = np.zeros((4, 1, 96, 128), np.float32)
    maps[0, 0] = rng.random((96, 128)) ** 4  # speckle: many small components
    maps[1, 0, 10:60, 10] = maps[1, 0, 59, 10:50] = maps[1, 0, 10:60, 49] = 0.9  # U: joins late in the scan
    for i in range(40):  # a diagonal staircase: 8-connected only
        maps[1, 0, 40 + i // 2, 60 + i] = 0.8
    maps[2, 0] = rng.random((96, 128)).astype(np.float32) * 0.2  # nothing above threshold
    maps[3, 0] = 0.95  # one component filling the frame
    maps[3, 0, 50, :] = 0.1
    return maps


def test_components_match_cpu_on_hard_maps(device, module):
    post = TextDetection(min_area=1, box_threshold=0.0)
    maps = _hard_maps()
    reduced = _reduce(device, module, post.reduction(), maps)
    sizes = [(96, 128)] * len(maps)
    cpu = post({"out": maps}, [IDENTITY] * len(maps), sizes)
    _same_text_results(post.reduced(reduced, [IDENTITY] * len(maps), sizes), cpu)
    assert reduced["counts"][2] == 0 and len(cpu[0]["boxes"]) > 50


def test_components_beyond_the_limit_are_counted(device, module):
    post = TextDetection(min_area=1, box_threshold=0.0, max_components=5)
    maps = _hard_maps()[:1]
    reduced = _reduce(device, module, post.reduction(), maps)
    assert reduced["counts"][0] > 5
    results = post.reduced(reduced, [IDENTITY], [(96, 128)])
    assert len(results[0]["boxes"]) == 5 and post.truncated_frames == 1


@pytest.fixture(scope="module")
def det_bundle(tmp_path_factory, det_model_path):
    from jetpipe.convert import ConvertOptions, convert
    from jetpipe.spec import preset

    out = tmp_path_factory.mktemp("gpupost") / "det"
    convert(ConvertOptions(model=det_model_path, output=out, input_size=(640, 640), max_batch=4,
                           spec=preset("ppocr-det"), task="text-detection", engine="never", progress=False))
    return out


def test_text_detection_on_real_det_outputs(det_bundle):
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu (CUDA execution provider) is not installed")
    from jetpipe.runtime.gpu_runtime import GpuRuntime

    post = TextDetection()
    from jetpipe.synth import render_tilted_words

    sizes = [(1080, 1920), (480, 640), (720, 1280), (480, 640)]
    frames = [Frame(from_bgr(render_text_image(20 + i, hw).bgr, "nv12"), "nv12") for i, hw in enumerate(sizes)]
    frames[1] = Frame(from_bgr(render_tilted_words(21, (480, 640), count=6).bgr, "nv12"), "nv12")  # turned lines
    frames[3] = Frame(np.full((720, 640), 128, np.uint8), "nv12")  # grey: no text
    with GpuRuntime(det_bundle, max_batch=4) as rt:
        raw = rt.infer(frames)
        cpu = post(raw.outputs, raw.letterboxes, sizes)
        raw_bytes = rt.output_bytes_downloaded
    with GpuRuntime(det_bundle, max_batch=4, reduction=post.reduction(required=True)) as rt:
        reduced = rt.infer(frames)
        assert reduced.reduction == "components" and rt.reduction == "components"
        gpu = post.reduced(reduced.outputs, reduced.letterboxes, sizes)
        print(f"det batch 4: {raw_bytes} bytes to the host raw, {rt.output_bytes_downloaded} reduced")
        assert rt.output_bytes_downloaded * 10 < raw_bytes
    _same_text_results(gpu, cpu)
    assert sum(len(r["boxes"]) for r in cpu[:3]) >= 10 and cpu[3]["boxes"] == []


@pytest.mark.parametrize("probabilities", [False, True])
def test_topk_matches_cpu(device, module, probabilities):
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 3, (6, 1000)).astype(np.float32)
    if probabilities:
        logits = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    post = Classification(top_k=5)
    boxes, sizes = [IDENTITY] * 6, [(224, 224)] * 6
    gpu = post.reduced(_reduce(device, module, post.reduction(), logits), boxes, sizes)
    cpu = post({"out": logits}, boxes, sizes)
    for g, c in zip(gpu, cpu, strict=True):
        assert g["classes"] == c["classes"]
        np.testing.assert_allclose(g["scores"], c["scores"], atol=2e-5)


def _yolo_outputs(layout: str, frames: int = 4, classes: int = 6, anchors: int = 2100) -> np.ndarray:
    """Clusters of overlapping boxes over several classes; frame 1 has no score above threshold."""
    rng = np.random.default_rng(11)
    pred = np.zeros((frames, anchors, 4 + classes), np.float32)
    centres = rng.uniform(40, 600, (frames, 40, 2))
    pick = rng.integers(0, 40, (frames, anchors))
    jitter = rng.normal(0, 4, (frames, anchors, 2))
    pred[..., :2] = np.take_along_axis(centres, pick[..., None].repeat(2, -1), 1) + jitter
    pred[..., 2:4] = rng.uniform(20, 80, (frames, anchors, 2))
    pred[..., 4:] = rng.random((frames, anchors, classes)) ** 3
    pred[1, :, 4:] *= 0.2
    if layout == "yolov8":
        return pred.transpose(0, 2, 1).copy()
    obj = rng.random((frames, anchors, 1)).astype(np.float32) ** 0.5
    obj[1] = 0.0
    return np.concatenate([pred[..., :4], obj, pred[..., 4:]], axis=2)


def _same_detections(gpu: list[dict], cpu: list[dict]) -> None:
    for g, c in zip(gpu, cpu, strict=True):
        assert len(g["boxes"]) == len(c["boxes"])
        if c["boxes"]:
            assert g["classes"] == c["classes"]
            np.testing.assert_allclose(g["boxes"], c["boxes"], atol=0.11)
            np.testing.assert_allclose(g["scores"], c["scores"], atol=2e-4)


@pytest.mark.parametrize("layout", ["yolov8", "yolov5"])
@pytest.mark.parametrize("limit", [300, 7])
def test_yolo_nms_matches_cpu(device, module, layout, limit):
    out = _yolo_outputs(layout)
    post = YoloDetection(layout=layout, max_detections=limit)
    boxes, sizes = [IDENTITY] * len(out), [(640, 640)] * len(out)
    reduced = _reduce(device, module, post.reduction(), out)
    gpu, cpu = post.reduced(reduced, boxes, sizes), post({"out": out}, boxes, sizes)
    _same_detections(gpu, cpu)
    assert cpu[1]["boxes"] == []
    if limit == 7:  # more detections than K: the K best, in score order
        assert all(len(c["boxes"]) == 7 for i, c in enumerate(cpu) if i != 1)
    else:
        assert min(len(c["boxes"]) for i, c in enumerate(cpu) if i != 1) > 7


def test_yolox_grid_decoding_matches_cpu(device, module):
    grid_anchors = (640 // 8) ** 2 + (640 // 16) ** 2 + (640 // 32) ** 2
    out = _yolo_outputs("yolov5", frames=2, anchors=grid_anchors)
    out[..., :2] = np.random.default_rng(2).normal(0, 0.5, out[..., :2].shape)  # offsets within the cell
    out[..., 2:4] = np.random.default_rng(4).normal(1.0, 0.3, out[..., 2:4].shape)  # log sizes
    post = YoloDetection(layout="yolox")
    boxes, sizes = [IDENTITY] * 2, [(640, 640)] * 2
    gpu = post.reduced(_reduce(device, module, post.reduction(), out), boxes, sizes)
    _same_detections(gpu, post({"out": out}, boxes, sizes))


def test_ctc_best_per_step_matches_cpu_on_real_recognizer_outputs(device, module):
    """PP-OCRv4 rec (softmax outputs) on rendered lines, and the same as logits: the GPU's best class per step
    finished on the host reads the same text with the same scores as the CPU path."""
    import onnx

    from jetpipe.models import BUILTIN
    from jetpipe.preprocess import preprocess_bgr
    from jetpipe.runtime.sessions import cpu_session
    from jetpipe.spec import preset
    from jetpipe.synth import render_text_line
    from jetpipe.tasks.text_recognition import CTCRecognition, alphabet

    source = onnx.load(str(BUILTIN["ppocr-rec"].path()))
    character = {p.key: p.value for p in source.metadata_props}["character"].splitlines()
    post = CTCRecognition(alphabet(character, 6625))
    lines = [render_text_line(seed, (48, 320)).bgr for seed in range(6)]
    inputs = np.stack([preprocess_bgr(line, (48, 320), preset("ppocr-rec"))[0] for line in lines])
    probabilities = cpu_session(source).run(None, {"x": inputs})[0]
    logits = np.log(np.maximum(probabilities, 1e-30)) + 3.0
    for scores in (probabilities, logits):
        reduced = _reduce(device, module, post.reduction(), scores)
        assert reduced["best"].shape == scores.shape[:2]
        gpu, cpu = post.reduced(reduced, [None] * 6, None), post({"y": scores}, [None] * 6, None)
        assert [g["text"] for g in gpu] == [c["text"] for c in cpu] and any(c["text"].strip() for c in cpu)
        np.testing.assert_allclose([g["score"] for g in gpu], [c["score"] for c in cpu], atol=2e-4)


REFERENCE = Path(__file__).parents[1] / "data" / "ultralytics_reference.npz"


@pytest.fixture(scope="module")
def ref():
    return dict(np.load(REFERENCE))


def _crowd_head(rng, rows_after: int, classes: int, size: int = 160, anchors: int = 525, largest: float = 60,
                sparse: float = 3) -> np.ndarray:
    """A YOLOv8-layout head [1, 4 + classes + rows_after, anchors]: clusters of overlapping boxes up to
    `largest` pixels inside a size x size input, scores over classes (random ** sparse), the rows after them
    random."""
    head = np.zeros((1, 4 + classes + rows_after, anchors), np.float32)
    centres = rng.uniform(12, size - 12, (25, 2))
    pick = rng.integers(0, 25, anchors)
    head[0, :2] = (centres[pick] + rng.normal(0, 2, (anchors, 2))).T
    head[0, 2:4] = rng.uniform(6, largest, (2, anchors))
    head[0, 4:4 + classes] = rng.random((classes, anchors)) ** sparse
    head[0, 4 + classes:] = rng.normal(0, 1, (rows_after, anchors)) * 40 + 80
    return head


def test_pose_keypoints_carried_match_cpu(device, module, ref):
    """A real pose export's output (7 people), a frame with none and a made-up crowd: the same boxes and
    keypoints as the CPU path, and only the kept boxes' keypoint rows written to the host."""
    quiet = ref["pose_head"].copy()
    quiet[:, 4] = 0.01
    heads = np.concatenate([ref["pose_head"], quiet, _crowd_head(np.random.default_rng(7), 51, 1)])
    post = YoloPose(classes=1)
    boxes, sizes = [IDENTITY] * 3, [(160, 160)] * 3
    reduced = _reduce(device, module, post.reduction(), heads)
    gpu, cpu = post.reduced(reduced, boxes, sizes), post({"o": heads}, boxes, sizes)
    _same_detections(gpu, cpu)
    for g, c in zip(gpu, cpu):
        np.testing.assert_allclose(g["keypoints"], c["keypoints"], atol=2e-3)
    assert [len(c["boxes"]) for c in cpu[:2]] == [7, 0] and len(cpu[2]["boxes"]) > 20
    assert reduced["written"] == 4 * 51 * int(reduced["counts"].sum())


def _masks_cpu(post, head, protos):
    """The CPU path's kept boxes (float32, as the GPU holds them) and each one's mask (bits, x0, y0)."""
    columns, xyxy, _, _ = nms_yolov8(head, post.classes, post.score_threshold, post.iou_threshold,
                                     post.max_detections)
    coefficients, kept = head[4 + post.classes:, columns].T, xyxy.astype(np.float32)
    return [post.object_mask(c, protos, b.astype(np.float64)) for c, b in zip(coefficients, kept)], kept


def _seg_inputs(ref, rng):
    """A real seg export's output (6 objects), a frame with none and a made-up crowd on random prototypes."""
    quiet = ref["seg_head"].copy()
    quiet[:, 4:7] = 0.01
    crowd = _crowd_head(rng, 32, 3, largest=40, sparse=12)  # their masks within a frame's words
    crowd[0, 7:] = rng.normal(0, 1, (32, 525))
    heads = np.concatenate([ref["seg_head"], quiet, crowd])
    protos = np.concatenate([ref["seg_protos"], ref["seg_protos"], rng.normal(0, 1, (1, 32, 40, 40))])
    return heads, protos


def _traced_from_device_words(post, reduced, frame):
    """The CPU path's outlines and pixel counts of the masks the device computed (its words)."""
    kept = reduced["detections"][frame, :int(reduced["counts"][frame]), :4]
    return trace_outlines(post.unpack(kept, reduced["device_words"][frame]), OUTLINE_TOLERANCE)


def test_instance_masks_match_cpu(device, module, ref):
    """The GPU's boxes and its masks' bits equal the CPU path's (bar pixels whose logit rounds either side of
    0); the outlines it traces from its bits are the CPU path's traced from the same bits, point for point; the
    records agree; only the outlines' points cross."""
    heads, protos = _seg_inputs(ref, np.random.default_rng(9))
    post = YoloSegmentation(classes=3, coefficients=32, input_hw=(160, 160))
    boxes, sizes = [IDENTITY] * 3, [(160, 160)] * 3
    reduced = _reduce(device, module, post.reduction(), [protos, heads])  # the prototypes first, as some exports
    gpu, cpu = post.reduced(reduced, boxes, sizes), post({"p": protos, "h": heads}, boxes, sizes)
    _same_detections(gpu, cpu)
    assert [len(c["boxes"]) for c in cpu[:2]] == [6, 0] and len(cpu[2]["boxes"]) > 20
    differing = total = points = 0
    for frame in (0, 2):
        expected, kept = _masks_cpu(post, heads[frame], protos[frame])
        count = int(reduced["counts"][frame])
        np.testing.assert_allclose(reduced["detections"][frame, :count, :4], kept, atol=1e-3)
        for (want, x0, y0), (got, gx0, gy0) in zip(expected, post.unpack(kept, reduced["device_words"][frame])):
            assert (x0, y0, want.shape) == (gx0, gy0, got.shape)
            differing, total = differing + int((want != got).sum()), total + want.size
        outlines, pixels = _traced_from_device_words(post, reduced, frame)
        table = reduced["outlines"][frame, :count]
        assert (table[:, 1] >= 0).all() and table[:, 2].tolist() == pixels.astype(int).tolist()
        for (first, n, _), outline in zip(table.tolist(), outlines):
            np.testing.assert_array_equal(reduced["points"][frame, first:first + n], outline)
        points += int(table[:, 1].sum())
        for g, c in zip(gpu[frame]["polygons"], cpu[frame]["polygons"]):
            a, b = polygon_mask(g, (160, 160)), polygon_mask(c, (160, 160))
            assert (a & b).sum() >= 0.97 * max(1, (a | b).sum())
        np.testing.assert_allclose(gpu[frame]["mask_areas"], cpu[frame]["mask_areas"], rtol=0.01, atol=2)
    assert total > 10000 and differing <= total * 1e-3 and not post.truncated
    assert int(reduced["spilled"].sum()) == 0 and reduced["written"] == 4 * points > 0


def test_outlines_past_the_devices_room_are_traced_on_the_host(device, module, ref, monkeypatch):
    """With room for a few outlines' chains only, the other boxes' masks come back as words and are traced
    here: the records are the ones with room for all."""
    from jetpipe.runtime import postprocess_gpu

    heads, protos = _seg_inputs(ref, np.random.default_rng(9))
    post = YoloSegmentation(classes=3, coefficients=32, input_hw=(160, 160))
    boxes, sizes = [IDENTITY] * 3, [(160, 160)] * 3
    roomy = post.reduced(_reduce(device, module, post.reduction(), [heads, protos]), boxes, sizes)
    monkeypatch.setattr(postprocess_gpu, "CHAIN_POINTS", 200)
    reduced = _reduce(device, module, post.reduction(), [heads, protos])
    spilled = int((reduced["outlines"][:, :, 1] == -1).sum())
    assert spilled > 5 and int(reduced["spilled"].sum()) > 0
    assert post.reduced(reduced, boxes, sizes) == roomy


def test_masks_too_large_for_shared_memory_are_traced_on_the_host(device, module):
    """At 640 x 640 a 600-pixel box's padded mask (12,041 words) is past the kernel's shared memory: it comes
    back as bits and is traced here; the small box beside it is traced on the device; the records are the CPU
    path's (masks filled everywhere inside their boxes: no logit near 0)."""
    classes, anchors = 2, 8400
    head = np.zeros((1, 4 + classes + 32, anchors), np.float32)
    head[0, :4, :2] = np.array([[320, 100], [320, 100], [600, 40], [600, 40]], np.float32)  # cx cy w h
    head[0, 4, 0], head[0, 5, 1] = 0.9, 0.8
    head[0, 4 + classes] = 1.0
    protos = np.zeros((1, 32, 160, 160), np.float32)
    protos[0, 0] = 1.0
    post = YoloSegmentation(classes=classes, coefficients=32, input_hw=(640, 640))
    reduced = _reduce(device, module, post.reduction(), [head, protos])
    assert reduced["outlines"][0, :2, 1].tolist()[0] == -1 and reduced["outlines"][0, 1, 1] > 0
    assert int(reduced["spilled"][0]) == 600 * 19
    gpu = post.reduced(reduced, [IDENTITY], [(640, 640)])[0]
    cpu = post({"h": head, "p": protos}, [IDENTITY], [(640, 640)])[0]
    assert gpu["polygons"] == cpu["polygons"] and gpu["mask_areas"] == cpu["mask_areas"] == [360000.0, 1600.0]
    assert gpu["polygons"][0] == [[20.0, 20.0], [20.0, 619.0], [619.0, 619.0], [619.0, 20.0]]


def test_instance_masks_past_the_capacity_are_left_out(device, module):
    """12 frame-sized boxes of 12 classes: the words a frame holds (its area 8 times over) take the 8 best;
    the other 4 come back without a mask, and the first 8 are the CPU path's."""
    classes, anchors = 12, 525
    head = np.zeros((1, 4 + classes + 32, anchors), np.float32)
    head[0, :4, :classes] = np.array([[80], [80], [160], [160]], np.float32)
    head[0, 4 + np.arange(classes), np.arange(classes)] = 0.9 - 0.01 * np.arange(classes)
    head[0, 4 + classes] = 1.0  # the first coefficient: the first prototype, positive everywhere
    protos = np.zeros((1, 32, 40, 40), np.float32)
    protos[0, 0] = 1.0
    post = YoloSegmentation(classes=classes, coefficients=32, input_hw=(160, 160))
    reduced = _reduce(device, module, post.reduction(), [head, protos])
    gpu = post.reduced(reduced, [IDENTITY], [(160, 160)])[0]
    cpu = post({"h": head, "p": protos}, [IDENTITY], [(160, 160)])[0]
    assert len(gpu["boxes"]) == len(cpu["boxes"]) == classes
    assert gpu["polygons"][:8] == cpu["polygons"][:8] and all(gpu["polygons"][:8])
    assert gpu["polygons"][8:] == [[]] * 4 and gpu["mask_areas"][:8] == [160.0 * 160] * 8
    assert int(reduced["mask_words"][0]) == 8 * 160 * 5


@pytest.mark.parametrize("classes", [21, 300])
def test_class_counts_and_sampled_classes_match_numpy(device, module, classes, monkeypatch):
    """Each class's pixels inside each frame's letterboxed content and the content's classes every step pixels
    (the first of equal values: integer logits, many ties; one byte a class up to 256 and two above), against
    the layout written with numpy; the records finished from them are the CPU path's."""
    from jetpipe.tasks import semantic_segmentation
    from tests.tasks.test_semantic_segmentation import reduction_arrays

    monkeypatch.setattr(semantic_segmentation, "OUTLINE_SIDE", 20)  # read every few pixels, as a larger map is
    logits = np.random.default_rng(classes).integers(-3, 3, (3, classes, 48, 64)).astype(np.float32)
    boxes = [IDENTITY, fit((480, 1280), (48, 64), "letterbox")[1], fit((720, 300), (48, 64), "letterbox")[1]]
    reduction = Reduction("argmax", {"input_hw": (48, 64), "side": 20})
    reduced = _reduce(device, module, reduction, logits, letterboxes=boxes)
    expected = reduction_arrays(logits, boxes, (48, 64), side=20)
    assert reduced["sampled"].dtype == (np.uint8 if classes <= 256 else np.uint16)
    for name in ("counts", "sampled", "content"):
        np.testing.assert_array_equal(reduced[name], expected[name], err_msg=name)
    post = SemanticSegmentation(input_hw=(48, 64))
    sizes = [(48, 64), (480, 1280), (720, 300)]
    assert post.reduced(reduced, boxes, sizes) == post({"out": logits}, boxes, sizes)


def test_a_class_map_of_another_size_than_the_task_expects_is_refused(device, module):
    """The records' scale comes from the map size the task was made for: an output of another is refused at
    start-up (the runtime then returns the outputs and says why), not finished at the wrong scale."""
    from jetpipe.runtime.postprocess_gpu import ReductionUnsupported

    logits = np.zeros((1, 21, 24, 32), np.float32)
    with pytest.raises(ReductionUnsupported, match="expects a 48x64 map"):
        _reduce(device, module, Reduction("argmax", {"input_hw": (48, 64), "map_hw": (48, 64)}), logits)
    reduced = _reduce(device, module, Reduction("argmax", {"input_hw": (48, 64), "map_hw": (24, 32)}), logits)
    assert reduced["counts"][0, 0] == 24 * 32  # every pixel class 0 (the first of equal values)


def test_two_model_instances_reduce_every_batch_as_one_does(det_bundle):
    """--model-instances 2 with the text boxes found on the GPU (issue 66): the reduction's scratch is one a
    runtime, so both instances' reductions run on the one post stream. Two on their own streams at once hung
    the H100 (32 cameras, session 60): a union-find walking labels the other batch was writing. Batches
    submitted four at once, thirty times: every batch's components are one instance's (the same regions; their
    order within a frame is the atomics', as it is from one instance: the H100 gave 45 of 4,000 slots permuted)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu (CUDA execution provider) is not installed")
    from jetpipe.runtime.gpu_runtime import GpuRuntime
    from jetpipe.synth import render_tilted_words

    post = TextDetection()
    batches = [[Frame(from_bgr(render_tilted_words(10 * b + i, (720, 1280), count=8).bgr, "nv12"), "nv12")
                for i in range(4)] for b in range(4)]
    with GpuRuntime(det_bundle, max_batch=4, buffer_sets=4, reduction=post.reduction(required=True)) as rt:
        expected = [{k: v.copy() for k, v in rt.infer(frames).outputs.items()} for frames in batches]
    assert all(int(e["counts"].sum()) >= 4 for e in expected)
    with GpuRuntime(det_bundle, max_batch=4, buffer_sets=4, instances=2,
                    reduction=post.reduction(required=True)) as rt:
        assert rt.instances[0].streams.post is rt.instances[1].streams.post
        for _ in range(30):
            tickets = [rt.submit(frames) for frames in batches]
            assert {t.instance for t in tickets} == {0, 1}
            for ticket, want in zip(tickets, expected):
                got = rt.collect(ticket).outputs
                np.testing.assert_array_equal(got["counts"], want["counts"])
                for frame, count in enumerate(want["counts"].tolist()):  # a frame's regions in the order its
                    np.testing.assert_array_equal(  # atomics gave them slots (the task sorts them): as sets
                        np.sort(got["components"][frame, :count]), np.sort(want["components"][frame, :count]))
