"""Real video on the GPU (marker gpu): NVDEC -> device ring -> kernel, against FFmpeg YUV -> kernel.

Needs PyCUDA, onnxruntime-gpu, PyNvVideoCodec and ffmpeg (to encode the clips at test time).
"""

import logging
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from jetpipe import uri as uris
from jetpipe.frames import frame_shape
from jetpipe.pipelines.config import SourceConfig
from jetpipe.pipelines.ingest.sources import EndOfStream, FFmpegSource, PyAVSource, SourceError, open_source
from jetpipe.pipelines.ingest.sources.ffmpeg import RemuxFeed
from jetpipe.pipelines.service.daemon import Pipeline
from jetpipe.runtime.api import Frame
from jetpipe.runtime.nvdec import hardware_decoder
from jetpipe.runtime.ring import frame_ring
from tests.pipelines.ingest.test_sources import (
    _config,
    as_mpegts,
    encode,
    ffmpeg_decode,
    read_until_silent,
    serve_through_a_stall,
)
from tests.stream_server import StreamServer, frame_offset, remux_or_stand_in

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu (CUDA execution provider) is not installed")
    if shutil.which("ffmpeg") is None or shutil.which("ffprobe") is None:
        pytest.skip("ffmpeg/ffprobe not installed: the clips are encoded at test time")
    pytest.importorskip("PyNvVideoCodec", reason="PyNvVideoCodec (pip install pynvvideocodec) not installed")
    folder = tmp_path_factory.mktemp("gpuclips")
    return {"h264": encode(folder / "h264.mp4", "1920x1080", 24),
            "hevc": encode(folder / "hevc.mp4", "1280x720", 16, "libx265", extra=("-x265-params", "log-level=error")),
            "yuv444": encode(folder / "yuv444.mp4", "640x480", 8, pix_fmt="yuv444p")}


@pytest.fixture(scope="module")
def runtime(det_bundle_square):
    from jetpipe.runtime.gpu_runtime import GpuRuntime

    rt = GpuRuntime(det_bundle_square, max_batch=4, backend="onnxruntime-cuda")
    yield rt
    rt.close()


def _nvdec_frames(runtime, clip, count, loop=False):
    """NVDEC-decoded frames in device ring slots, as the daemon gets them."""
    source = hardware_decoder(runtime)(uris.parse(str(clip)), loop=loop)
    assert source is not None and source.memory == "device"
    info = source.open()
    ring = frame_ring(runtime, count, (info.height, info.width), device=True)
    frames = []
    for slot in range(count):
        source.read_into(ring.view(slot, info.format, info.height, info.width))
        frames.append(ring.frame(slot, info.format, info.height, info.width, info.standard, info.range))
    source.close()
    return info, frames


def test_a_frame_whose_copy_was_queued_is_read_by_the_kernel_only_after_the_copy(runtime, clips):
    """NvdecSource.read_queued does not wait for its copy into the slot (a capture thread spun on it); the
    kernel's stream waits for the frame's `ready` event instead. The source's stream is held up first (a 4-GB
    memset, milliseconds), so a kernel that did not wait would read the slot before the picture is in it."""
    source = hardware_decoder(runtime)(uris.parse(str(clips["h264"])))
    info = source.open()
    ring = frame_ring(runtime, 1, (info.height, info.width), device=True)
    view = ring.view(0, info.format, info.height, info.width)
    cuda = runtime.device.cuda
    with runtime.device.active():
        cuda.memset_d8(view.address, 0, view.nbytes)  # an empty slot
        hold = cuda.mem_alloc(4 << 30)
        cuda.memset_d8_async(hold, 0, 4 << 30, source._stream)  # the source's stream busy before its copy
    try:
        _, ready = source.read_queued(view)
        frame = ring.frame(0, info.format, info.height, info.width, info.standard, info.range)
        frame.ready = ready
        queued = runtime.preprocess_only([frame])
        source.finish_read()
        frame.ready = None
        waited = runtime.preprocess_only([frame])
    finally:
        source.close()
        hold.free()
    assert ready is not None and np.abs(waited).sum() > 0
    np.testing.assert_array_equal(queued, waited)


def _ffmpeg_yuv(clip, count, source_class=FFmpegSource):
    source = source_class(uris.parse(str(clip)))
    info = source.open()
    frames = []
    try:
        while len(frames) < count:
            slot = np.empty(frame_shape(info.format, info.height, info.width), np.uint8)
            source.read_into(slot)
            frames.append(slot)
    except EndOfStream:
        pass
    source.close()
    return info, frames


@pytest.mark.parametrize("name", ["h264", "hevc"])
def test_nvdec_loops_without_losing_or_repeating_frames(runtime, clips, name):
    length = {"h264": 24, "hevc": 16}[name]
    _, frames = _nvdec_frames(runtime, clips[name], length + 3, loop=True)
    with runtime.device.active():
        pixels = [runtime.device.cuda.from_device(f.address, (f.nbytes,), np.uint8) for f in frames]
    for k in range(3):  # the second pass starts with the first pass's frames, in order
        np.testing.assert_array_equal(pixels[length + k], pixels[k])
    assert not np.array_equal(pixels[length - 1], pixels[0])


@pytest.mark.parametrize("source_class", [FFmpegSource, PyAVSource])  # an ffmpeg process; in-process
@pytest.mark.parametrize("name", ["h264", "hevc"])
def test_nvdec_kernel_output_equals_ffmpeg_yuv_kernel_output(runtime, clips, name, source_class):
    info, device_frames = _nvdec_frames(runtime, clips[name], 4)
    ff_info, host = _ffmpeg_yuv(clips[name], 4, source_class)  # I420, as the decoder gave it
    assert (info.height, info.width) == (ff_info.height, ff_info.width)
    # the same colour interpretation for both, so that only the decoders' pixels are compared
    ours = runtime.preprocess_only(device_frames)
    theirs = runtime.preprocess_only([Frame(f, ff_info.format, info.standard, info.range) for f in host])
    spec = runtime.spec
    scale = 255.0 * np.asarray(spec.std, np.float32).reshape(1, 3, 1, 1)  # back to 8-bit levels
    diff = np.abs(ours - theirs) * scale
    assert diff.max() <= 1.0 + 1e-3, diff.max()


def test_nvdec_pipeline_copies_no_pixels_on_the_host_and_processes_every_frame(det_bundle_square, clips, tmp_path):
    config = _config(det_bundle_square, [SourceConfig(str(clips["h264"])), SourceConfig(str(clips["hevc"]))],
                     backend="onnxruntime-cuda", max_batch=4, queue_depth=2)
    pipeline = Pipeline(config)
    assert [s.describe().endswith("(nvdec)") for s in pipeline.sources] == [True, True]
    summary = pipeline.run()
    assert summary["processed"] == [24, 16] and summary["dropped"] == [0, 0] and summary["failed"] == [0, 0]
    assert pipeline.runtime.frame_bytes_uploaded == 0 and pipeline.runtime.host_frame_copies == 0


def _records(path):
    """The records of a jsonl sink by (stream, frame), without the times that differ run to run."""
    import json

    records, timing = {}, ("t_capture", "t_result", "latency_ms")
    for line in path.read_text().splitlines():
        r = json.loads(line)
        records[(r["stream"], r["frame"])] = {k: v for k, v in r.items() if k not in timing}
    return records


def test_engine_times_are_measured_for_each_size_asked(runtime):
    times = runtime.engine_times((1, 4, 99))  # 99: the max batch, 4
    assert sorted(times) == [1, 4] and all(t > 0 for t in times.values())
    assert runtime.max_batch_fps() > 0


def test_auto_decode_processes_go_by_the_measured_model_and_say_so(det_bundle_square, clips, caplog, monkeypatch):
    """decode_processes auto (the default), 8 NVDEC files: det runs below what this process decodes, so they are
    decoded here; with that bar set below the model's measured rate, in one process of their own. Every frame
    through either way, the choice said in the log."""
    from jetpipe.pipelines.ingest import decode_choice

    sources = [SourceConfig(str(clips["h264"])) for _ in range(decode_choice.MIN_FILES)]
    for bar, processes in ((1e9, 0), (1.0, 1)):
        monkeypatch.setattr(decode_choice, "SERVING_DECODE_FPS", bar)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="jetpipe.pipelines.ingest.intake"):
            summary = Pipeline(_config(det_bundle_square, sources, backend="onnxruntime-cuda", max_batch=4)).run()
        said = [r.getMessage() for r in caplog.records if "decode_processes auto:" in r.getMessage()]
        assert len(said) == 1 and ("process of its own" in said[0]) == bool(processes), said
        assert ("decode_processes" in summary["cpu_seconds"]) == bool(processes), summary["cpu_seconds"]
        assert summary["processed"] == [24] * len(sources) and summary["failed"] == [0] * len(sources)


def test_decode_processes_give_the_records_of_decoding_in_the_serving_process(det_bundle_square, clips, tmp_path):
    """Two files NVDEC decodes in processes of their own (CUDA IPC into this process's ring slots), and one it
    cannot (4:4:4: FFmpeg here): every frame, in order, the same results as decoding them all here. The first
    loops (24 frames) and stops at the run's frame limit, 30."""
    names = ["h264", "hevc", "yuv444"]
    runs = {}
    for processes in (0, 2):
        out = tmp_path / f"r{processes}.jsonl"
        sources = [SourceConfig(str(clips[n]), loop=n == "h264") for n in names]
        config = _config(det_bundle_square, sources, backend="onnxruntime-cuda", max_batch=1, queue_depth=2, frames=30,
                         sinks=[f"jsonl:{out}"], decode_processes=processes)
        pipeline = Pipeline(config)
        described = [s.describe() for s in pipeline.sources]
        summary = pipeline.run()
        assert summary["processed"] == [30, 16, 8] and summary["dropped"] == [0, 0, 0], summary
        assert summary["failed"] == [0, 0, 0]
        runs[processes] = _records(out)
    assert "decode process" in described[0] and "decode process" in described[1], described
    assert described[2].endswith("(ffmpeg in-process)")
    assert [f for s, f in sorted(runs[2]) if s == 0] == list(range(30))
    assert runs[2] == runs[0]
    assert "decode_processes" in summary["cpu_seconds"]
    assert pipeline.decoders.links == []  # closed: the processes exited


def test_two_model_instances_give_the_records_of_one(det_bundle_square, clips, tmp_path, caplog):
    """--model-instances 2 (issue 66): batches of three NVDEC files run on two copies of the model, each on a
    stream of its own, the text boxes found on the GPU (each instance's post stream): every frame, the records
    of one instance."""
    runs = {}
    caplog.set_level(logging.INFO, logger="jetpipe")
    for instances in (1, 2):
        out = tmp_path / f"i{instances}.jsonl"
        sources = [SourceConfig(str(clips[n])) for n in ("h264", "hevc", "h264")]
        config = _config(det_bundle_square, sources, backend="onnxruntime-cuda", max_batch=2, queue_depth=32,
                         sinks=[f"jsonl:{out}"], decode_processes=0, model_instances=instances)
        pipeline = Pipeline(config)
        assert len(pipeline.runtime.instances) == instances
        assert pipeline.runtime.reduction is not None  # the boxes are found on each instance's post stream
        summary = pipeline.run()
        assert summary["processed"] == [24, 16, 24] and summary["dropped"] == [0, 0, 0], summary
        runs[instances] = _records(out)
    assert "2 model instances" in caplog.text
    assert runs[2] == runs[1]


def test_decode_processes_serve_realtime_looping_files_and_stop_in_time(det_bundle_square, clips):
    """Paced (--realtime) looping files decoded in a process: served never faster than their rate, paced from
    the run's start (not from their opening at start-up: a second's frames would come at once), until the
    run's duration; then every stream ends and the process exits; nothing fails."""
    config = _config(det_bundle_square, [SourceConfig(str(clips["h264"]), loop=True, realtime=True) for _ in range(3)],
                     backend="onnxruntime-cuda", max_batch=4, duration=3.0, decode_processes=1)
    pipeline = Pipeline(config)
    process, fps = pipeline.decoders.links[0].process, pipeline.sources[0].info.fps
    time.sleep(1.0)  # opened, not read yet
    started = time.monotonic()
    summary = pipeline.run()
    assert time.monotonic() - started < 3.0 + 10.0
    assert summary["failed"] == [0, 0, 0]
    # a load can only lower the count: at most the run's seconds at the stream's rate, and a frame in flight
    assert all(0 < c <= fps * summary["seconds"] + 2 for c in summary["captured"]), (summary["captured"], fps)
    assert [p + d for p, d in zip(summary["processed"], summary["dropped"])] == summary["captured"]
    assert not process.is_alive()


def test_decode_processes_take_streams_added_and_removed_while_serving(det_bundle_square, clips):
    """With the control API, a stream added while serving is decoded in a decode process too: a file to its
    end, and a looping one until it is removed (its frames through, its slot freed)."""
    import socket

    from jetpipe.pipelines.config import ControlConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = _config(det_bundle_square, [], backend="onnxruntime-cuda", max_batch=4, decode_processes=1,
                     metrics_listen=f"127.0.0.1:{port}", control=ControlConfig(enabled=True, max_streams=2))
    pipeline, summaries = Pipeline(config), []
    runner = threading.Thread(target=lambda: summaries.append(pipeline.run()))
    runner.start()
    try:
        ended = pipeline.add_stream(SourceConfig(str(clips["h264"])))
        looping = pipeline.add_stream(SourceConfig(str(clips["hevc"]), loop=True))
        assert "decode process" in pipeline.streams.find(looping["id"]).source.describe()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (pipeline.describe_stream(ended["id"])["processed"] < 24 or
                                               pipeline.describe_stream(looping["id"])["processed"] < 40):
            time.sleep(0.05)
        status, final = pipeline.remove_stream(looping["id"])
        assert status == 200 and final["state"] == "removed" and final["processed"] >= 40
        assert final["processed"] == final["captured"] and final["failed"] == 0
        assert pipeline.describe_stream(ended["id"])["processed"] == 24
    finally:
        pipeline.stop()
        runner.join(60)
    assert not runner.is_alive() and summaries[0]["failed"] == [0, 0]


def test_a_decode_process_that_dies_is_replaced_and_its_streams_go_on(det_bundle_square, clips, caplog):
    """A decode process killed while serving (a crash in the decoder would do the same): its streams count a
    failure and a reconnect, a new process opens them again, and they go on; the run ends cleanly."""
    import os
    import signal

    config = _config(det_bundle_square, [SourceConfig(str(clips[n]), loop=True) for n in ("h264", "hevc")],
                     backend="onnxruntime-cuda", max_batch=4, decode_processes=1)
    pipeline, summaries = Pipeline(config), []
    runner = threading.Thread(target=lambda: summaries.append(pipeline.run()))
    runner.start()
    captured = pipeline.metrics.captured

    def wait_for(condition):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not condition():
            time.sleep(0.05)
        return condition()

    try:
        assert wait_for(lambda: min(captured[:2]) >= 30)
        killed = pipeline.decoders.links[0].process
        os.kill(killed.pid, signal.SIGKILL)
        assert wait_for(lambda: pipeline.metrics.reconnects[:2] == [1, 1])
        before = list(captured[:2])
        assert wait_for(lambda: all(c >= b + 30 for c, b in zip(captured[:2], before))), captured[:2]
        assert pipeline.decoders.links[0].process is not killed
    finally:
        pipeline.stop()
        runner.join(60)
    summary = summaries[0]
    assert summary["failed"] == [1, 1] and summary["reconnects"] == [1, 1]
    assert summary["processed"] == summary["captured"] and summary["dropped"] == [0, 0]
    assert "decode process 0 exited (exit code -9)" in caplog.text


def test_ctrl_c_reaching_the_decode_processes_too_drains_and_exits_0(det_bundle_square, clips, tmp_path):
    """Ctrl-C goes to the whole process group, decode processes included: they keep decoding until the serving
    process has stopped its streams and drained; no stream fails, exit 0 with the summary."""
    import json
    import os
    import signal

    out = tmp_path / "r.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "jetpipe", "serve", "--bundle", str(det_bundle_square),
                             "--source", str(clips["h264"]), "--source", str(clips["hevc"]), "--loop",
                             "--decode-processes", "2", "--backend", "onnxruntime-cuda", "--sink", f"jsonl:{out}",
                             "--metrics", ""],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and (not out.exists() or len(out.read_text()) < 1000):
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate(timeout=10)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    summary = json.loads(err.strip().splitlines()[-1])["summary"]
    assert summary["failed"] == [0, 0] and "interrupted" not in summary, err[-2000:]
    assert sum(summary["processed"]) == len(out.read_text().splitlines()) > 0
    assert proc.returncode == 0 and "Traceback" not in err, err[-2000:]


@pytest.mark.parametrize("name", ["h264", "hevc"])
def test_ffmpeg_hwaccel_cuda_decodes_files_on_the_gpu_into_nv12_equal_to_software(clips, name, caplog):
    import logging

    caplog.set_level(logging.INFO)
    count = {"h264": 24, "hevc": 16}[name]
    info, frames = _ffmpeg_yuv(clips[name], count, lambda uri: PyAVSource(uri, hwaccel="cuda"))
    assert info.format == "nv12" and len(frames) == count
    assert "cuda (hardware)" in caplog.text
    soft = np.frombuffer(ffmpeg_decode(clips[name], "nv12"), np.uint8).reshape(count, *frames[0].shape)
    for hard, reference in zip(frames, soft, strict=True):  # ffmpeg decoding in software, as NV12
        diff = np.abs(hard.astype(np.int16) - reference)
        assert diff.max() <= 1, diff.max()  # H.264/HEVC decoding is exact: NVDEC and FFmpeg agree


def test_ffmpeg_hwaccel_cuda_decodes_what_nvdec_cannot_in_software_and_says_so(clips, caplog):
    info, frames = _ffmpeg_yuv(clips["yuv444"], 8, lambda uri: PyAVSource(uri, hwaccel="cuda"))
    assert len(frames) == 8 and info.format == "nv12"  # 4:4:4 decoded in software, then NV12 by swscale
    assert "software: cuda cannot decode this stream (h264 yuv444p)" in caplog.text


def test_a_stream_nvdec_cannot_take_falls_back_to_ffmpeg_and_says_why(det_bundle_square, clips, caplog):
    config = _config(det_bundle_square, [SourceConfig(str(clips["yuv444"]))], backend="onnxruntime-cuda", max_batch=4)
    pipeline = Pipeline(config)
    assert pipeline.sources[0].describe().endswith("(ffmpeg in-process)")
    assert "NVDEC cannot decode it" in caplog.text and "decoding with FFmpeg" in caplog.text
    summary = pipeline.run()
    assert summary["processed"] == [8]
    assert pipeline.runtime.frame_bytes_uploaded > 0  # the FFmpeg path uploads from pinned ring slots


def test_nvdec_frames_reach_a_drawing_sink_from_gpu_memory(det_bundle_square, clips, tmp_path):
    """Frames NVDEC decoded into device memory are copied to the host for a drawing sink (at its rate only):
    the JPEGs show the decoded picture, and inference still uploads no pixel."""
    import cv2

    folder = tmp_path / "jpegs"
    folder.mkdir()
    config = _config(det_bundle_square, [SourceConfig(str(clips["h264"]))], backend="onnxruntime-cuda", max_batch=4,
                     sinks=[f"jpeg:{folder}?every=8&width=960"])
    pipeline = Pipeline(config)
    assert pipeline.sources[0].describe().endswith("(nvdec)")
    summary = pipeline.run()
    assert summary["processed"] == [24] and pipeline.runtime.frame_bytes_uploaded == 0
    assert sorted(p.name for p in folder.iterdir()) == [f"s0_{i:06d}.jpg" for i in (0, 8, 16)]
    capture = cv2.VideoCapture(str(clips["h264"]))
    for index in range(17):
        ok, reference = capture.read()
        if index in (0, 8, 16):
            drawn = cv2.imread(str(folder / f"s0_{index:06d}.jpg"))
            expected = cv2.resize(reference, (960, 540), interpolation=cv2.INTER_AREA)
            assert ok and drawn.shape == expected.shape
            assert np.median(np.abs(drawn.astype(int) - expected)) < 6  # the same picture, boxes aside
    capture.release()


# --- network streams: NVDEC through an ffmpeg that only remuxes ----------------------------------------------

@pytest.fixture(scope="module")
def ts_clips(clips, tmp_path_factory):
    folder = tmp_path_factory.mktemp("gputs")
    return {name: as_mpegts(clips[name], folder / f"{name}.ts") for name in ("h264", "yuv444")}


@pytest.fixture
def network_feed(monkeypatch, ts_clips):
    """The remuxing ffmpeg, or where this machine's cannot read a socket, a copy standing in for it
    (tests/stream_server.py)."""
    return remux_or_stand_in(monkeypatch, ts_clips["h264"].read_bytes())


def _read_device_frames(runtime, source, info, count):
    ring = frame_ring(runtime, count, (info.height, info.width), device=True)
    for slot in range(count):
        source.read_into(ring.view(slot, info.format, info.height, info.width))
    with runtime.device.active():
        return [runtime.device.cuda.from_device(a, (info.height * info.width * 3 // 2,), np.uint8)
                for a in ring.addresses]


def test_nvdec_decodes_a_network_stream_like_the_file_and_opens_again(runtime, clips, ts_clips, network_feed):
    server = StreamServer(ts_clips["h264"].read_bytes(), once=True)
    source = open_source(server.url, hardware=hardware_decoder(runtime))
    try:
        assert source.describe().endswith("(nvdec)") and source.memory == "device" and source.info is None
        info = source.open()  # connects now, in the caller's thread
        assert (info.format, info.width, info.height) == ("nv12", 1920, 1080)
        network = _read_device_frames(runtime, source, info, 24)
        with pytest.raises(SourceError):  # one pass, then the server hangs up: the stream ended
            source.read_into(frame_ring(runtime, 1, (1080, 1920), device=True).view(0, "nv12", 1080, 1920))
        source.close()
        again = _read_device_frames(runtime, source, source.open(), 2)  # a reconnect: from the start
    finally:
        source.close()
        server.unplug()
    _, file_frames = _nvdec_frames(runtime, clips["h264"], 24)
    with runtime.device.active():
        from_file = [runtime.device.cuda.from_device(f.address, (f.nbytes,), np.uint8) for f in file_frames]
    for ours, theirs in zip(network + again, from_file + from_file[:2]):
        np.testing.assert_array_equal(ours, theirs)
    assert source.decode_errors == 0


def test_a_network_stream_through_nvdec_uploads_no_pixels_and_reconnects(det_bundle_square, ts_clips, network_feed):
    server = StreamServer(ts_clips["h264"].read_bytes(), once=True)  # 24 frames a connection
    config = _config(det_bundle_square, [SourceConfig(server.url)], backend="onnxruntime-cuda", max_batch=4,
                     frames=60, reconnect_max_s=0.2, duration=60)
    try:
        pipeline = Pipeline(config)
        assert pipeline.sources[0].describe().endswith("(nvdec)")
        summary = pipeline.run()
    finally:
        server.unplug()
    assert summary["reconnects"][0] >= 2 and summary["processed"][0] + summary["dropped"][0] == 60
    assert pipeline.runtime.frame_bytes_uploaded == 0 and pipeline.runtime.host_frame_copies == 0


def test_a_network_stream_through_nvdec_that_goes_silent_is_reconnected(det_bundle_square, ts_clips, network_feed,
                                                                         caplog):
    """A camera that stays connected but stops sending, decoded by NVDEC: after its stall timeout it is logged,
    counted and reconnected (NVDEC sources could not be restarted: it sat silent until stopped)."""
    data = ts_clips["h264"].read_bytes() * 4  # enough for the demuxer's probe and frames before the stall
    server = StreamServer(data, stall_after=len(data) * 3 // 4, stall_connection=1)  # the first connection stalls
    config = _config(det_bundle_square, [SourceConfig(server.url)], backend="onnxruntime-cuda", max_batch=4,
                     reconnect_max_s=0.5, stall_timeout_s=1.0, duration=60)
    pipeline = Pipeline(config)
    assert pipeline.sources[0].describe().endswith("(nvdec)")
    serve_through_a_stall(pipeline, server, caplog, join_timeout=20)


def test_a_network_stream_nvdec_cannot_take_is_decoded_by_ffmpeg_into_device_slots(runtime, clips, ts_clips,
                                                                                 network_feed, caplog):
    server = StreamServer(ts_clips["yuv444"].read_bytes(), once=True)  # 4:4:4: not for NVDEC
    uri = uris.parse(server.url)
    # the fallback decodes the same stream from its file: the GPU machines' ffmpeg cannot read a socket
    # (network_feed); FFmpeg reading network streams is tested on the CPU
    source = hardware_decoder(runtime)(uri, feed=RemuxFeed(uri),
                                      fallback=lambda: FFmpegSource(uris.parse(str(clips["yuv444"]))))
    try:
        info = source.open()
        frames = _read_device_frames(runtime, source, info, 4)
    finally:
        source.close()
        server.unplug()
    assert "NVDEC cannot decode it" in caplog.text and "decoding with FFmpeg" in caplog.text
    assert source.describe().endswith("(ffmpeg: NVDEC cannot take it)") and source.memory == "device"
    _, host = _ffmpeg_yuv(clips["yuv444"], 4)
    for ours, theirs in zip(frames, host, strict=True):
        np.testing.assert_array_equal(ours, theirs.reshape(-1))


def test_interrupt_ends_an_nvdec_connect_that_hangs(runtime, network_feed):
    server = StreamServer(hang=True)
    source = open_source(server.url, hardware=hardware_decoder(runtime))
    errors = []

    def connect():
        try:
            source.open()
        except SourceError as exc:
            errors.append(str(exc))

    opener = threading.Thread(target=connect)
    try:
        opener.start()
        opener.join(1.0)
        assert opener.is_alive()  # waiting for the camera
        started = time.monotonic()
        source.interrupt()
        opener.join(5)
        assert not opener.is_alive() and time.monotonic() - started < 5 and errors
    finally:
        source.close()
        server.unplug()


def test_nvdec_gives_a_cameras_frames_as_they_come_not_a_frame_late(runtime, tmp_path, monkeypatch):
    """A camera without B-frames (as most IP cameras send) whose first 16 KB have come (12 frames whole, a 13th
    begun), and no more yet, as jetpipe's remux writes it (each PES's length): NVDEC gives 10 of them now. With its
    default display latency it held one frame more (9): 33 ms at 30 frames/s behind the camera before the capture
    time, every frame."""
    mp4 = encode(tmp_path / "cam.mp4", "320x240", 300, extra=("-g", "15", "-bf", "0"))
    ts = tmp_path / "cam.ts"
    subprocess.run(["ffmpeg", "-v", "error", "-i", str(mp4), "-c", "copy", "-f", "mpegts", "-omit_video_pes_length",
                    "0", str(ts)], check=True)
    remux_or_stand_in(monkeypatch, ts.read_bytes())
    camera = StreamServer(ts.read_bytes(), stall_after=frame_offset(ts, 12), stall_connection=1)  # 1: the remux
    source = open_source(camera.url, hardware=hardware_decoder(runtime))
    rings = []  # kept while the source reads into it (a DeviceSlot is only its address)

    def device_slot(info):
        rings.append(frame_ring(runtime, 1, (info.height, info.width), device=True))
        return rings[-1].view(0, info.format, info.height, info.width)

    read_until_silent(source, camera, 10, device_slot)
    assert source.describe().endswith("(nvdec)")
