"""Sources on real encoded video: URIs, FFmpeg into raw YUV, GStreamer, backpressure, errors, stopping.

Videos are encoded with ffmpeg at test time (H.264, HEVC, MJPEG, odd and portrait sizes).
"""

import contextlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from jetpipe import uri as uris
from jetpipe.cli import main
from jetpipe.frames import ColourMatrix, frame_shape
from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
from jetpipe.pipelines.ingest.batcher import Batcher, QueuedFrame
from jetpipe.pipelines.ingest.sources import EndOfStream, FFmpegSource, GstSource, PyAVSource, SourceError, open_source
from jetpipe.pipelines.ingest.sources.ffmpeg import RemuxFeed
from jetpipe.pipelines.ingest.sources.gstreamer import caps_of, jetson_pipeline
from jetpipe.pipelines.service.daemon import Pipeline
from jetpipe.preprocess import preprocess_bgr, preprocess_frame
from jetpipe.spec import PreprocessSpec
from tests.helpers import residual_cnn, save
from tests.stream_server import StreamServer, frame_offset
from tests.support import wait_for

needs_ffmpeg = pytest.mark.skipif(shutil.which("ffmpeg") is None or shutil.which("ffprobe") is None,
                                  reason="ffmpeg/ffprobe not installed (apt install ffmpeg; .ci/run installs it)")
needs_gst = pytest.mark.skipif(shutil.which("gst-launch-1.0") is None,
                               reason="gst-launch-1.0 not installed (apt install gstreamer1.0-tools)")


def encode(path, size="320x240", frames=30, codec="libx264", pix_fmt="yuv420p", extra=(), vf=None):
    filters = f"scale={size.replace('x', ':')}" + (f",{vf}" if vf else "") + f",format={pix_fmt}"
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=s=640x480:r=30",
                    "-frames:v", str(frames), "-vf", filters, "-c:v", codec, *extra, str(path)], check=True)
    return path


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg not installed")
    folder = tmp_path_factory.mktemp("videos")
    return {
        "h264": encode(folder / "h264.mp4", "320x240", 45),
        "hevc": encode(folder / "hevc.mp4", "1280x720", 12, "libx265", extra=("-x265-params", "log-level=error")),
        "mjpeg": encode(folder / "mjpeg.avi", "320x240", 10, "mjpeg", "yuvj422p"),
        "mjpeg420": encode(folder / "mjpeg420.avi", "320x240", 10, "mjpeg", "yuvj420p"),
        "odd": encode(folder / "odd.mp4", "641x481", 10, pix_fmt="yuv444p"),
        "portrait": encode(folder / "portrait.mp4", "240x320", 10),
        "odd420": encode(folder / "odd420.mkv", "641x481", 10, "ffv1"),
    }


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("srcbundle")
    model = save(residual_cnn(batch=1, size=32), folder / "tiny.onnx")
    assert main(["convert", model, "-o", str(folder / "b"), "--max-batch", "4", "--quiet"]) == 0
    return folder / "b"


def ffmpeg_decode(path, pix_fmt, vf=None) -> bytes:
    argv = ["ffmpeg", "-v", "error", "-i", str(path), *(["-vf", vf] if vf else []), "-f", "rawvideo",
            "-pix_fmt", pix_fmt, "pipe:1"]
    return subprocess.run(argv, capture_output=True, check=True).stdout


def as_mpegts(path, out):
    """The file's streams copied into MPEG-TS (what network cameras send), nothing re-encoded."""
    subprocess.run(["ffmpeg", "-v", "error", "-i", str(path), "-c", "copy", "-f", "mpegts", str(out)], check=True)
    return out


def corrupted_copy(path, out):
    """The file with 4000 random bytes in its middle (an H.264 stretch the decoder cannot read)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4000] = bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8))
    out.write_bytes(bytes(data))
    return out


def read_all(source):
    info = source.open()
    frames = []
    try:
        while True:
            slot = np.empty(frame_shape(info.format, info.height, info.width), np.uint8)
            source.read_into(slot)
            frames.append(slot)
    except EndOfStream:
        pass
    finally:
        source.close()
    return info, frames


# --- URIs ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, scheme, location", [
    ("csi://0", "csi", "0"),
    ("v4l2:///dev/video0", "v4l2", "/dev/video0"),
    ("v4l2://1", "v4l2", "/dev/video1"),
    ("/dev/video2", "v4l2", "/dev/video2"),
    ("rtsp://10.0.0.5:8554/cam", "rtsp", "rtsp://10.0.0.5:8554/cam"),
    ("file://clips/a.mp4", "file", "clips/a.mp4"),
    ("file:///data/a.mp4", "file", "/data/a.mp4"),
    ("clips/a.mp4", "file", "clips/a.mp4"),
    ("synthetic-cam/", "file", "synthetic-cam/"),  # a folder of that name is a folder
    ("synthetic", "synthetic", ""),
    ("synthetic:1280x720@15:yuyv", "synthetic", "1280x720@15:yuyv"),
    ("synthetic://1280x720@15/yuyv", "synthetic", "1280x720@15/yuyv"),
    ("gst:videotestsrc ! video/x-raw,format=NV12,width=64,height=48", "gst",
     "videotestsrc ! video/x-raw,format=NV12,width=64,height=48"),
])
def test_uri_schemes(text, scheme, location):
    uri = uris.parse(text)
    assert (uri.scheme, uri.location) == (scheme, location)
    assert uri.live == (scheme in ("csi", "v4l2", "rtsp", "synthetic"))


@pytest.mark.parametrize("text, message", [
    ("webcam://0", "unknown scheme 'webcam'; known: csi, v4l2, file, synthetic, gst, rtsp"),
    ("csi://left", "write csi://N"),
    ("v4l2://cam", "write v4l2:///dev/videoN"),
    ("", "empty source"),
    ("synthetic://big", "write synthetic://WIDTHxHEIGHT@FPS/FORMAT"),
])
def test_bad_uris_are_one_clear_line(text, message):
    with pytest.raises(uris.SourceURIError, match=message):
        uris.synthetic_spec(uris.parse(text))


def test_synthetic_spec_both_spellings():
    assert uris.synthetic_spec(uris.parse("synthetic://1280x720@15/yuyv")) == (1280, 720, 15.0, "yuyv")
    assert uris.synthetic_spec(uris.parse("synthetic:1280x720@15:yuyv")) == (1280, 720, 15.0, "yuyv")
    assert uris.synthetic_spec(uris.parse("synthetic")) == (640, 480, 30.0, "nv12")


@pytest.mark.parametrize("hwaccel, message", [
    ("warp", r"hwaccel 'warp': PyAV's FFmpeg has .*cuda"),
    # a real attempt: this machine has no GPU, so FFmpeg cannot create the CUDA device
    ("cuda", r"hwaccel cuda: cannot use it here \(.+\): check the device and its driver, or leave hwaccel out"),
])
def test_a_hwaccel_that_cannot_be_used_is_one_line(videos, tiny_bundle, capsys, hwaccel, message):
    import re

    from jetpipe.runtime.probe import probe_gpu

    if hwaccel == "cuda" and probe_gpu().usable:
        pytest.skip("this machine has a GPU: CUDA decoding works here (the GPU test checks it)")
    argv = ["serve", "--bundle", str(tiny_bundle), "--source", str(videos["h264"]), "--hwaccel", hwaccel,
            "--metrics", "", "--frames", "1", "--task", "raw"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and re.search(message, err), err


def test_hwaccel_for_a_source_ffmpeg_does_not_decode_in_process_is_said_unused(caplog):
    source = open_source("synthetic://64x48@30/nv12", hwaccel="cuda")
    assert "hwaccel cuda is for video files decoded in-process by FFmpeg" in caplog.text
    assert "hwaccel not used" in caplog.text and source.describe() in caplog.text


def test_serve_lists_the_schemes_for_an_unknown_one(tiny_bundle, capsys):
    assert main(["serve", "--bundle", str(tiny_bundle), "--source", "webcam://0", "--metrics", ""]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "unknown scheme 'webcam'; known: csi, v4l2, file" in err


# --- FFmpeg: frames arrive as YUV, untouched ------------------------------------------------------------------

@needs_ffmpeg
@pytest.mark.parametrize("name, fmt, standard, value_range, size, reference", [
    ("h264", "i420", "bt601", "limited", (240, 320), "yuv420p"),
    ("hevc", "i420", "bt709", "limited", (720, 1280), "yuv420p"),
    ("mjpeg", "yuyv", "bt601", "limited", (240, 320), "yuyv422"),
    ("mjpeg420", "i420", "bt601", "full", (240, 320), "yuvj420p"),
    ("portrait", "i420", "bt601", "limited", (320, 240), "yuv420p"),
    ("odd", "nv12", "bt601", "limited", (480, 640), "nv12"),  # 641x481 4:4:4 -> even NV12
])
def test_ffmpeg_delivers_the_decoders_yuv(videos, name, fmt, standard, value_range, size, reference):
    source = FFmpegSource(uris.parse(str(videos[name])))
    info, frames = read_all(source)
    assert (info.format, info.standard, info.range, (info.height, info.width)) == (fmt, standard, value_range, size)
    crop = "crop=640:480:0:0" if name == "odd" else None
    expected = np.frombuffer(ffmpeg_decode(videos[name], reference, crop), np.uint8)
    assert np.array_equal(np.concatenate([f.reshape(-1) for f in frames]), expected)  # bit-exact planes
    assert source.decode_errors == 0


@needs_ffmpeg
@pytest.mark.parametrize("name, fmt, value_range, size, reference, vf", [
    ("h264", "i420", "limited", (240, 320), "yuv420p", None),
    ("hevc", "i420", "limited", (720, 1280), "yuv420p", None),
    # planar 4:2:2 repacked value for value: full range stays full (the pipe path has swscale rescale it)
    ("mjpeg", "yuyv", "full", (240, 320), "yuyv422", "scale=in_range=pc:out_range=pc"),
    ("mjpeg420", "i420", "full", (240, 320), "yuvj420p", None),
    ("portrait", "i420", "limited", (320, 240), "yuv420p", None),
    ("odd420", "i420", "limited", (480, 640), "yuv420p", "crop=640:480:0:0"),  # 641x481: planes cropped
])
def test_in_process_ffmpeg_delivers_the_decoders_planes_bit_exact(videos, name, fmt, value_range, size, reference,
                                                                   vf):
    source = PyAVSource(uris.parse(str(videos[name])))
    info, frames = read_all(source)
    assert (info.format, info.range, (info.height, info.width)) == (fmt, value_range, size)
    expected = np.frombuffer(ffmpeg_decode(videos[name], reference, vf), np.uint8)
    assert np.array_equal(np.concatenate([f.reshape(-1) for f in frames]), expected)
    assert source.decode_errors == 0


def test_in_process_ffmpeg_opens_files_whose_metadata_is_not_utf8(tmp_path):
    """A Latin-1 title: PyAV < 19 failed the open without metadata_errors; PyAV 19 refuses that option."""
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg not installed (apt install ffmpeg; .ci/run installs it)")
    path = encode(tmp_path / "latin1.mkv", "64x48", 5, extra=("-metadata", "title=caf\udce9"))
    assert b"caf\xe9" in path.read_bytes()
    info, frames = read_all(PyAVSource(uris.parse(str(path))))
    assert len(frames) == 5 and (info.height, info.width) == (48, 64)


@needs_ffmpeg
def test_in_process_ffmpeg_converts_what_the_kernel_cannot_read_to_nv12(videos):
    """4:4:4 (and 10-bit) become NV12 through swscale: luma untouched, chroma subsampled. The chroma is
    compared within a tolerance: FFmpeg builds place subsampled chroma differently (PyAV's FFmpeg 8 against
    Debian's 5.1: 0 levels at the median, large only on the test pattern's sharp colour edges)."""
    info, frames = read_all(PyAVSource(uris.parse(str(videos["odd"]))))
    assert (info.format, info.height, info.width) == ("nv12", 480, 640)
    expected = np.frombuffer(ffmpeg_decode(videos["odd"], "nv12", "crop=640:480:0:0"), np.uint8).reshape(-1, 720, 640)
    got = np.stack(frames).astype(np.int16)
    assert np.array_equal(got[:, :480], expected[:, :480])
    chroma = np.abs(got[:, 480:] - expected[:, 480:])
    assert np.median(chroma) == 0 and chroma.mean() < 3 and np.percentile(chroma, 90) <= 4, chroma.mean()


@needs_ffmpeg
def test_in_process_ffmpeg_counts_a_corrupted_stretch_and_goes_on(videos, tmp_path, caplog):
    broken = corrupted_copy(videos["h264"], tmp_path / "broken.mp4")
    source = PyAVSource(uris.parse(str(broken)))
    _, frames = read_all(source)
    assert source.decode_errors > 0 and 30 < len(frames) < 45
    assert "decode error #1" in caplog.text


@needs_ffmpeg
def test_in_process_ffmpeg_scales_frames_that_change_size_mid_file_and_counts_it(tmp_path):
    """The ring slots are sized for the first frames: a file that switches to 160x120 keeps delivering every
    frame at 320x240 (scaled), and the change is a counted decode error, not a crash or a silent end."""
    parts = []
    for size in ("320x240", "160x120"):
        parts.append(encode(tmp_path / f"{size}.ts", size, 10, extra=("-f", "mpegts")).read_bytes())
    joined = tmp_path / "joined.ts"
    joined.write_bytes(b"".join(parts))
    source = PyAVSource(uris.parse(str(joined)))
    info, frames = read_all(source)
    assert (info.width, info.height, len(frames), source.decode_errors) == (320, 240, 20, 1)
    second = np.frombuffer(ffmpeg_decode(tmp_path / "160x120.ts", "yuv420p"), np.uint8)[:160 * 120].reshape(120, 160)
    scaled_luma = frames[10][:240].reshape(120, 2, 160, 2).mean(axis=(1, 3))
    assert np.abs(scaled_luma - second).mean() < 8  # the second part's picture, scaled up


@needs_ffmpeg
def test_in_process_ffmpeg_loops_with_running_timestamps_and_paces_in_realtime(videos):
    source = PyAVSource(uris.parse(str(videos["mjpeg"])), loop=True, realtime=True)  # 10 frames at 30 fps
    info = source.open()
    slot = np.empty(frame_shape(info.format, info.height, info.width), np.uint8)
    started = time.monotonic()
    pts = [source.read_into(slot) for _ in range(25)]
    took = time.monotonic() - started
    source.close()
    assert pts == pytest.approx([i / 30 for i in range(25)])
    assert took >= 0.7  # paced: 24 frame periods after the first (0.8 s), not as fast as it decodes


@needs_ffmpeg
def test_files_decode_in_process_and_streams_through_an_ffmpeg_process(videos, monkeypatch, caplog):
    assert isinstance(open_source(str(videos["h264"])), PyAVSource)
    assert isinstance(open_source(str(videos["h264"]), decoder="ffmpeg"), PyAVSource)
    assert isinstance(open_source("rtsp://127.0.0.1:9/cam"), FFmpegSource)
    monkeypatch.setattr("jetpipe.pipelines.ingest.sources.pyav.missing", lambda: "PyAV is not installed (test)")
    assert isinstance(open_source(str(videos["h264"])), FFmpegSource)
    assert "PyAV is not installed (test); decoding through an ffmpeg process" in caplog.text


@needs_ffmpeg
@pytest.mark.parametrize("name", ["h264", "hevc", "mjpeg", "mjpeg420"])
def test_cpu_conversion_of_ffmpeg_yuv_matches_ffmpegs_own_rgb(videos, name):
    """Our colour conversion of the delivered YUV vs FFmpeg's own YUV -> BGR, on the network input."""
    info, frames = read_all(FFmpegSource(uris.parse(str(videos[name]))))
    matrix = ColourMatrix.of(info.standard, info.range)
    space = "bt709" if info.standard == "bt709" else "bt601"
    vf = f"scale=in_color_matrix={space}:in_range={'pc' if info.range == 'full' else 'tv'}:flags=accurate_rnd"
    bgr = np.frombuffer(ffmpeg_decode(videos[name], "bgr24", vf), np.uint8).reshape(-1, info.height, info.width, 3)
    spec = PreprocessSpec(resize="stretch")
    for ours, theirs in zip(frames[:3], bgr[:3]):
        a, _ = preprocess_frame(ours, info.format, (96, 128), spec, matrix)
        b, _ = preprocess_bgr(theirs, (96, 128), spec)
        diff = np.abs(a - b) * 255
        assert diff.mean() < 2.0 and np.percentile(diff, 99) < 16, (diff.mean(), np.percentile(diff, 99))


# --- the daemon: every frame of a file, records, errors -------------------------------------------------------

def _config(bundle, sources, **kw):
    kw.setdefault("metrics_listen", "")
    return validate(PipelineConfig(bundle=bundle, sources=sources, **kw))


@needs_ffmpeg
def test_every_frame_of_a_file_is_processed_with_uri_and_pts(videos, tiny_bundle, tmp_path):
    out = tmp_path / "r.jsonl"
    config = _config(tiny_bundle, [SourceConfig(str(videos["h264"])), SourceConfig(f"file://{videos['portrait']}")],
                     sinks=[f"jsonl:{out}"], queue_depth=1, max_batch=2, task="raw")
    summary = Pipeline(config).run()
    assert summary["processed"] == [45, 10] and summary["dropped"] == [0, 0] and summary["failed"] == [0, 0]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    first = [r for r in records if r["stream"] == 0]
    assert [r["frame"] for r in first] == list(range(45))
    assert first[0]["source"] == str(videos["h264"]) and first[3]["pts"] == pytest.approx(0.1)


@needs_ffmpeg
def test_a_file_corrupted_mid_stream_is_counted_not_a_silent_end(videos, tiny_bundle, tmp_path, caplog):
    broken = corrupted_copy(videos["h264"], tmp_path / "broken.mp4")
    summary = Pipeline(_config(tiny_bundle, [SourceConfig(str(broken))], task="raw")).run()
    assert summary["decode_errors"][0] > 0
    assert summary["processed"][0] == summary["captured"][0] > 0
    assert "decode error #1" in caplog.text


def test_a_synthetic_camera_larger_than_the_rings_is_refused_before_it_renders(tiny_bundle, monkeypatch, capsys):
    """Issue 49: synthetic://8192x8192 rendered for 34 s and 4.8 GB before max_frame_hw refused it."""
    from jetpipe.pipelines.ingest import sources

    def rendered(*args, **kwargs):
        raise AssertionError("the camera was made")
    monkeypatch.setattr(sources.SyntheticCamera, "from_uri", rendered)
    assert main(["serve", "--bundle", str(tiny_bundle), "--source", "synthetic://8192x8192", "--metrics", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "frames are 8192x8192, larger than max_frame_hw [1080, 1920]" in err[-1] and "Traceback" not in "".join(err)


@needs_ffmpeg
@pytest.mark.parametrize("container", ["mkv", "mp4"])
def test_a_truncated_file_is_counted_and_said_not_ended_as_whole(tiny_bundle, tmp_path, caplog, container):
    """A copy cut short in the middle (issue 49: it ended as if complete, "0 decode errors")."""
    whole = encode(tmp_path / f"whole.{container}", frames=60, extra=("-movflags", "+faststart"))
    cut = tmp_path / f"cut.{container}"
    cut.write_bytes(whole.read_bytes()[:whole.stat().st_size // 2])
    summary = Pipeline(_config(tiny_bundle, [SourceConfig(str(cut))], task="raw")).run()
    assert summary["decode_errors"][0] >= 1 and 0 < summary["processed"][0] < 60
    assert "its container declares: truncated" in caplog.text or container == "mp4"  # an MP4: its last packet too
    caplog.clear()
    summary = Pipeline(_config(tiny_bundle, [SourceConfig(str(whole))], task="raw")).run()
    assert summary["decode_errors"] == [0] and summary["processed"] == [60] and "declares: truncated" not in caplog.text


@needs_ffmpeg
@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_bytes(b""), "cannot open .*empty.mp4"),
    (lambda p: p.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 200), "cannot open .*empty.mp4"),
])
def test_unopenable_files_fail_in_one_line(tiny_bundle, tmp_path, capsys, make, message):
    import re

    path = tmp_path / "empty.mp4"
    make(path)
    assert main(["serve", "--bundle", str(tiny_bundle), "--source", str(path), "--metrics", ""]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and re.search(message, err), err


def test_a_folders_images_that_do_not_decode_are_skipped_and_counted(tiny_bundle, tmp_path, capsys):
    """A bad first image no longer makes the folder reconnect for ever with 0 frames (issue 49): every bad image
    is skipped, counted and said; a folder of only bad images is one line at start."""
    import cv2
    import numpy as np

    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "0-bad.jpg").write_bytes(b"not a jpeg")
    for k in range(1, 4):
        cv2.imwrite(str(folder / f"{k}.png"), np.full((64, 96, 3), 40 * k, np.uint8))
    (folder / "2b-bad.png").write_bytes(b"\x89PNG broken")
    summary = Pipeline(_config(tiny_bundle, [SourceConfig(str(folder))], task="raw")).run()
    assert summary["processed"] == [3] and summary["decode_errors"] == [2] and summary["reconnects"] == [0]
    for good in folder.glob("*.png"):
        if "bad" not in good.name:
            good.unlink()
    assert main(["serve", "--bundle", str(tiny_bundle), "--source", str(folder), "--metrics", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "none of its 2 images could be decoded" in err[0], err


@needs_ffmpeg
def test_portrait_and_4k_files_size_the_buffers_and_a_bound_set_is_kept(tiny_bundle, tmp_path, capsys):
    """Issue 49: the default max_frame_hw refused a portrait 1080x1920 and a 4K file (a config key only). The
    video files among the sources are probed at start and the buffers sized for the largest; a bound set with
    --max-frame-size (or max_frame_hw) is kept, one line where a source exceeds it."""
    portrait = encode(tmp_path / "portrait.mp4", "1080x1920", 2, extra=("-preset", "ultrafast"))
    wide = encode(tmp_path / "4k.mp4", "3840x2160", 2, extra=("-preset", "ultrafast"))
    summary = Pipeline(_config(tiny_bundle, [SourceConfig(str(portrait)), SourceConfig(str(wide))],
                               task="raw")).run()
    assert summary["processed"] == [2, 2] and summary["failed"] == [0, 0]
    assert main(["serve", "--bundle", str(tiny_bundle), "--source", str(wide), "--metrics", "", "--max-frame-size",
                 "1080x1920"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "frames are 3840x2160, larger than max_frame_hw [1080, 1920]: set [pipeline] max_frame_hw = " \
           "[2160, 3840] (--max-frame-size 2160x3840)" in err[-1]


@needs_ffmpeg
def test_loop_restarts_the_file(videos):
    source = FFmpegSource(uris.parse(str(videos["mjpeg"])), loop=True)
    info = source.open()
    slot = np.empty(frame_shape(info.format, info.height, info.width), np.uint8)
    pts = [source.read_into(slot) for _ in range(25)]  # the file has 10 frames
    source.close()
    assert pts[-1] == pytest.approx(24 / 30)


# --- live sources: reconnect, stop ----------------------------------------------------------------------------

@needs_ffmpeg
def test_a_network_stream_that_drops_is_reconnected(videos, tiny_bundle, tmp_path):
    ts = as_mpegts(videos["h264"], tmp_path / "cam.ts")
    camera = StreamServer(ts.read_bytes())
    config = _config(tiny_bundle, [SourceConfig(f"tcp://127.0.0.1:{camera.port}")], task="raw", reconnect_max_s=0.5)
    pipeline = Pipeline(config)
    runner = threading.Thread(target=lambda: setattr(pipeline, "result", pipeline.run()))
    runner.start()
    try:
        wait_for(lambda: pipeline.metrics.processed[0] >= 5)
        camera.unplug()
        wait_for(lambda: pipeline.metrics.reconnects[0] >= 1)
        camera = StreamServer(ts.read_bytes(), camera.port)
        seen = pipeline.metrics.processed[0]
        wait_for(lambda: pipeline.metrics.processed[0] >= seen + 5)
    finally:
        pipeline.stop()
        runner.join(timeout=10)
        camera.unplug()
    assert pipeline.result["reconnects"][0] >= 1 and pipeline.result["processed"][0] >= 10


@needs_ffmpeg
def test_a_network_stream_that_goes_silent_is_reconnected(tiny_bundle, tmp_path, caplog):
    """A TCP camera that stays connected but stops sending (it sat at 0 fps with no word): after its stall
    timeout it is logged, counted and reconnected, and frames flow again."""
    # 10 s: a stream that stops before its first frame never connected (a failed connection, not a stall), and
    # FFmpeg read 5 s of an MPEG-TS stream before its first frame (it reads less now: streaming_args)
    ts = as_mpegts(encode(tmp_path / "cam.mp4", "320x240", 300), tmp_path / "cam.ts")
    # connection 1 is the probe (ffprobe), 2 the decoding ffmpeg: it stalls after two thirds of the stream
    camera = StreamServer(ts.read_bytes(), stall_after=len(ts.read_bytes()) * 2 // 3, stall_connection=2)
    config = _config(tiny_bundle, [SourceConfig(camera.url)], task="raw", reconnect_max_s=0.5, stall_timeout_s=1.0)
    serve_through_a_stall(Pipeline(config), camera, caplog)


@needs_ffmpeg
def test_a_cameras_backlog_coming_at_once_is_dropped_as_catching_up_not_as_an_overload(request, tmp_path, caplog):
    """A camera whose frames come far faster than real time (what a camera sent while it was being opened comes
    at once; here its whole stream is sent at once) into a 2-deep queue: the oldest go, every such drop is
    counted as catching up, and the pipeline does not say it is overloaded; it says why it dropped them. PP-OCRv4
    det (40 ms a frame here) is slower than the stream comes, so frames are dropped whatever the machine's load."""
    import logging

    pytest.importorskip("rapidocr_onnxruntime", reason="PP-OCRv4 det ships in rapidocr-onnxruntime: pip install "
                        "'jetpipe[models]' (none for this Python)")
    det_bundle = request.getfixturevalue("det_bundle")
    ts = as_mpegts(encode(tmp_path / "cam.mp4", "320x240", 300), tmp_path / "cam.ts")
    camera = StreamServer(ts.read_bytes(), once=True)
    config = _config(det_bundle, [SourceConfig(camera.url)], queue_depth=2, frames=200, backend="onnxruntime-cpu")
    try:
        with caplog.at_level(logging.INFO):
            summary = Pipeline(config).run()
    finally:
        camera.unplug()
    assert summary["dropped"][0] > 0 and summary["dropped_catching_up"] == summary["dropped"]
    assert not summary["overloaded"] and "overloaded:" not in caplog.text
    assert "dropped while live streams caught up" in caplog.text


def serve_through_a_stall(pipeline, server, caplog, join_timeout: float = 10.0) -> None:
    """Serve stream 0 until a stall is counted and frames flow again after it (the next connection sends the
    whole stream), stop, and check the stall was counted, said and reconnected."""
    runner = threading.Thread(target=lambda: setattr(pipeline, "result", pipeline.run()))
    runner.start()
    try:
        wait_for(lambda: pipeline.metrics.stalls[0] >= 1)
        seen = pipeline.metrics.captured[0]
        wait_for(lambda: pipeline.metrics.captured[0] >= seen + 5)
    finally:
        pipeline.stop()
        runner.join(timeout=join_timeout)
        server.unplug()
    assert pipeline.result["stalls"][0] >= 1 and pipeline.result["reconnects"][0] >= 1
    assert "no frame for" in caplog.text and "; reconnecting" in caplog.text


@needs_ffmpeg
def test_an_mpegts_camera_sending_in_real_time_connects_with_the_default_stall_timeout(tiny_bundle, tmp_path):
    """FFmpeg reads an MPEG-TS stream for 5 s (its analyzeduration) before it says what it holds; sent in real
    time, the probe took as long as the 5-s stall timeout, which ended the opening again and again: such a camera
    (udp, tcp, srt) never connected."""
    video = encode(tmp_path / "cam.mp4", "320x240", 300)  # 10 s at 30 fps, sent over 10 s, again and again
    camera = StreamServer(as_mpegts(video, tmp_path / "cam.ts").read_bytes(), seconds=10.0)
    config = _config(tiny_bundle, [SourceConfig(camera.url)], task="raw", duration=20.0)
    pipeline = Pipeline(config)
    runner = threading.Thread(target=lambda: setattr(pipeline, "result", pipeline.run()))
    runner.start()
    try:
        wait_for(lambda: pipeline.metrics.processed[0] >= 15, timeout=60, what="the camera's first frames")
    finally:
        pipeline.stop()
        runner.join(timeout=10)
        camera.unplug()
    assert pipeline.result["failed"] == [0] and pipeline.result["processed"][0] >= 15


def _camera_that_stops(tmp_path, connection: int) -> StreamServer:
    """A TCP camera whose connection number `connection` gets its first 16 frames (half a second, 16 KB) and then
    nothing more, left open; the others get the whole stream."""
    ts = as_mpegts(encode(tmp_path / "cam.mp4", "320x240", 300, extra=("-g", "15")), tmp_path / "cam.ts")
    return StreamServer(ts.read_bytes(), stall_after=frame_offset(ts, 12), stall_connection=connection)


def _frames_of_a_camera_that_stops(tmp_path, threads: int | None, wanted: int) -> None:
    """Wait until the FFmpeg source has read `wanted` frames of a camera that stops after its first 16."""
    camera = _camera_that_stops(tmp_path, connection=2)  # 1 is the probe (ffprobe), 2 the decoding ffmpeg
    source = FFmpegSource(uris.parse(camera.url), threads=threads)
    read_until_silent(source, camera, wanted, lambda info: np.empty(frame_shape(info.format, info.height, info.width),
                                                                    np.uint8))


def read_until_silent(source, camera: StreamServer, wanted: int, slot_for) -> None:
    """Read a live source, whose camera goes silent after its first frames, in a thread until `wanted` frames have
    come; then end its connection and close it and the camera. slot_for(info): where the frames are read into."""
    read = []

    def decode():
        slot = slot_for(source.open())
        with contextlib.suppress(EndOfStream, SourceError):  # interrupt() below ends the connection
            while True:
                read.append(source.read_into(slot))

    reader = threading.Thread(target=decode, daemon=True)
    reader.start()
    try:
        wait_for(lambda: len(read) >= wanted, 30, "the first frames, the camera silent after them")
    finally:
        source.interrupt()
        reader.join(10)
        source.close()
        camera.unplug()
    assert not reader.is_alive()


@needs_ffmpeg
def test_a_cameras_first_frames_are_decoded_before_it_sends_more(tmp_path):
    """A camera whose first frames have come, and no more yet: the FFmpeg source reads them now. FFmpeg's default
    analysis held an MPEG-TS camera's frames until 5 s of its stream had come, then gave them all at once (more than
    a stream's queue holds: dropped at every connection, the camera opened 5 s late)."""
    _frames_of_a_camera_that_stops(tmp_path, threads=1, wanted=6)


@needs_ffmpeg
def test_a_cameras_format_is_known_from_its_first_frames(tmp_path):
    """ffprobe, run before each connection of a camera the FFmpeg source decodes, read 5 s of an MPEG-TS stream
    before it answered: a camera that has sent its first 16 frames (half a second), and no more yet, was not
    known within the probe's 15 s. Now its format comes from those frames."""
    camera = _camera_that_stops(tmp_path, connection=1)
    try:
        info = FFmpegSource(uris.parse(camera.url)).probe()
    finally:
        camera.unplug()
    assert (info.width, info.height, info.fps) == (320, 240, 30.0)


@needs_ffmpeg
def test_a_cameras_frames_are_not_held_back_by_decoder_threads(tmp_path):
    """The same camera decoded with 8 threads (a lone camera on an 8-core host gets one a core): FFmpeg's frame
    threads gave a frame only once 7 more had come in (2 of the 16 read, against 9 with one thread; each thread a
    frame interval behind the camera); a live stream up to 1080p is decoded with slice threads, which hold none."""
    _frames_of_a_camera_that_stops(tmp_path, threads=8, wanted=8)


@needs_ffmpeg
def test_a_network_stream_that_connects_and_never_sends_is_reconnected(tiny_bundle, caplog):
    """A camera that accepts the connection and sends nothing held its stream in open() (ffprobe waiting)
    until serve was stopped, with no word: the stall timeout now covers the open. It never connected: failed
    connections and reconnects, not stalls (issue 49: they were counted as stalls)."""
    camera = StreamServer(hang=True)
    config = _config(tiny_bundle, [SourceConfig(camera.url)], task="raw", reconnect_max_s=0.5, stall_timeout_s=1.0)
    pipeline = Pipeline(config)
    runner = threading.Thread(target=lambda: setattr(pipeline, "result", pipeline.run()))
    runner.start()
    try:
        wait_for(lambda: pipeline.metrics.reconnects[0] >= 2)
    finally:
        pipeline.stop()
        runner.join(timeout=10)
        camera.unplug()
    assert not runner.is_alive() and pipeline.result["stalls"] == [0] and pipeline.result["failed"][0] >= 2
    assert "not connected after" in caplog.text and "; reconnecting" in caplog.text


@needs_ffmpeg
def test_sigterm_during_a_hanging_open_exits_in_time(tiny_bundle, tmp_path):
    """A network camera that accepts the connection and never sends a byte: stopping must not wait for it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    daemon = subprocess.Popen([sys.executable, "-m", "jetpipe.cli", "serve", "--bundle", str(tiny_bundle),
                               "--source", f"tcp://127.0.0.1:{port}", "--metrics", "", "--task", "raw"],
                              stderr=subprocess.PIPE, text=True)
    try:
        conn, _ = listener.accept()  # the probe connected and now waits for data
        time.sleep(0.5)
        started = time.monotonic()
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(timeout=15)
        took = time.monotonic() - started
    finally:
        daemon.kill()
        listener.close()
    assert code == 0 and took < 5.0, (code, took, daemon.stderr.read())


# --- backpressure ---------------------------------------------------------------------------------------------

def test_a_file_waits_for_room_a_camera_drops_its_oldest():
    batcher = Batcher(streams=2, max_batch=4, timeout_s=0.0, depth=1)
    released = []
    packet = lambda stream, n: QueuedFrame(stream, n, 0.0, None, lambda: released.append((stream, n)))  # noqa: E731
    batcher.put(packet(1, 0))
    batcher.put(packet(1, 1))  # camera: the oldest goes
    assert batcher.dropped[1] == 1 and released == [(1, 0)]
    batcher.put(packet(0, 0), wait=True)
    waiter = threading.Thread(target=batcher.put, args=(packet(0, 1),), kwargs={"wait": True})
    waiter.start()
    waiter.join(timeout=0.3)
    assert waiter.is_alive()  # blocked: the file's queue is full
    assert [p.frame_no for p in batcher.next_batch()] == [0, 1]
    waiter.join(timeout=2)
    assert not waiter.is_alive() and batcher.dropped[0] == 0 and batcher.depths() == [1, 0]


# --- GStreamer ------------------------------------------------------------------------------------------------

@needs_gst
def test_a_gst_pipeline_delivers_raw_nv12(tiny_bundle):
    text = "gst:videotestsrc num-buffers=12 ! video/x-raw,format=NV12,width=96,height=64,framerate=30/1"
    source = open_source(text)
    assert isinstance(source, GstSource) and source.info.format == "nv12"
    info, frames = read_all(source)
    assert len(frames) == 12 and frames[0].shape == (96, 96)
    assert frames[0].std() > 0  # a test pattern, not zeros


def test_gst_pipelines_must_name_their_caps():
    assert caps_of("v4l2src ! video/x-raw,format=YUY2,width=640,height=480,framerate=30/1", "x") \
        .__dict__ == {"format": "yuyv", "height": 480, "width": 640, "standard": "bt601", "range": "limited",
                      "fps": 30.0}
    with pytest.raises(Exception, match="must end in raw caps naming the format and size"):
        caps_of("videotestsrc ! videoconvert", "gst:videotestsrc ! videoconvert")


@pytest.mark.parametrize("text, fmt, expected", [
    ("csi://1", "nv12", "nvarguscamerasrc sensor-id=1 ! video/x-raw(memory:NVMM),width=1920,height=1080,"
                        "framerate=30/1,format=NV12 ! nvvidconv ! video/x-raw,format=NV12,width=1920,height=1080"),
    ("/dev/video0", "yuyv", "v4l2src device=/dev/video0 ! video/x-raw,format=YUY2,width=1920,height=1080"),
    ("/dev/video0", "nv12", "v4l2src device=/dev/video0 ! image/jpeg,width=1920,height=1080 ! "
                            "nvv4l2decoder mjpeg=1 ! nvvidconv ! video/x-raw,format=NV12,width=1920,height=1080"),
    ("/clips/a b.mp4", "nv12", 'filesrc location="/clips/a b.mp4" ! parsebin ! nvv4l2decoder ! nvvidconv ! '
                               "video/x-raw,format=NV12,width=1920,height=1080"),
    ("rtsp://cam/1", "nv12", 'rtspsrc location="rtsp://cam/1" protocols=tcp latency=0 ! parsebin ! nvv4l2decoder ! '
                             "nvvidconv ! video/x-raw,format=NV12,width=1920,height=1080"),
])
def test_jetson_pipelines(text, fmt, expected):
    from jetpipe.pipelines.ingest.sources.base import FrameInfo

    assert jetson_pipeline(uris.parse(text), FrameInfo(fmt, 1080, 1920, fps=30)) == expected


def test_csi_needs_a_jetson():
    with pytest.raises(Exception, match="CSI cameras need a Jetson"):
        open_source("csi://0")


def test_without_ffmpeg_the_opencv_path_is_taken_and_said(videos, monkeypatch, caplog):
    from jetpipe.pipelines.ingest.sources import OpenCVSource

    monkeypatch.setenv("PATH", "/nonexistent")
    assert isinstance(open_source(str(videos["h264"])), PyAVSource)  # FFmpeg's libraries need no ffmpeg binary
    monkeypatch.setattr("jetpipe.pipelines.ingest.sources.pyav.missing", lambda: "PyAV is not installed (test)")
    source = open_source(str(videos["h264"]))
    assert isinstance(source, OpenCVSource)
    assert "ffmpeg and ffprobe not found on PATH (apt install ffmpeg); decoding with OpenCV" in caplog.text
    with pytest.raises(SourceError, match="cannot run|not found"):
        FFmpegSource(uris.parse("rtsp://127.0.0.1:1/x")).open()


# --- resources ------------------------------------------------------------------------------------------------

def test_run_closes_everything_even_when_it_fails(tiny_bundle, tmp_path, monkeypatch):
    config = _config(tiny_bundle, [SourceConfig("synthetic://64x48@0/nv12")], task="raw", frames=3,
                     sinks=[f"jsonl:{tmp_path / 'a.jsonl'}"])
    pipeline = Pipeline(config)

    def broken(*args):
        raise RuntimeError("summary failed")

    monkeypatch.setattr(pipeline.report, "summary", broken)
    with pytest.raises(RuntimeError, match="summary failed"):
        pipeline.run()
    assert pipeline.closers == [] and pipeline.sinks.sinks[0].file.closed


@needs_ffmpeg
def test_stopping_a_live_source_is_not_counted_as_a_failure(tiny_bundle):
    """stop() interrupts a source blocked in its open (a camera that never answers): that ends its
    thread, but it is neither a failed frame nor a reconnect."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    try:
        config = _config(tiny_bundle, [SourceConfig(f"tcp://127.0.0.1:{listener.getsockname()[1]}")], task="raw",
                         duration=1.0)
        summary = Pipeline(config).run()
    finally:
        listener.close()
    assert summary["failed"] == [0] and summary["reconnects"] == [0], summary


def test_still_synthetic_camera_writes_each_slot_once():
    from jetpipe.pipelines.ingest.sources import SyntheticCamera, open_source

    camera = open_source("synthetic://64x48@0/nv12/still")
    assert camera.still and not SyntheticCamera.from_uri("synthetic://64x48@0/nv12").still
    info = camera.open()
    slots = [np.zeros((info.height * 3 // 2, info.width), np.uint8) for _ in range(2)]
    camera.read_into(slots[0])
    first = slots[0].copy()
    slots[0][:] = 7  # a slot already sent is sent again as it is
    camera.read_into(slots[1])
    camera.read_into(slots[0])
    assert (slots[0] == 7).all() and first.any() and not np.array_equal(slots[1], first)


def test_an_unpaced_synthetic_camera_is_offered_like_a_file_every_frame_processed(tiny_bundle, tmp_path):
    """@0 has no clock to fall behind: frames wait for room as a file's do (none dropped), while a paced camera
    is live (its oldest frame dropped when behind). Unpaced frames were made only to be dropped before: the
    saturated benchmarks' capture work on frames never processed."""
    from jetpipe.pipelines.ingest.sources import SyntheticCamera

    assert not SyntheticCamera.from_uri("synthetic://64x48@0/nv12").live
    assert SyntheticCamera.from_uri("synthetic://64x48@30/nv12").live
    out = tmp_path / "r.jsonl"
    config = _config(tiny_bundle, [SourceConfig("synthetic://64x48@0/nv12") for _ in range(3)], task="raw",
                     frames=40, queue_depth=1, max_batch=2, sinks=[f"jsonl:{out}"])
    summary = Pipeline(config).run()
    assert summary["processed"] == [40, 40, 40] and summary["dropped"] == [0, 0, 0], summary
    frames = sorted((r["stream"], r["frame"]) for r in map(json.loads, out.read_text().splitlines()))
    assert frames == [(s, f) for s in range(3) for f in range(40)]


def _decoded_md5s(path) -> list[str]:
    """The MD5 of every decoded frame (timestamps aside): equal lists mean the same pictures."""
    out = subprocess.run(["ffmpeg", "-v", "error", "-i", str(path), "-map", "0:v:0", "-f", "framemd5", "-"],
                         check=True, capture_output=True, text=True).stdout
    return [line.split(",")[-1].strip() for line in out.splitlines() if line and not line.startswith("#")]


@needs_ffmpeg
def test_a_remux_feed_passes_a_network_streams_video_on_undecoded(videos, tmp_path):
    ts = as_mpegts(videos["h264"], tmp_path / "cam.ts")
    server = StreamServer(ts.read_bytes(), once=True)
    feed = RemuxFeed(uris.parse(server.url))
    got, buffer = bytearray(), np.empty(4096, np.uint8)
    try:
        feed.start()
        while n := feed.fill(buffer):
            got += buffer[:n].tobytes()
    finally:
        feed.stop()
        server.unplug()
    assert feed.received == len(got) > 0 and feed.decode_errors == 0
    remuxed = tmp_path / "remuxed.ts"
    remuxed.write_bytes(bytes(got))
    assert _decoded_md5s(remuxed) == _decoded_md5s(videos["h264"])  # every picture, none re-encoded


@needs_ffmpeg
def test_interrupt_ends_a_remux_feed_whose_connect_hangs():
    server = StreamServer(hang=True)  # accepts, never sends
    feed = RemuxFeed(uris.parse(server.url))
    result = []
    try:
        feed.start()
        reader = threading.Thread(target=lambda: result.append(feed.fill(np.empty(4096, np.uint8))))
        reader.start()
        reader.join(1.0)
        assert reader.is_alive()  # blocked on the hanging stream
        started = time.monotonic()
        feed.interrupt()
        reader.join(5)
        assert not reader.is_alive() and result == [0] and time.monotonic() - started < 5
    finally:
        feed.stop()
        server.unplug()


def test_network_streams_offer_the_hardware_decoder_a_remux_feed_and_a_fallback(monkeypatch):
    monkeypatch.setattr("jetpipe.pipelines.ingest.sources.ffmpeg.tools_available", lambda: None)
    offered = []

    def hardware(uri, loop, realtime, **kw):  # a runtime that takes nothing: FFmpeg decodes
        offered.append((uri.scheme, kw))

    assert isinstance(open_source("rtsp://127.0.0.1:9/cam", hardware=hardware), FFmpegSource)
    scheme, kw = offered[0]
    assert scheme == "rtsp" and isinstance(kw["feed"], RemuxFeed)
    assert isinstance(kw["fallback"](), FFmpegSource) and kw["feed"].uri.text == "rtsp://127.0.0.1:9/cam"


def test_a_gstreamer_source_without_gst_launch_is_one_line_at_start(tiny_bundle, monkeypatch, capsys):
    """It retried forever, even with --frames 3."""
    monkeypatch.setattr("jetpipe.pipelines.ingest.sources.gstreamer.tools_available",
                        lambda: "gst-launch-1.0 not found (apt install gstreamer1.0-tools)")
    code = main(["serve", "--bundle", str(tiny_bundle), "--source", "gst:videotestsrc ! video/x-raw,format=NV12,"
                 "width=64,height=48", "--frames", "3", "--metrics", ""])
    err = capsys.readouterr().err
    assert code == 2 and "a GStreamer pipeline needs gst-launch-1.0 not found" in err and "Traceback" not in err
