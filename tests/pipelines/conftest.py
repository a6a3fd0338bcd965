import os
import shutil
import socket
import subprocess
import time

import pytest

from jetpipe.convert import ConvertOptions, convert
from jetpipe.models import BUILTIN
from jetpipe.spec import preset


@pytest.fixture(scope="session")
def det_bundle(tmp_path_factory):
    """PP-OCRv4 det, FP32, 640x640, batch up to 4 (converted once per test session)."""
    model = BUILTIN["ppocr-det"]
    out = tmp_path_factory.mktemp("pipelines") / "det"
    convert(ConvertOptions(model=model.path(), output=out, input_size=model.input_size, max_batch=4,
                           spec=preset(model.preset), task=model.task, engine="never", progress=False))
    return out


@pytest.fixture(scope="session")
def rec_bundle(tmp_path_factory):
    """PP-OCRv4 rec, FP32, lines 48 high (80 to 960 wide, fed at 320), batch up to 8."""
    model = BUILTIN["ppocr-rec"]
    out = tmp_path_factory.mktemp("pipelines") / "rec"
    convert(ConvertOptions(model=model.path(), output=out, input_size=model.input_size,
                           input_width_range=model.width_range, max_batch=8, spec=preset(model.preset),
                           task=model.task, engine="never", progress=False))
    return out


@pytest.fixture(scope="session")
def text_video(tmp_path_factory):
    """Six 1280x720 frames of rendered words (MJPEG), and the words of each frame."""
    import cv2

    from jetpipe.synth import render_text_image

    path = tmp_path_factory.mktemp("textvideo") / "text.avi"
    frames = [render_text_image(100 + i, (720, 1280)) for i in range(6)]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 5, (1280, 720))
    for frame in frames:
        writer.write(frame.bgr)
    writer.release()
    return path, [frame.words for frame in frames]


def _detected(det_bundle, images):
    from jetpipe import bundle as bundles
    from jetpipe.runtime.api import Frame
    from jetpipe.runtime.open import open_runtime
    from jetpipe.tasks import for_bundle

    task, options = for_bundle(bundles.load(det_bundle))
    post = task.postprocessor(options)
    with open_runtime(det_bundle, backend="onnxruntime-cpu") as detector:
        frames, results = [Frame(image.bgr, "bgr") for image in images], []
        for frame in frames:  # each batch's outputs are read before the next overwrites its buffers
            found = detector.infer([frame])
            results.append(post(found.outputs, found.letterboxes, [frame.size()])[0])
        return frames, results


@pytest.fixture(scope="session")
def long_lines(det_bundle):
    """Frames of upright lines of four to seven words (longer than 320 / 48 wide), and their detections."""
    from jetpipe.synth import render_tilted_words

    images = [render_tilted_words(seed, (720, 1280), count=6, degrees=(0, 0), words=(4, 7)) for seed in range(4)]
    frames, results = _detected(det_bundle, images)
    return images, frames, results


@pytest.fixture(scope="session")
def detect(det_bundle):
    """images -> (frames, the detector's results), on the CPU runtime."""
    return lambda images: _detected(det_bundle, images)


@pytest.fixture
def mosquitto():
    """A real MQTT broker (Debian's mosquitto) on a free port: its port."""
    binary = shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto",) if os.path.exists(p)), None)
    if binary is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    pytest.importorskip("paho.mqtt.client", reason="paho-mqtt is not installed (pip install 'jetpipe[mqtt]')")
    port = _free_port()
    proc = subprocess.Popen([binary, "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    yield port
    proc.terminate()
    proc.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
