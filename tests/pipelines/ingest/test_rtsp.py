"""A network camera for real: RTSP served on 127.0.0.1 by GStreamer's gst-rtsp-server, read by the
FFmpeg source as YUV; the server goes away mid-stream and comes back, the daemon reconnects."""

import shutil
import socket
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
from jetpipe.pipelines.service.daemon import Pipeline
from tests.support import wait_for

SERVER = Path(__file__).resolve().parents[2] / "rtsp_server.py"
SYSTEM_PYTHON = "/usr/bin/python3"  # PyGObject comes from Debian's packages, not from the venv
CHECK = ("import gi; gi.require_version('GstRtspServer', '1.0'); from gi.repository import Gst, GstRtspServer; "
         "Gst.init(None); missing = [e for e in ('qtdemux', 'h264parse', 'rtph264pay') "
         "if Gst.ElementFactory.find(e) is None]; assert not missing, missing")


def _server_missing() -> str | None:
    if shutil.which("ffmpeg") is None or shutil.which("ffprobe") is None:
        return "ffmpeg/ffprobe not installed (apt install ffmpeg)"
    try:
        subprocess.run([SYSTEM_PYTHON, "-c", CHECK], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return ("no RTSP server here: apt install python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-rtsp "
                "gstreamer1.0-plugins-good gstreamer1.0-plugins-bad (.ci/run installs them)")
    return None


pytestmark = pytest.mark.skipif(_server_missing() is not None, reason=str(_server_missing()))


class RtspServer:
    def __init__(self, clip: Path):
        self.clip, self.process = clip, None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"rtsp://127.0.0.1:{self.port}/live"

    def start(self) -> None:
        self.process = subprocess.Popen([SYSTEM_PYTHON, str(SERVER), str(self.clip), str(self.port)],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().strip() == "ready", self.process.stderr.read()

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@pytest.fixture
def rtsp(tmp_path):
    clip = tmp_path / "cam.mp4"
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=s=320x240:r=30", "-t", "60",
                    "-c:v", "libx264", "-preset", "veryfast", "-g", "15", "-pix_fmt", "yuv420p", str(clip)],
                   check=True)
    server = RtspServer(clip)
    server.start()
    yield server
    server.stop()


def test_an_rtsp_camera_that_drops_out_is_reconnected(tiny_bundle, rtsp):
    config = validate(PipelineConfig(bundle=tiny_bundle, sources=[SourceConfig(rtsp.url, decoder="ffmpeg")],
                                     metrics_listen="", reconnect_max_s=0.5, backend="onnxruntime-cpu"))
    pipeline = Pipeline(config)
    summary = {}
    runner = threading.Thread(target=lambda: summary.update(pipeline.run()))
    runner.start()
    try:
        m = pipeline.metrics
        wait_for(lambda: m.captured[0] >= 30, 30, "the first 30 frames")
        source = pipeline.sources[0]
        assert source.info.format in ("nv12", "i420") and (source.info.width, source.info.height) == (320, 240)
        rtsp.stop()  # the camera goes away mid-stream
        wait_for(lambda: m.reconnects[0] >= 1, 30, "the source to notice and retry")
        before = m.captured[0]
        rtsp.start()  # and comes back on the same address
        wait_for(lambda: m.captured[0] >= before + 30, 60, "frames after the camera came back")
    finally:
        pipeline.stop()
        runner.join(30)
    assert not runner.is_alive()
    assert summary["reconnects"][0] >= 1 and summary["failed"][0] >= 1
    assert summary["processed"][0] + summary["dropped"][0] >= 60


def test_an_rtsp_camera_with_b_frames_is_remuxed_for_nvdec(rtsp):
    """The hardware decoder's feed of an RTSP camera whose H.264 has B-frames (the fixture's: x264's defaults): its
    first packet came without a decoding time, the remux ffmpeg's MPEG-TS muxer refused it ("first pts and dts
    value must be set") and ended, at every connection. Its packets now reach the demuxer NVDEC reads, with
    decoding times that rise."""
    from jetpipe.pipelines.ingest.sources.ffmpeg import RemuxFeed
    from jetpipe.runtime.nvdec_pipe import NO_TIME, PipeDemuxer
    from jetpipe.uri import parse
    from tests.runtime.test_nvdec_pipe import CODEC_IDS, PacketData

    feed = RemuxFeed(parse(rtsp.url))
    feed.start()
    try:
        demuxer = PipeDemuxer(feed, PacketData, CODEC_IDS)
        times = []
        for packet in demuxer:
            times.append(packet.dts)
            if len(times) == 30:
                break
        demuxer.close()
    finally:
        feed.stop()
    assert len(times) == 30 and NO_TIME not in times and times == sorted(set(times))


def test_a_jetsons_rtsp_pipeline_reads_the_camera_over_tcp(tmp_path, monkeypatch):
    """A Jetson reads an RTSP camera with rtspsrc over TCP, as FFmpeg does elsewhere (-rtsp_transport tcp), with no
    jitter buffer hold (latency=0: with latency=200 a live stream's clock-synced sink kept each frame 170-200 ms
    longer; scripts/diag/rtsp_hold.py). Its command, software elements in the hardware's places, gives a real RTSP
    server's frames, equal to FFmpeg's decoding of the camera's clip."""
    from jetpipe.frames import frame_shape
    from jetpipe.pipelines.ingest.sources.base import FrameInfo
    from jetpipe.pipelines.ingest.sources.gstreamer import GstSource
    from jetpipe.uri import parse
    from tests.pipelines.ingest.test_sources import ffmpeg_decode
    from tests.support import jetson_pipeline_in_software

    jetson_pipeline_in_software(monkeypatch)
    clip = tmp_path / "baseline.mp4"  # openh264dec, the stand-in for nvv4l2decoder, decodes the baseline profile
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=s=320x240:r=30", "-t", "10",
                    "-c:v", "libx264", "-profile:v", "baseline", "-g", "15", "-pix_fmt", "yuv420p", str(clip)],
                   check=True)
    camera = RtspServer(clip)
    camera.start()
    source = GstSource(parse(camera.url), info=FrameInfo("nv12", 240, 320, fps=30.0))
    try:
        assert "protocols=tcp" in source.command()
        info = source.open()
        slot = np.empty(frame_shape(info.format, info.height, info.width), np.uint8)
        frames = []
        for _ in range(8):
            source.read_into(slot)
            frames.append(slot.tobytes())
    finally:
        source.close()
        camera.stop()
    size = 320 * 240 * 3 // 2
    decoded = ffmpeg_decode(clip, "nv12")
    assert frames == [decoded[k * size:(k + 1) * size] for k in range(8)]
