"""Looks for botsort (issue 65 item 3): the built-in colour cue run like any model on the crops (ONNX Runtime
here), an embedding bundle the user brings checked at start, and --reid through serve."""

import json

import numpy as np
import pytest

from jetpipe.cli import main
from jetpipe.pipelines.core.tracking.appearance import Appearance
from jetpipe.runtime.api import Frame


@pytest.fixture(scope="module")
def colour():
    appearance = Appearance("colour", backend="onnxruntime-cpu")
    yield appearance
    appearance.close()


def _striped() -> np.ndarray:
    """A 480 x 640 BGR picture: a red person (top) in grey trousers on the left, a blue one on the right."""
    image = np.full((480, 640, 3), 48, np.uint8)  # the colours in the middle of the cue's levels (32 wide)
    image[50:250, 50:150] = (48, 48, 208)
    image[250:450, 50:150] = (144, 144, 144)
    image[50:250, 400:500] = (208, 80, 48)
    image[250:450, 400:500] = (144, 144, 144)
    return image


def test_the_colour_cue_tells_colours_apart_and_a_look_again_alike(colour):
    frame = Frame(_striped(), "bgr")
    red, blue, red_again, outside = [50, 50, 150, 450], [400, 50, 500, 450], [52, 48, 149, 452], [700, 0, 800, 10]
    looks = colour.embed([(frame, np.array([red, blue])), (frame, np.array([red_again, outside]))])
    assert looks.shape == (4, 96) and colour.crops == 3  # the box outside the frame is not cut
    assert np.allclose(np.linalg.norm(looks[:3], axis=1), 1.0, atol=1e-5) and not looks[3].any()
    assert looks[0] @ looks[2] > 0.97 and looks[0] @ looks[1] < 0.8


def test_the_colour_cue_reads_a_yuv_frame_as_its_colours(colour):
    """The crop is cut and colour-converted where the frame is: an NV12 frame's look is its BGR frame's."""
    import cv2

    image = _striped()
    i420 = cv2.cvtColor(image, cv2.COLOR_BGR2YUV_I420)
    h, w = image.shape[:2]
    nv12 = np.concatenate([i420[:h], np.stack([i420[h:h + h // 4].reshape(-1), i420[h + h // 4:].reshape(-1)],
                                              axis=1).reshape(h // 2, w)])
    boxes = np.array([[50, 50, 150, 450], [400, 50, 500, 450]])
    from_bgr = colour.embed([(Frame(image, "bgr"), boxes)])
    from_nv12 = colour.embed([(Frame(nv12, "nv12", range="full"), boxes)])
    assert (np.sum(from_bgr * from_nv12, axis=1) > 0.95).all()


def test_reid_is_checked_at_start(det_bundle, tmp_path, capsys):
    """A bundle that is not an embedding model, another tracker than botsort, a folder that is no bundle: one
    line each, exit 2, before anything runs."""
    video = tmp_path / "none.mp4"
    video.write_bytes(b"")
    for flags, said in ((["--reid", str(det_bundle)], "convert it with --task embedding"),
                        (["--reid", "colour", "--tracker", "bytetrack"], "set tracker = \"botsort\""),
                        (["--reid", str(tmp_path)], "")):
        assert main(["serve", "--bundle", str(det_bundle), "--source", str(video), "--metrics", "", *flags]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err and "Traceback" not in err, err


def test_serve_with_the_colour_cue_tracks_and_says_what_looks_did(det_bundle, tmp_path):
    """A rendered scene of signs walking behind pillars served with --reid colour: looks taken of only some of
    the boxes, the summary saying what the cue's cosines were, and with --reid-in-events each object's event
    carrying its track's look (a unit vector of float16, in base64)."""
    import base64
    import shutil

    from jetpipe.calibration.tracking_scenes import render_scene

    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg renders the scene (apt-get install ffmpeg)")
    video = tmp_path / "scene.mp4"
    render_scene("pillars", video, fps=10, seconds=5, seed=3)
    summary, records = tmp_path / "summary.json", tmp_path / "out.jsonl"
    assert main(["serve", "--bundle", str(det_bundle), "--source", str(video), "--reid", "colour", "--metrics", "",
                 "--zone", "all:0,0,1,0,1,1,0,1", "--reid-in-events", "--sink", f"jsonl:{records}",
                 "--summary", str(summary)]) == 0
    reid = json.loads(summary.read_text())["summary"]["reid"]
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    frames = [r for r in lines if "schema" not in r]
    boxes = sum(len(r["results"]["boxes"]) for r in frames)
    tracked = sum(sum(1 for t in r["results"]["track_ids"] if t is not None and t >= 0) for r in frames)
    print(reid, boxes, tracked)
    assert reid["model"] == "colour" and 0 < reid["crops"] < boxes and tracked > boxes // 2
    assert reid["samples"][1] > 0 and reid["two_objects_cosine"] < 1.0
    entered = [r for r in lines if r.get("type") == "zone_enter"]
    assert len(entered) >= 3 and all("embedding" in e for e in entered)
    look = np.frombuffer(base64.b64decode(entered[0]["embedding"]), "<f2").astype(np.float32)
    assert look.shape == (96,) and abs(np.linalg.norm(look) - 1) < 0.01


def test_reid_in_events_needs_looks(det_bundle, tmp_path, capsys):
    video = tmp_path / "none.mp4"
    video.write_bytes(b"")
    assert main(["serve", "--bundle", str(det_bundle), "--source", str(video), "--metrics", "", "--reid-in-events",
                 "--tracker", "botsort"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--reid" in err
