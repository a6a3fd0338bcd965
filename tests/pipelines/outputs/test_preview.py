"""The live preview page: drawn only while watched, updating, and in a real headless browser."""

import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request

import cv2
import numpy as np
import pytest

from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
from jetpipe.pipelines.counters import StreamCounters
from jetpipe.pipelines.ingest.sources import SyntheticCamera
from jetpipe.pipelines.outputs.annotate import PALETTE, UNTRACKED
from jetpipe.pipelines.outputs.preview import stats_json
from jetpipe.pipelines.service.daemon import Pipeline
from tests.support import free_port, wait_for


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def serving(det_bundle):
    """A daemon on the synthetic camera (640x480 at 10 fps, every frame tracked) with its metrics server."""
    port = free_port()
    config = validate(PipelineConfig(bundle=det_bundle, sources=[SourceConfig("synthetic://640x480@10/nv12")],
                                     metrics_listen=f"127.0.0.1:{port}", backend="onnxruntime-cpu",
                                     tracker="bytetrack"))
    pipeline = Pipeline(config)
    runner = threading.Thread(target=pipeline.run)
    runner.start()
    try:
        yield pipeline, f"http://127.0.0.1:{port}"
    finally:
        pipeline.stop()
        runner.join(30)


def _watch(base, frames, timeout=120.0):
    """Ask for stream 0's preview like the page does until `frames` distinct JPEGs came (or the timeout: a
    loaded machine draws slowly); returns them and the seconds watched."""
    seen, start = [], time.monotonic()
    while len(seen) < frames and time.monotonic() - start < timeout:
        status, body = _get(f"{base}/preview/0.jpg")
        if status == 200 and (not seen or body != seen[-1]):
            seen.append(body)
        time.sleep(0.2)
    return seen, time.monotonic() - start


def test_frames_are_drawn_only_while_someone_watches_and_then_update(serving):
    pipeline, base = serving
    assert wait_for(lambda: pipeline.metrics.processed[0] >= 5)
    assert pipeline.preview.drawn == 0  # unwatched: nothing drawn
    frames, watched = _watch(base, 3)
    assert len(frames) >= 3  # the image updates
    image = cv2.imdecode(np.frombuffer(frames[-1], np.uint8), cv2.IMREAD_COLOR)
    assert image.shape == (480, 640, 3)
    assert pipeline.preview.drawn <= watched * 5 + 3  # at most 5 per second
    stats = json.loads(_get(f"{base}/stats.json")[1])
    assert stats["processed"] > 0 and stats["streams"][0]["fps"] > 0
    status, page = _get(base + "/")
    assert status == 200 and b'/preview/" + i + ".jpg' in page and b"synthetic://640x480@10/nv12" in page


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium not installed (apt install chromium)")
def test_the_page_in_a_headless_browser_shows_boxes_on_the_words(serving, tmp_path):
    pipeline, base = serving
    assert _watch(base, 1)[0]  # frames are being drawn before the browser arrives
    shot = tmp_path / "page.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={shot}", "--window-size=700,560", "--virtual-time-budget=3000", base + "/"],
                   capture_output=True, timeout=120, check=True)
    page = cv2.imread(str(shot))
    assert page is not None
    # box outlines are drawn in the tracker's palette: which rows of the frame hold them
    top = _image_top(page)
    frame = page[top:top + 480, :].astype(int)
    near = np.zeros(frame.shape[:2], bool)
    for color in (*PALETTE, UNTRACKED):
        near |= np.abs(frame - color).max(axis=2) < 25
    rows = np.flatnonzero(near.sum(axis=1) >= 12)  # a horizontal box edge, not a stray pixel
    assert len(rows) > 0, "no box drawn on the page"
    word_rows = set()
    for _x0, y0, _x1, y1 in SyntheticCamera(640, 480, 0, "nv12", seed=0).boxes:  # the words pan sideways only
        word_rows.update(range(int(y0) - 14, int(y1) + 6))
    assert np.isin(rows, list(word_rows)).mean() > 0.8  # drawn where the camera's words are


def _image_top(page: np.ndarray) -> int:
    """First row of the preview image: below the page's dark background and summary line."""
    background = page[2, 2].astype(int)
    varied = np.flatnonzero((np.abs(page.astype(int) - background).sum(axis=2) > 40).sum(axis=1) > 300)
    return int(varied[0]) if len(varied) else 0


def test_stats_give_each_stream_its_own_latency():
    metrics = StreamCounters(streams=2)
    for i in range(50):  # stream 1 waits ten times longer (a slow camera's frames queue behind a batch)
        metrics.record_result(0, {"queue": 1.0, "gpu": 5.0, "post": 1.0, "total": 10.0 + i % 3})
        metrics.record_result(1, {"queue": 90.0, "gpu": 5.0, "post": 1.0, "total": 100.0 + i % 3})
    streams = json.loads(stats_json(metrics, [0, 4]))["streams"]
    assert [s["p50_ms"] for s in streams] == [11.0, 101.0] and [s["p99_ms"] for s in streams] == [12.0, 102.0]
    assert [s["dropped"] for s in streams] == [0, 4] and [s["processed"] for s in streams] == [50, 50]
