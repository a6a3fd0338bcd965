"""GPU postprocessing (marker gpu) against the CPU postprocessors, which CI runs everywhere.

Text detection on real PP-OCRv4 det outputs and on made-up probability maps whose
components are hard for union-find (diagonal links, U shapes, one pixel wide);
classification on logits and probabilities; YOLO (v8, v5, YOLOX layouts) on made-up
outputs with many overlapping boxes, a frame with none and a frame with more than K.
"""

import numpy as np
import pytest

from jetpipe.frames import from_bgr
from jetpipe.geometry import Letterbox
from jetpipe.runtime.api import Frame, TensorSpec
from jetpipe.synth import render_text_image
from jetpipe.tasks.classification import Classification
from jetpipe.tasks.detection_yolo import YoloDetection
from jetpipe.tasks.text_detection import TextDetection

pytestmark = pytest.mark.gpu

IDENTITY = Letterbox(1.0, 1.0, 0, 0)


@pytest.fixture(scope="module")
def module(device):
    from jetpipe.runtime.kernels import SOURCE, compile_module
    from jetpipe.runtime.postprocess_gpu import SOURCE_NAME

    with device.active():
        return compile_module(SOURCE.with_name(SOURCE_NAME))


def _reduce(device, module, reduction, outputs: np.ndarray) -> dict:
    """Upload `outputs` as the model's output, run the reducer, return its compact host arrays."""
    from jetpipe.runtime.postprocess_gpu import make_reducer

    outputs = np.ascontiguousarray(outputs, np.float32)
    spec = TensorSpec("out", np.dtype(np.float32), outputs.shape[1:])
    with device.active():
        reducer = make_reducer(reduction, device, module, len(outputs), 1, spec)
        stream = device.stream()
        buffer = device.alloc(outputs.nbytes)
        device.cuda.memcpy_htod(buffer, outputs)
        reducer.launch(0, len(outputs), int(buffer), stream)
        reducer.download(0, len(outputs), stream)
        stream.synchronize()
        return {k: v.copy() for k, v in reducer.host(0, len(outputs)).items()}


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
