"""Annotated video and JPEG sinks on real components: FFmpeg-encoded input, PP-OCRv4 det, FFmpeg encoder."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from jetpipe.cli import main
from jetpipe.errors import JetpipeError
from jetpipe.pipelines.ingest.sources import SyntheticCamera
from jetpipe.pipelines.outputs.sinks import encoders

pytestmark = pytest.mark.skipif(shutil.which("ffmpeg") is None or shutil.which("ffprobe") is None,
                                reason="ffmpeg/ffprobe not installed (apt install ffmpeg)")


def _text_clip(path, frames=24, fps=30):
    """An H.264 file of the synthetic camera's panning words (real text for the detector to find)."""
    camera = SyntheticCamera(320, 240, 0, "bgr", seed=1, step=2)
    encoder = subprocess.Popen(["ffmpeg", "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "bgr24", "-s", "320x240",
                                "-r", str(fps), "-i", "pipe:0", "-c:v", "libx264", "-preset", "veryfast", "-pix_fmt",
                                "yuv420p", str(path)], stdin=subprocess.PIPE)
    slot = np.empty((240, 320, 3), np.uint8)
    for _ in range(frames):
        camera.read_into(slot)
        encoder.stdin.write(slot.tobytes())
    encoder.stdin.close()
    assert encoder.wait() == 0
    return path


def _probe(path) -> dict:
    out = subprocess.run(["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
                          "stream=codec_name,width,height,nb_read_frames", "-of", "json", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["streams"][0]


def test_video_and_jpeg_sinks_draw_the_tracked_words(det_bundle, tmp_path):
    clip = _text_clip(tmp_path / "in.mp4")
    jpegs = tmp_path / "jpegs"
    jpegs.mkdir()
    records = tmp_path / "r.jsonl"
    assert main(["serve", "--bundle", str(det_bundle), "--source", str(clip), "--decoder", "ffmpeg",
                 "--backend", "onnxruntime-cpu", "--tracker", "bytetrack", "--metrics", "",
                 "--sink", f"jsonl:{records}", "--sink", f"video:{tmp_path / 'out.mp4'}",
                 "--sink", f"jpeg:{jpegs}?every=6"]) == 0
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(lines) == 24
    video = _probe(tmp_path / "out.mp4")
    assert (video["codec_name"], video["width"], video["height"]) == ("h264", 320, 240)
    assert int(video["nb_read_frames"]) == 24  # every frame: files wait, the sink kept up
    assert sorted(p.name for p in jpegs.iterdir()) == [f"s0_{i:06d}.jpg" for i in (0, 6, 12, 18)]
    # the drawn frame differs from the source frame on the detected boxes' outlines, and hardly elsewhere
    capture = cv2.VideoCapture(str(clip))
    for _ in range(13):
        ok, source = capture.read()
    capture.release()
    drawn = cv2.imread(str(jpegs / "s0_000012.jpg"))
    record = lines[12]["results"]
    assert ok and record["boxes"] and any(t is not None for t in record["track_ids"])
    diff = np.abs(drawn.astype(int) - source).max(axis=2)
    near = np.zeros(diff.shape, bool)
    for x0, y0, x1, y1 in np.round(record["boxes"]).astype(int):
        x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, 319), min(y1, 239)
        assert diff[y1, x0:x1 + 1].mean() > 40  # the bottom edge of the box is drawn
        near[max(y0 - 20, 0):y1 + 4, max(x0 - 4, 0):x1 + 40] = True  # the box and its label
    assert diff[~near].mean() < 6  # elsewhere: the source, up to compression


GST_WRITER = ("x264enc", "fdsrc", "rawvideoparse", "videoconvert", "h264parse", "mp4mux", "matroskamux", "filesink")


def _gst_missing() -> list[str]:
    """The elements of the tests' GStreamer writer this machine lacks (all of them without gst-inspect-1.0)."""
    if shutil.which("gst-inspect-1.0") is None:
        return list(GST_WRITER)
    return [e for e in GST_WRITER if subprocess.run(["gst-inspect-1.0", e], capture_output=True).returncode != 0]


needs_x264enc = pytest.mark.skipif(
    bool(_gst_missing()), reason=f"GStreamer lacks {', '.join(_gst_missing())} (x264enc: apt install "
                                 "gstreamer1.0-plugins-ugly; muxers: -good; parsers: -bad; .ci/run installs them)")


@pytest.mark.parametrize("encoder", ["", pytest.param("?encoder=gst:x264enc", marks=needs_x264enc)])
def test_a_sigterm_leaves_a_finished_video(tiny_bundle, tmp_path, encoder):
    """FFmpeg, and GStreamer as it runs on a Jetson (there with nvv4l2h264enc): a finished file either way."""
    out = tmp_path / "live with space.mp4"
    proc = subprocess.Popen([sys.executable, "-m", "jetpipe", "serve", "--bundle", str(tiny_bundle), "--source",
                             "synthetic://320x240@15/nv12", "--backend", "onnxruntime-cpu", "--metrics", "",
                             "--sink", f"video:{out}{encoder}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (out.exists() and out.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()[-500:]
    video = _probe(out)  # the container was finalized: ffprobe reads it
    assert int(video["nb_read_frames"]) > 0 and (video["codec_name"], video["width"]) == ("h264", 320)


@pytest.mark.parametrize("encoder", ["", pytest.param("?encoder=gst:x264enc", marks=needs_x264enc)])
def test_a_video_stays_playable_when_the_daemon_and_its_encoder_are_killed(tiny_bundle, tmp_path, encoder):
    """systemd's SIGKILL after TimeoutStopSec takes the whole group, the encoder too (issue 49: every MP4 was
    then unplayable, no moov atom): fragments, a keyframe a second, play up to the last one written."""
    out = tmp_path / "killed.mp4"
    proc = subprocess.Popen([sys.executable, "-m", "jetpipe", "serve", "--bundle", str(tiny_bundle), "--source",
                             "synthetic://320x240@15/nv12", "--backend", "onnxruntime-cpu", "--metrics", "",
                             "--sink", f"video:{out}{encoder}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)  # a group of its own, as a unit's cgroup
    def fragments_hold() -> int:
        try:
            return int(_probe(out)["nb_read_frames"])
        except (subprocess.CalledProcessError, KeyError, IndexError, ValueError):
            return 0

    try:
        deadline = time.monotonic() + 90
        while fragments_hold() < 15 and time.monotonic() < deadline:
            time.sleep(0.5)  # a second of fragments written
        assert fragments_hold() >= 15, proc.stderr.read().decode()[-500:]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    video = _probe(out)
    assert int(video["nb_read_frames"]) >= 15 and (video["codec_name"], video["width"]) == ("h264", 320)


@pytest.mark.parametrize("encoder", ["", pytest.param("?encoder=gst:x264enc", marks=needs_x264enc)])
def test_the_annotated_video_of_a_10_fps_file_lasts_as_long_as_the_file(tiny_bundle, tmp_path, encoder):
    """Issue 49: 3 s at 10 fps became 1 s (written at 30 fps); ?fps= still sets the rate."""
    clip = _text_clip(tmp_path / "in.mp4", frames=30, fps=10)
    out, fixed = tmp_path / "out.mp4", tmp_path / "fixed.mp4"
    for path, extra in ((out, ""), (fixed, "&fps=30" if encoder else "?fps=30")):
        assert main(["serve", "--bundle", str(tiny_bundle), "--source", str(clip), "--decoder", "ffmpeg", "--backend",
                     "onnxruntime-cpu", "--metrics", "", "--sink", f"video:{path}{encoder}{extra}"]) == 0
    durations = []
    for path in (out, fixed):
        probe = subprocess.run(["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
                                "stream=nb_read_frames,r_frame_rate:format=duration", "-of", "json", str(path)],
                               capture_output=True, text=True, check=True)
        info = json.loads(probe.stdout)
        assert int(info["streams"][0]["nb_read_frames"]) == 30
        durations.append(float(info["format"]["duration"]))
    assert durations[0] == pytest.approx(3.0, abs=0.15) and durations[1] == pytest.approx(1.0, abs=0.1)


@needs_x264enc
def test_a_gstreamer_encoder_gets_every_drawn_frame(tiny_bundle, tmp_path):
    clip = _text_clip(tmp_path / "in.mp4")
    out = tmp_path / "out.mkv"
    assert main(["serve", "--bundle", str(tiny_bundle), "--source", str(clip), "--decoder", "ffmpeg", "--backend",
                 "onnxruntime-cpu", "--metrics", "", "--sink", f"video:{out}?encoder=gst:x264enc&width=160"]) == 0
    video = _probe(out)
    assert (video["codec_name"], video["width"], video["height"]) == ("h264", 160, 120)
    assert int(video["nb_read_frames"]) == 24


def test_auto_takes_nvenc_only_where_a_trial_encode_works(caplog):
    """No GPU here: FFmpeg builds that list h264_nvenc (Debian's does) must not be trusted by the list."""
    caplog.set_level("INFO")
    encoders.nvenc_works.cache_clear()
    assert encoders.choose("video:x.mp4", "h264", jetson=False) == ("ffmpeg", "libx264")
    listed = subprocess.run(["ffmpeg", "-hide_banner", "-encoders"], capture_output=True, text=True).stdout
    if " h264_nvenc " in listed:
        assert "h264_nvenc is built into ffmpeg but cannot encode here" in caplog.text


@needs_x264enc
def test_a_gstreamer_missing_an_element_of_the_pipeline_is_one_line_at_start(tiny_bundle, tmp_path, monkeypatch,
                                                                             capsys):
    """x264enc there, the muxer not (issue 49: it started, wrote nothing and exited 0)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    real = shutil.which("gst-inspect-1.0")
    (fake / "gst-inspect-1.0").write_text(f'#!/bin/sh\n[ "$1" = matroskamux ] && exit 1\nexec {real} "$@"\n')
    (fake / "gst-inspect-1.0").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    out = tmp_path / "out.mkv"
    assert main(["serve", "--bundle", str(tiny_bundle), "--source", "synthetic", "--frames", "2", "--metrics", "",
                 "--sink", f"video:{out}?encoder=gst:x264enc"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no element 'matroskamux'" in err[0] and "gstreamer1.0-plugins-good" in err[0], err
    assert not out.exists()


def test_on_a_jetson_auto_encodes_in_hardware_through_gstreamer(monkeypatch):
    """No Jetson here: the pipeline it would run, by its text; and without its plugin, one line."""
    argv = encoders.gst_argv("nvv4l2h265enc", "hevc", (1080, 1920), 29.97, Path("/videos/cam 1.mp4"))
    text = " ".join(argv)
    assert argv[:3] == ["gst-launch-1.0", "-q", "-e"] and "location=/videos/cam 1.mp4" in argv
    assert ("fdsrc fd=0 ! rawvideoparse format=bgr width=1920 height=1080 framerate=2997/100 ! videoconvert ! "
            "video/x-raw,format=I420 ! nvvidconv ! video/x-raw(memory:NVMM),format=NV12 ! nvv4l2h265enc "
            "iframeinterval=30 ! h265parse ! mp4mux fragment-duration=1000 ! filesink") in text
    # the keyframe interval only where the element has that property (any other gst: element keeps its own)
    other = " ".join(encoders.gst_argv("openh264enc", "h264", (240, 320), 15, Path("/videos/a.mkv")))
    assert "! openh264enc ! h264parse ! matroskamux ! filesink" in other
    if shutil.which("gst-inspect-1.0") is None:
        pytest.skip("gst-inspect-1.0 not installed")
    with pytest.raises(JetpipeError, match="GStreamer has no element 'nvv4l2h264enc' here"):
        encoders.choose("video:x.mp4", "h264", jetson=True)


@pytest.mark.parametrize("sink, message", [
    ("video:{tmp}/missing/out.mp4", "folder {tmp}/missing does not exist"),
    ("video:{tmp}/exists.mp4", "exists.mp4 exists: name a new file"),
    ("video:{tmp}/out.mp4?codec=av1", "codec 'av1': choose h264 or hevc"),
    ("jpeg:{tmp}/nofolder", "is not a folder: create it first"),
    ("video:{tmp}/out.mp4?width=abc", "width='abc': give a number above 0"),
    ("video:{tmp}/out.mp4?width=", "width='': give a number above 0"),  # an empty option was ignored
    ("video:{tmp}/out.mp4?fps=0", "fps='0': give a number above 0"),
    ("jpeg:{tmp}?every=-2", "every='-2': give a number above 0"),
    pytest.param("video:{tmp}/out.mp4?encoder=gst:nosuchenc", "GStreamer has no element 'nosuchenc' here",
                 marks=pytest.mark.skipif(shutil.which("gst-launch-1.0") is None,
                                          reason="gst-launch-1.0 not installed (apt install gstreamer1.0-tools)")),
    ("video:{tmp}/out.mp4?encoder=bogus", "encoder 'bogus' cannot encode here (Unknown encoder 'bogus')"),
    ("video:{tmp}/out.mp4?widht=320", "unknown option 'widht'; this sink takes width, fps, codec, encoder"),
    ("video:{tmp}/dangling.mp4", "dangling.mp4 exists: name a new file"),
])
def test_bad_frame_sinks_are_one_line_at_start(tiny_bundle, tmp_path, capsys, sink, message):
    (tmp_path / "exists.mp4").write_bytes(b"a user's video")
    (tmp_path / "dangling.mp4").symlink_to(tmp_path / "made-through-a-link.mp4")
    assert main(["serve", "--bundle", str(tiny_bundle), "--source", "synthetic", "--frames", "1", "--metrics", "",
                 "--sink", sink.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path) in err and "Traceback" not in err
    assert (tmp_path / "exists.mp4").read_bytes() == b"a user's video"
    assert not (tmp_path / "made-through-a-link.mp4").exists()


def test_a_jpeg_sink_never_overwrites_frames_in_its_folder(tiny_bundle, tmp_path, capsys):
    folder = tmp_path / "frames"
    folder.mkdir()
    (folder / "s0_000000.jpg").write_bytes(b"a frame from before")
    assert main(["serve", "--bundle", str(tiny_bundle), "--source", "synthetic", "--frames", "2", "--metrics", "",
                 "--sink", f"jpeg:{folder}"]) == 2
    assert "holds frames already (s0_000000.jpg, ...): name an empty folder" in capsys.readouterr().err
    assert (folder / "s0_000000.jpg").read_bytes() == b"a frame from before"


def test_a_missing_encoder_is_one_line_at_start(tiny_bundle, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no ffmpeg on it
    assert main(["serve", "--bundle", str(tiny_bundle), "--source", "synthetic", "--frames", "1", "--metrics", "",
                 "--sink", f"video:{tmp_path / 'out.mp4'}"]) == 2
    assert "needs ffmpeg to encode video: apt install ffmpeg" in capsys.readouterr().err


def test_an_encoder_that_dies_at_the_end_is_counted_in_the_summary(tiny_bundle, tmp_path):
    """The summary comes after the sinks have finished: an encoder killed at the last result (its file left
    unfinished) is a sink failure, not a log line after a summary that says 0."""
    from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
    from jetpipe.pipelines.service.daemon import Pipeline

    clip = _text_clip(tmp_path / "in.mp4", frames=12)
    config = validate(PipelineConfig(bundle=tiny_bundle, sources=[SourceConfig(str(clip), decoder="ffmpeg")],
                                     sinks=[f"video:{tmp_path / 'out.mp4'}?encoder=libx264"], backend="onnxruntime-cpu",
                                     metrics_listen=""))
    killed = []

    def kill_the_encoder_at_the_last_result(record):
        if record.frame == 11:
            sink = pipeline.sinks.sinks[0]
            deadline = time.monotonic() + 20
            while sink._free[0].qsize() < sink.buffers and time.monotonic() < deadline:
                time.sleep(0.01)  # every frame it took has been written: only its end can fail now
            for process in sink.encoders.values():
                process.kill()
                killed.append(process)

    pipeline = Pipeline(config, on_result=kill_the_encoder_at_the_last_result)
    summary = pipeline.run()
    assert killed and summary["processed"] == [12]
    assert summary["sink_failures"] == [1]  # its exit code, found when the sink finished


@pytest.fixture
def full_disk(tmp_path):
    """A 256 KB tmpfs: a disk that fills up after a few frames (needs root, as CI runs)."""
    import os

    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_fails_the_sink_and_nothing_else(tiny_bundle, tmp_path, full_disk):
    clip = _text_clip(tmp_path / "in.mp4", frames=24)
    records = tmp_path / "r.jsonl"
    argv = ["serve", "--bundle", str(tiny_bundle), "--source", str(clip), "--decoder", "ffmpeg", "--backend",
            "onnxruntime-cpu", "--metrics", "", "--sink", f"jpeg:{full_disk}", "--sink", f"video:{full_disk / 'v.mp4'}",
            "--sink", f"jsonl:{records}"]
    import io
    from contextlib import redirect_stderr

    captured = io.StringIO()
    with redirect_stderr(captured):
        assert main(argv) == 0
    summary = json.loads(captured.getvalue().strip().splitlines()[-1])["summary"]
    assert summary["processed"] == [24] and len(records.read_text().splitlines()) == 24  # the others went on
    assert summary["sink_failures"][0] > 0  # the JPEGs that did not fit were counted


def test_a_video_left_unplayable_by_a_full_disk_is_a_counted_failure(tiny_bundle, tmp_path):
    """ffmpeg 5.1 exits 0 after failing to write the trailer on a full disk: the sink opens its file when it
    closes, and a file that does not play is a failure in the summary (it said sink_failures [0])."""
    from tests.helpers import nearly_full_disk

    with nearly_full_disk(tmp_path / "small", 64, free_kb=8) as small:  # less than the video
        done = subprocess.run([sys.executable, "-m", "jetpipe", "serve", "--bundle", str(tiny_bundle), "--source",
                               "synthetic:640x480", "--frames", "40", "--metrics", "", "--backend", "onnxruntime-cpu",
                               "--sink", f"video:{small / 'out.mp4'}?encoder=libx264"],
                              capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stderr.strip().splitlines()[-1])["summary"]
    assert summary["sink_failures"] == [1], summary["sink_failures"]
    # a fragmented MP4 opens however short it is: it holds fewer frames than were written
    assert ("unplayable" in done.stderr or "frames written" in done.stderr) and "the disk may be full" in done.stderr
