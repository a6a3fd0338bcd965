"""Secondary stages: crops cut from frames as decoded (YUV), batched into a second model, results aligned
with the primary's boxes; the OCR chain PP-OCRv4 det -> rec reading rendered words."""

import json
import time

import numpy as np
import pytest

from jetpipe.cli import main
from jetpipe.frames import crop_native, from_bgr, to_rgb_float
from jetpipe.pipelines.core.secondary import SecondaryConfig, SecondaryStage
from jetpipe.preprocess import preprocess_frame, preprocess_frame_fast
from jetpipe.spec import preset
from jetpipe.synth import render_text_image
from jetpipe.tasks.detections import Detections

OPENCV_MAJOR = int(__import__("cv2").__version__.split(".")[0])
CROPS = [(101, 37, 331, 85), (0, 0, 64, 30), (1, 3, 640, 480), (333, 401, 334, 402)]


@pytest.fixture(scope="module")
def scene():
    return render_text_image(7, (480, 640)).bgr


@pytest.mark.parametrize("fmt", ["nv12", "i420", "yuyv", "uyvy", "bgr", "rgb"])
def test_the_part_around_a_crop_converts_to_the_same_pixels_as_the_whole_frame(scene, fmt):
    frame = from_bgr(scene, fmt)
    whole = to_rgb_float(frame, fmt, 480, 640)
    for crop in CROPS:
        part, (x0, y0, x1, y1) = crop_native(frame, fmt, 480, 640, crop)
        ph, pw = (part.shape[0] * 2 // 3, part.shape[1]) if fmt in ("nv12", "i420") else \
            (part.shape[0], part.shape[1] // (2 if fmt in ("yuyv", "uyvy") else 1))
        np.testing.assert_array_equal(to_rgb_float(part, fmt, ph, pw)[y0:y1, x0:x1],
                                      whole[crop[1]:crop[3], crop[0]:crop[2]])


@pytest.mark.parametrize("fmt", ["nv12", "i420", "yuyv", "bgr"])
def test_a_crop_is_the_rectangle_resized_as_opencv_resizes_it(scene, fmt):
    """The reference: OpenCV's own decode of the whole frame, the crop sliced, cv2.resize, normalized."""
    import cv2

    from jetpipe.preprocess import opencv_bgr

    frame = from_bgr(scene, fmt)
    spec = preset("ppocr-rec")
    for crop in CROPS[:3]:
        x0, y0, x1, y1 = crop
        bgr = opencv_bgr(frame, fmt)[y0:y1, x0:x1]
        scale = min(48 / (y1 - y0), 320 / (x1 - x0))
        nh, nw = max(1, round((y1 - y0) * scale)), max(1, round((x1 - x0) * scale))
        canvas = np.full((48, 320, 3), 127.5, np.float32)
        canvas[:nh, :nw] = cv2.resize(bgr, (nw, nh), interpolation=cv2.INTER_LINEAR)
        expected = ((canvas / 255 - 0.5) / 0.5).transpose(2, 0, 1)
        fast, _ = preprocess_frame_fast(frame, fmt, (48, 320), spec, crop=crop)
        exact, _ = preprocess_frame(frame, fmt, (48, 320), spec, crop=crop)
        step = 2 / 255  # one 8-bit level after (x / 255 - 0.5) / 0.5
        assert np.abs(fast - expected).max() <= 1.01 * step
        assert np.abs(exact - expected).max() <= 2.51 * step  # float conversion vs OpenCV's integer one


QUADS = [((120.0, 60.5), (330.2, 98.9), (322.4, 141.6), (112.3, 103.3)),   # a line tilted 10 degrees
         ((400.0, 300.0), (600.0, 280.0), (610.0, 330.0), (395.0, 345.0)),   # a perspective quadrilateral
         ((-20.0, 400.0), (150.0, 430.0), (140.0, 500.0), (-30.0, 470.0))]   # reaching out of the frame


@pytest.mark.parametrize("fmt", ["nv12", "i420", "yuyv", "bgr"])
def test_a_quadrilateral_crop_is_what_opencv_warps_upright(scene, fmt):
    """The reference: OpenCV's decode of the whole frame, getPerspectiveTransform + warpPerspective onto the
    content's size (pixel centres: the quad's corners lie on pixel edges), the border replicated."""
    import cv2

    from jetpipe.geometry import quad_region, quad_size
    from jetpipe.preprocess import opencv_bgr

    frame = from_bgr(scene, fmt)
    spec = preset("ppocr-rec")
    bgr = opencv_bgr(frame, fmt).astype(np.float32)
    step = 2 / 255  # one 8-bit level after (x / 255 - 0.5) / 0.5
    for quad in QUADS:
        h, w = quad_size(quad)
        scale = min(48 / h, 320 / w)
        nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
        edges = np.array([[0, 0], [nw, 0], [nw, nh], [0, nh]], np.float32) - 0.5   # -> pixel-centre coordinates
        matrix = cv2.getPerspectiveTransform(np.float32(quad) - 0.5, edges)
        region = quad_region(quad, 480, 640)
        x0, y0, x1, y1 = region
        # the region read: samples past it repeat its border, as they do past the frame's
        shifted = matrix @ np.array([[1, 0, x0], [0, 1, y0], [0, 0, 1]], np.float64)
        warped = cv2.warpPerspective(bgr[y0:y1, x0:x1], shifted, (nw, nh), flags=cv2.INTER_LINEAR,
                                     borderMode=cv2.BORDER_REPLICATE)
        canvas = np.full((48, 320, 3), 127.5, np.float32)
        canvas[:nh, :nw] = warped
        expected = ((canvas / 255 - 0.5) / 0.5).transpose(2, 0, 1)
        fast, _ = preprocess_frame_fast(frame, fmt, (48, 320), spec, crop=region, quad=quad)
        exact, _ = preprocess_frame(frame, fmt, (48, 320), spec, crop=region, quad=quad)
        # the same decode: the same samples; the float decode: within one 8-bit level of OpenCV's integer one.
        # OpenCV before 5 rounds warpPerspective's sample positions to 1/32 pixel: up to ~4 levels off at a
        # letter's edge (4.8), a small fraction of a level on average
        if OPENCV_MAJOR >= 5:
            assert np.abs(fast - expected).max() <= 0.05 * step, quad
        else:
            assert np.abs(fast - expected).mean() <= 0.05 * step and np.abs(fast - expected).max() <= 8 * step
        assert np.abs(exact - expected).max() <= (1.0 if OPENCV_MAJOR >= 5 else 8.0) * step, quad


def test_an_upright_quadrilateral_is_the_rectangle_resized(scene):
    frame = from_bgr(scene, "nv12")
    spec = preset("ppocr-rec")
    x0, y0, x1, y1 = CROPS[0]
    quad = ((x0, y0), (x1, y0), (x1, y1), (x0, y1))
    warped, _ = preprocess_frame(frame, "nv12", (48, 320), spec, crop=CROPS[0], quad=quad)
    resized, _ = preprocess_frame(frame, "nv12", (48, 320), spec, crop=CROPS[0])
    np.testing.assert_allclose(warped, resized, atol=1e-4)


def test_a_crop_outside_the_frame_is_refused(scene):
    from jetpipe.errors import JetpipeError
    from jetpipe.runtime.api import Frame

    with pytest.raises(JetpipeError, match=r"crop \[600, 0, 700, 10\] is not a non-empty rectangle inside"):
        Frame(from_bgr(scene, "nv12"), "nv12", crop=(600, 0, 700, 10)).size()


def _stage(rec_bundle, **options):
    return SecondaryStage(SecondaryConfig(rec_bundle, **options), "onnxruntime-cpu", "auto", (720, 1280), "auto")


def test_a_secondary_runs_at_priority_high_unless_told_and_the_cpu_runtime_claims_no_priority(rec_bundle):
    """High is the default (measured on an H100: the OCR chain's p99 45-50 ms against 56-60 at normal). A CPU
    runtime has no GPU stream to raise: its summary names no priority, asked or not."""
    assert SecondaryConfig(rec_bundle).priority == "high"
    for options in ({}, {"priority": "high"}, {"priority": "normal"}):
        stage = _stage(rec_bundle, **options)
        try:
            assert "priority" not in stage.summary(), options
        finally:
            stage.close()


def test_boxes_are_chosen_by_class_size_and_score(rec_bundle):
    result = {"boxes": [[0, 0, 50, 20], [0, 0, 5, 40], [10, 10, 90, 40], [0, 0, 30, 30]],
              "scores": [0.5, 0.9, 0.8, 0.7], "classes": [0, 0, 1, 0], "labels": ["line", "line", "sign", "line"]}
    stage = _stage(rec_bundle, min_size=8, max_per_frame=2)
    found = Detections.from_results(result)
    try:
        assert stage.chosen(found) == [2, 3]  # box 1 is 5 wide; of 0, 2, 3 the two best scores
        stage.classes = {"line"}
        assert stage.chosen(found) == [0, 3]
        stage.classes = {1}
        assert stage.chosen(found) == [2]
    finally:
        stage.close()


def test_det_then_rec_reads_the_rendered_words_aligned_with_the_boxes(det_bundle, rec_bundle, text_video, tmp_path):
    video, words = text_video
    out = tmp_path / "out.jsonl"
    assert main(["serve", "--bundle", str(det_bundle), "--secondary", str(rec_bundle), "--source", str(video),
                 "--sink", f"jsonl:{out}", "--metrics", "", "--backend", "onnxruntime-cpu"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == len(words)
    found = total = 0
    for record, truth in zip(records, words):
        entries = record["results"]["secondary"][rec_bundle.name]
        assert len(entries) == len(record["results"]["boxes"])
        read = {w for e in entries if e for w in e["text"].split()}
        found, total = found + len(set(truth) & read), total + len(truth)
    assert found / total >= 0.9, (found, total)


def test_tilted_lines_are_read_along_their_quadrilaterals(det_bundle, rec_bundle):
    """Words turned 8-25 degrees: the recognizer reads the detector's rotated lines warped upright; the same
    lines cut as their upright bounding boxes (what the crop was before) read fewer."""
    from jetpipe import bundle as bundles
    from jetpipe.runtime.api import Frame
    from jetpipe.runtime.open import open_runtime
    from jetpipe.synth import render_tilted_words
    from jetpipe.tasks import for_bundle

    detector = open_runtime(det_bundle, backend="onnxruntime-cpu")
    task, options = for_bundle(bundles.load(det_bundle))
    post, stage = task.postprocessor(options), _stage(rec_bundle)
    read, total = {"quads": 0, "boxes": 0}, 0
    try:
        for seed in range(8):
            image = render_tilted_words(seed, (720, 1280))
            frame = Frame(image.bgr, "bgr")
            found = detector.infer([frame])
            result = post(found.outputs, found.letterboxes, [(720, 1280)])[0]
            assert any(abs(q[1][1] - q[0][1]) > 5 for q in result["quads"])  # tilted quads, not boxes
            for crops in read:
                one = Detections.from_results(result if crops == "quads" else {k: v for k, v in result.items()
                                                                             if k != "quads"})
                stage.run([one], [frame])
                texts = {e["text"].replace(" ", "") for e in one.secondary[stage.name] if e}
                read[crops] += sum(word.replace(" ", "") in texts for word in image.words)
            total += len(image.words)
    finally:
        stage.close()
        detector.close()
    assert read["quads"] >= 0.8 * total and read["quads"] >= read["boxes"] + 0.05 * total, (read, total)


def _words_read(stage, frames, results, images) -> tuple[int, int]:
    read = total = 0
    for frame, result, image in zip(frames, results, images):
        one = Detections.from_results(result)
        stage.run([one], [frame])
        said = set(" ".join(e["text"] for e in one.secondary[stage.name] if e).split())
        truth = set(" ".join(image.words).split())
        read, total = read + len(truth & said), total + len(truth)
    return read, total


def test_long_lines_are_read_at_the_width_they_need(rec_bundle, long_lines, tmp_path):
    """A recognizer with a width range (80:320:960) runs each batch at the narrowest of 320, 640, 960 that
    holds its longest line at full height; fed at 320 only (what it was before), long lines are squeezed."""
    from jetpipe.models import BUILTIN

    model = BUILTIN["ppocr-rec"]
    fixed = tmp_path / "rec320"
    assert main(["convert", str(model.path()), "-o", str(fixed), "--input-size", "48x320", "--preset", "ppocr-rec",
                 "--task", "text-recognition", "--max-batch", "8", "--engine", "never", "--quiet"]) == 0
    counts = {}
    for bundle in (rec_bundle, fixed):
        stage = _stage(bundle)
        try:
            counts[bundle.name] = _words_read(stage, *long_lines[1:], long_lines[0])
            widths = stage.runtime.widths
        finally:
            stage.close()
        assert widths == ((320, 640, 960) if bundle == rec_bundle else (320,))
    (wide, total), (narrow, _) = counts[rec_bundle.name], counts["rec320"]
    assert wide >= 0.8 * total and wide >= narrow + 0.3 * total, counts


def test_a_batch_runs_at_each_of_the_runtimes_widths_as_onnxruntime_runs_that_shape(rec_bundle):
    import onnxruntime as ort

    from jetpipe.errors import JetpipeError
    from jetpipe.runtime.api import Frame
    from jetpipe.runtime.cpu_runtime import CpuRuntime

    spec = preset("ppocr-rec")
    image = render_text_image(5, (96, 900)).bgr
    session = ort.InferenceSession(str(rec_bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    with CpuRuntime(rec_bundle, exact_preprocess=True) as runtime:
        assert runtime.widths == (320, 640, 960)
        for width in runtime.widths:
            found = runtime.infer([Frame(image)] * 2, width)
            sample, _ = preprocess_frame(image, "bgr", (48, width), spec)
            expected = session.run(None, {session.get_inputs()[0].name: np.stack([sample] * 2)})[0]
            assert found.outputs["softmax_11.tmp_0"].shape == expected.shape == (2, width // 8, 6625)
            np.testing.assert_allclose(found.outputs["softmax_11.tmp_0"], expected, atol=1e-4)
        with pytest.raises(JetpipeError, match="input width 500: this runtime runs the bundle at 320, 640, 960"):
            runtime.infer([Frame(image)], 500)


CONFIG = """
[pipeline]
bundle = "{det}"
[[source]]
uri = "synthetic"
[[secondary]]
bundle = "{rec}"
{extra}
"""


@pytest.mark.parametrize("extra, message", [
    ("classes = ['person']", "classes = \\['person'\\]: the primary's task text-detection has no classes"),
    ("max_per_frame = 0", "max_per_frame = 0: from 1 to 1024"),
    ("min_size = -2", "min_size = -2: pixels from 1 to 16384"),
    ("direction_threshold = 2.0", "direction_threshold = 2.0: from 0 to 1"),
    ("direction = 'nowhere'", "nowhere"),
    ("priority = 'max'", "priority = 'max': choose normal or high"),
    ("priority = 'high'", None),
    ("colour = 'red'", "unknown key 'colour'"),
    ("[[secondary]]\nbundle = '{rec}'", "two secondaries are named alike"),
    ("", None),
])
def test_secondary_settings_are_checked_at_start(det_bundle, rec_bundle, tmp_path, capsys, extra, message):
    config = tmp_path / "c.toml"
    config.write_text(CONFIG.format(det=det_bundle, rec=rec_bundle, extra=extra.format(rec=rec_bundle)))
    code = main(["serve", str(config), "--frames", "1", "--metrics", "", "--backend", "onnxruntime-cpu"])
    err = capsys.readouterr().err
    if message is None:
        assert code == 0, err
        return
    assert code == 2 and "Traceback" not in err
    import re

    assert re.search(message, err), err


def test_a_missing_secondary_bundle_is_one_line(det_bundle, tmp_path, capsys):
    code = main(["serve", "--bundle", str(det_bundle), "--secondary", str(tmp_path / "nope"), "--source",
                 "synthetic", "--frames", "1", "--metrics", ""])
    err = capsys.readouterr().err
    assert code == 2 and "nope" in err and "Traceback" not in err and len(err.strip().splitlines()) <= 3, err


def test_secondary_text_is_drawn_beside_its_box():
    from jetpipe.pipelines.outputs.annotate import draw

    box = {"boxes": [[10, 60, 60, 90]], "scores": [0.9]}
    image = draw(np.zeros((120, 320, 3), np.uint8), {**box, "secondary": {"rec": [{"text": "a long line of text",
                                                                                  "score": 0.9}]}}, (120, 320))
    plain = draw(np.zeros((120, 320, 3), np.uint8), box, (120, 320))
    assert np.count_nonzero(image[52].any(axis=1)) > np.count_nonzero(plain[52].any(axis=1)) + 60


def test_a_tilted_lines_quadrilateral_is_drawn_not_its_box():
    from jetpipe.pipelines.outputs.annotate import draw

    quad = [[40, 60], [200, 20], [210, 50], [50, 90]]
    image = draw(np.zeros((120, 320, 3), np.uint8), {"boxes": [[40, 20, 210, 90]], "scores": [0.9], "quads": [quad]},
                 (120, 320))
    assert not image[30:55, 40].any() and image[74, 44:47].any()  # no box side at x = 40; the quad's left edge


@pytest.fixture(scope="module")
def cls_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("cls") / "cls"
    assert main(["convert", "ppocr-cls", "-o", str(out), "--max-batch", "8", "--quiet"]) == 0
    return out


def test_upside_down_lines_are_turned_by_the_direction_classifier_before_they_are_read(detect, rec_bundle,
                                                                                      cls_bundle):
    """Lines turned half a turn: the recognizer alone reads few; with the direction classifier first the
    crops it finds upside down are cut turned (the quad's corners from the other end) and read."""
    from jetpipe.synth import render_tilted_words

    images = [render_tilted_words(seed, (720, 1280), count=6, degrees=(180, 180)) for seed in range(4)]
    upright = [render_tilted_words(seed, (720, 1280), count=6, degrees=(0, 0)) for seed in range(4, 6)]
    frames, results = detect(images + upright)
    plain, turning = _stage(rec_bundle), _stage(rec_bundle, direction=cls_bundle)
    try:
        read_plain, total = _words_read(plain, frames[:4], results[:4], images)
        read_turned, _ = _words_read(turning, frames[:4], results[:4], images)
        turned = turning.summary()["crops_turned"]
        read_upright, upright_total = _words_read(turning, frames[4:], results[4:], upright)
        turned_upright = turning.summary()["crops_turned"] - turned
        one = Detections.from_results(results[0])
        turning.run([one], [frames[0]])
    finally:
        plain.close()
        turning.close()
    boxes = sum(len(r["boxes"]) for r in results[:4])
    assert read_turned >= 0.8 * total and read_plain <= 0.3 * total, (read_turned, read_plain, total)
    assert turned >= 0.8 * boxes and turned_upright <= 1, (turned, boxes, turned_upright)
    assert any(e and e.get("angle") == 180 for e in one.secondary[turning.name])
    assert read_upright >= 0.8 * upright_total


def test_a_direction_bundle_that_is_not_a_direction_classifier_is_refused(rec_bundle):
    from jetpipe.errors import JetpipeError

    with pytest.raises(JetpipeError, match="needs a classifier whose classes are named 0 and 180") as refused:
        _stage(rec_bundle, direction=rec_bundle)
    # the recognizer's classes are its 6,625 characters: a few of them are named, not all (a 46 KB line)
    assert len(str(refused.value)) < 500 and "in all" in str(refused.value)


def test_direction_without_a_secondary_is_one_line(det_bundle, cls_bundle, capsys):
    code = main(["serve", "--bundle", str(det_bundle), "--direction", str(cls_bundle), "--source", "synthetic",
                 "--frames", "1", "--metrics", ""])
    err = capsys.readouterr().err
    assert code == 2 and "--direction turns the crops of a --secondary" in err and "Traceback" not in err



def test_every_track_reads_a_tracked_line_once_every_n_frames_and_reuses_it_between(det_bundle, rec_bundle,
                                                                                     tmp_path, capsys):
    """Eight frames of the same words: with every_track = 3 a track's text is read on its first tracked
    frame and every third after, the frames between take that text (marked reused); what is read is what
    the stage reads without every_track."""
    import cv2

    clip = tmp_path / "still.avi"
    image = render_text_image(3, (480, 640), max_words=6).bgr
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"MJPG"), 10, (640, 480))
    for _ in range(8):
        writer.write(image)
    writer.release()
    runs = {}
    for every in (0, 3):
        config, out = tmp_path / f"c{every}.toml", tmp_path / f"r{every}.jsonl"
        config.write_text(f'[pipeline]\nbundle = "{det_bundle}"\ntracker = "bytetrack"\nmax_batch = 1\n'
                          f'[[source]]\nuri = "{clip}"\n[[sink]]\nuri = "jsonl:{out}"\n'
                          f'[[secondary]]\nbundle = "{rec_bundle}"\nname = "text"\nevery_track = {every}\n')
        capsys.readouterr()
        assert main(["serve", str(config), "--metrics", "", "--backend", "onnxruntime-cpu"]) == 0
        summary = json.loads(capsys.readouterr().err.strip().splitlines()[-1])["summary"]["secondary"]["text"]
        runs[every] = ([json.loads(line)["results"] for line in out.read_text().splitlines()], summary)
    (plain, plain_summary), (reusing, summary) = runs[0], runs[3]
    boxes = sum(len(r["boxes"]) for r in plain)
    assert plain_summary["crops"] == boxes and summary["crops"] + summary["crops_reused"] == boxes
    assert summary["crops_reused"] >= 0.4 * boxes
    last_read = {}  # track -> (frame it was read in, text)
    for frame, (a, b) in enumerate(zip(plain, reusing)):
        for i, (entry, track) in enumerate(zip(b["secondary"]["text"], b["track_ids"])):
            if track is None or track not in last_read or frame - last_read[track][0] >= 3:
                assert not entry.get("reused") and entry["text"] == a["secondary"]["text"][i]["text"]
                if track is not None:
                    last_read[track] = (frame, entry["text"])
            else:
                assert entry.get("reused") and entry["text"] == last_read[track][1]


def test_every_track_needs_a_tracker(det_bundle, rec_bundle, tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text(CONFIG.format(det=det_bundle, rec=rec_bundle, extra="every_track = 5"))
    code = main(["serve", str(config), "--frames", "1", "--metrics", "", "--backend", "onnxruntime-cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "every_track = 5 reuses a result while its track lives: add --tracker" in err


def test_the_next_batch_is_finished_while_the_secondary_reads_the_crops_of_the_last(det_bundle, rec_bundle,
                                                                                     text_video, tmp_path):
    """The secondary runs in a thread of its own: while it reads batch 1's crops (held here), the post thread
    collects and finishes batch 2 (before, it ran the secondary itself and batch 2 waited: a batch period of
    latency more at real time). Records still come out complete and in order."""
    import threading

    from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
    from jetpipe.pipelines.service.daemon import Pipeline

    video, words = text_video
    out = tmp_path / "out.jsonl"
    config = validate(PipelineConfig(bundle=det_bundle, sources=[SourceConfig(str(video))], sinks=[f"jsonl:{out}"],
                                     max_batch=1, backend="onnxruntime-cpu", metrics_listen="",
                                     secondaries=[SecondaryConfig(rec_bundle, name="text")]))
    pipeline = Pipeline(config)
    finished, go_on = [], threading.Event()
    finish, run = pipeline.stages.postprocess, pipeline.secondaries[0].run

    def counting_finish(*args, **kwargs):
        results = finish(*args, **kwargs)
        finished.append(len(results))
        return results

    def held_run(*args, **kwargs):
        go_on.wait(120)  # the first batch's crops wait until the test has seen the next batch finished
        return run(*args, **kwargs)

    pipeline.stages.postprocess, pipeline.secondaries[0].run = counting_finish, held_run
    summaries = []
    serving = threading.Thread(target=lambda: summaries.append(pipeline.run()))
    serving.start()
    try:
        deadline = time.monotonic() + 120
        while len(finished) < 2 and time.monotonic() < deadline and serving.is_alive():
            time.sleep(0.01)
        assert len(finished) >= 2, "the post thread did not finish batch 2 while batch 1's crops were read"
    finally:
        go_on.set()
        serving.join(300)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["frame"] for r in records] == list(range(len(words)))
    assert all(len(r["results"]["secondary"]["text"]) == len(r["results"]["boxes"]) for r in records)
    assert summaries[0]["secondary"]["text"]["crops"] > 0 and "secondary_thread_ms_per_batch" in summaries[0]


def test_batches_that_waited_for_the_secondary_are_read_together_as_they_are_read_apart(det_bundle, rec_bundle,
                                                                                         text_video, tmp_path):
    """Behind, the secondary thread takes every batch waiting for it and reads their crops in one go (fuller
    recognizer runs): the first batch's read is held until two more are finished and waiting; they are then
    read together, and every record is the one a run that never waits gives, in order."""
    import threading

    from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
    from jetpipe.pipelines.service.daemon import Pipeline

    video, words = text_video

    def pipeline_to(out):
        return Pipeline(validate(PipelineConfig(bundle=det_bundle, sources=[SourceConfig(str(video))],
                                                sinks=[f"jsonl:{out}"], max_batch=1, backend="onnxruntime-cpu",
                                                metrics_listen="", secondaries=[SecondaryConfig(rec_bundle,
                                                                                                name="text")])))

    apart = tmp_path / "apart.jsonl"
    pipeline_to(apart).run()
    together = tmp_path / "together.jsonl"
    pipeline = pipeline_to(together)
    read_at_once, go_on = [], threading.Event()
    run = pipeline.secondaries[0].run

    def held_run(results, *args, **kwargs):
        go_on.wait(120)  # the first read waits until two more batches wait behind it
        read_at_once.append(len(results))
        return run(results, *args, **kwargs)

    pipeline.secondaries[0].run = held_run
    summaries = []
    serving = threading.Thread(target=lambda: summaries.append(pipeline.run()))
    serving.start()
    try:
        deadline = time.monotonic() + 120
        while pipeline.stages.chained.qsize() < 2 and time.monotonic() < deadline and serving.is_alive():
            time.sleep(0.01)
        assert pipeline.stages.chained.qsize() == 2, "batches 2 and 3 did not wait while batch 1's crops were read"
    finally:
        go_on.set()
        serving.join(300)
    assert read_at_once[:2] == [1, 2] and sum(read_at_once) == len(words)
    assert summaries[0]["secondary_reads"] == len(read_at_once) < summaries[0]["batches"]
    results = [[json.loads(line)["results"] for line in path.read_text().splitlines()] for path in (apart, together)]
    frames = [[json.loads(line)["frame"] for line in path.read_text().splitlines()] for path in (apart, together)]
    assert frames[1] == frames[0] == list(range(len(words)))
    assert results[1] == results[0]


def test_a_cameras_frames_wait_in_the_batcher_not_in_batches_queued_for_a_secondary_that_is_behind(det_bundle,
                                                                                                     rec_bundle,
                                                                                                     text_video):
    """A camera faster than a secondary that takes 0.5 s a read: the primary cuts its next batch of live frames
    only once the secondary has taken the batch ahead of it, so at each cut at most two batches are between the
    batcher and their records (one read, one taken with it or waiting). Before, the primary ran on until every
    buffer set held a batch (five), and a frame came out five reads after its capture (the demo: 5 s on the
    CPU). A file's batches are not held: they queue for the secondary as before, every frame kept."""
    from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
    from jetpipe.pipelines.service.daemon import Pipeline

    def in_flight_at_each_cut(uri: str, frames: int = 0, read_s: float = 0.5) -> tuple[list[int], dict]:
        pipeline = Pipeline(validate(PipelineConfig(
            bundle=det_bundle, sources=[SourceConfig(uri)], max_batch=1, backend="onnxruntime-cpu",
            metrics_listen="", frames=frames, secondaries=[SecondaryConfig(rec_bundle, name="text")])))
        cuts, emitted = [], []
        submit, emit, run = pipeline.runtime.submit, pipeline.stages.emit, pipeline.secondaries[0].run

        def slow_run(*args, **kwargs):
            time.sleep(read_s)
            return run(*args, **kwargs)

        def counted_submit(*args, **kwargs):
            cuts.append(len(cuts) - len(emitted))  # batches cut before this one and not yet out
            return submit(*args, **kwargs)

        pipeline.runtime.submit = counted_submit
        pipeline.stages.emit = lambda *args: emitted.append(1) or emit(*args)
        pipeline.secondaries[0].run = slow_run
        return cuts, pipeline.run()

    cuts, live = in_flight_at_each_cut("synthetic:320x240@60", frames=10)
    assert live["dropped"][0] > 0 and max(cuts) <= 2, cuts  # shed in the batcher, not queued for the secondary
    assert live["secondary_held_primary_s"] > 0
    cuts, whole = in_flight_at_each_cut(str(text_video[0]), read_s=1.0)  # well behind a loaded detector
    assert max(cuts) > 2 and whole["processed"] == [len(text_video[1])] and whole["dropped"] == [0], cuts


def test_a_stages_batches_overlap_as_many_as_its_buffer_sets_and_read_as_one_at_a_time(rec_bundle, scene):
    """20 crops at batch 8: the second batch is submitted before the first is collected (cut and run while
    the first is finished), never more in flight than the runtime's buffer sets; each crop's result is the
    one it gets read alone."""
    from jetpipe.pipelines.core.secondary import _read_groups
    from jetpipe.runtime.api import Frame

    crops = [Frame(scene, "bgr", crop=(20 * (k % 10), 40 * (k // 10), 20 * (k % 10) + 300, 40 * (k // 10) + 40))
             for k in range(20)]
    stage = _stage(rec_bundle)
    runtime, events = stage.runtime, []
    submit, collect = runtime.submit, runtime.collect
    runtime.submit = lambda *a, **k: events.append("submit") or submit(*a, **k)
    runtime.collect = lambda *a, **k: events.append("collect") or collect(*a, **k)
    try:
        (together,) = _read_groups(runtime, stage.post, [(320, crops)])
        assert events == ["submit", "submit", "collect", "submit", "collect", "collect"]
        for index, row in together[::7]:
            [[(_, alone)]] = _read_groups(runtime, stage.post, [(320, [crops[index]])])
            assert alone["text"] == row["text"]
        assert [index for index, _ in together] == list(range(20))
    finally:
        stage.close()


def test_a_new_stream_in_a_slot_never_takes_the_old_streams_results_for_its_tracks():
    """every_track keys results by (slot, track id); a stream added in a removed one's slot gets a new tracker
    that numbers its tracks from 1 again, so without forgetting the slot, its track 1 took the old camera's text
    for up to every_track frames."""
    from jetpipe.pipelines.core.secondary import TrackResults

    tracks = TrackResults(every=3)
    tracks.next_frame(0)
    tracks.keep(0, 1, {"text": "OLD CAMERA"})
    tracks.next_frame(0)
    assert tracks.get(0, 1) == {"text": "OLD CAMERA"}  # reused while younger than every_track frames
    tracks.next_frame(0)
    tracks.next_frame(0)
    assert tracks.get(0, 1) is None  # 3 frames on: read again
    tracks.keep(0, 1, {"text": "OLD CAMERA"})
    tracks.keep(1, 1, {"text": "OTHER SLOT"})
    tracks.forget(0)  # a new stream takes slot 0 (the daemon calls this from its control thread)
    tracks.next_frame(0)  # the secondary's next frame, whichever stream: the forget has taken effect
    assert tracks.get(0, 1) is None and tracks.get(1, 1) == {"text": "OTHER SLOT"}


def test_the_demo_reads_the_text_of_its_cameras(det_bundle, rec_bundle, tmp_path, capsys):
    """`jetpipe demo` (its bundles already converted where it keeps them): each camera's lines come with the
    words read in them, and the run ends with its frames/s and latency."""
    import re
    import shutil

    from jetpipe.cli import main

    shutil.copytree(det_bundle, tmp_path / "demo-ppocr-det")
    shutil.copytree(rec_bundle, tmp_path / "demo-ppocr-rec")
    assert main(["demo", "--duration", "3", "--bundle-dir", str(tmp_path / "demo-ppocr-det"),
                 "--backend", "onnxruntime-cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    read = [line for line in out if re.match(r"stream [01] frame +\d+: \d+ text boxes, read '", line)]
    assert {line.split()[1] for line in read} == {"0", "1"}, out
    assert sum(len(re.findall(r"'[^']+'", line)) for line in read) >= 4, out
    assert re.match(r"onnxruntime-cpu: \d+ frames in [\d.]+ s .* latency p50 \d+ ms p99 \d+ ms$", out[-1]), out


def test_the_models_of_a_chain_on_the_cpu_share_the_cores():
    """With a secondary, the primary's and the secondaries' sessions run at once (two threads): each gets half
    the cores, not all of them (PP-OCRv4 det on 2 cores: 2 threads 359 ms of CPU a frame, 1 thread 240)."""
    from jetpipe.pipelines.service.daemon import shared_cpu_threads

    assert shared_cpu_threads(0, cores=16) == 0     # one model: ONNX Runtime's own count
    assert shared_cpu_threads(1, cores=16) == 8 and shared_cpu_threads(2, cores=16) == 8
    assert shared_cpu_threads(1, cores=2) == 1 and shared_cpu_threads(1, cores=1) == 1


def test_the_pipelines_cpu_sessions_get_their_share(det_bundle, rec_bundle):
    from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
    from jetpipe.pipelines.service.daemon import Pipeline, shared_cpu_threads

    pipeline = Pipeline(validate(PipelineConfig(bundle=det_bundle, sources=[SourceConfig("synthetic")],
                                                secondaries=[SecondaryConfig(rec_bundle)], frames=1,
                                                metrics_listen="", backend="onnxruntime-cpu")))
    try:
        share = shared_cpu_threads(1)
        for runtime in (pipeline.runtime, pipeline.secondaries[0].runtime):
            assert runtime.backend.session.get_session_options().intra_op_num_threads == share
    finally:
        pipeline.close()
