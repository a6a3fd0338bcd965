"""Recording on the NVDEC path (marker gpu): the packets NVDEC's demuxer gives (Annex B), in the serving process
and sent from a decode process, written as segments whose pictures are the input's own.

Needs PyCUDA, onnxruntime-gpu, PyNvVideoCodec and ffmpeg (PyAV for a network stream's teed packets).
"""

import shutil
import sqlite3
import subprocess

import pytest

from tests.pipelines.outputs.test_clips import _frame_md5s
from tests.pipelines.outputs.test_clips_gpu import serve_nvdec_door
from tests.stream_server import StreamServer, remux_or_stand_in

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("processes", [0, 1], ids=["in-process", "decode-process"])
def test_an_nvdec_streams_recording_is_the_inputs_pictures_end_to_end(det_bundle_square, tmp_path, panning_video,
                                                                       panning_h264, processes):
    folder = tmp_path / "rec"
    records, summary = serve_nvdec_door(det_bundle_square, tmp_path, panning_video, panning_h264,
                                        ["--record", str(folder), "--decode-processes", str(processes)])
    assert summary["recording"]["failed"] == 0 and summary["recording"]["segments"] >= 2
    with sqlite3.connect(folder / "index.sqlite3") as db:
        rows = db.execute("SELECT path, t0, t1, packets, open FROM segments ORDER BY t0").fetchall()
        events = db.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    assert events == sum(r.get("schema") == "jetpipe.event/1" for r in records) > 0
    assert all(open_ == 0 for *_, open_ in rows)
    recorded = [md5 for path, *_ in rows for md5 in _frame_md5s(folder / path)]
    source = _frame_md5s(panning_h264)
    # every picture from the first recorded one on, in order (a decode process may ask for the packets after its
    # first frames: the recording then starts at the next keyframe)
    first = source.index(recorded[0])
    assert recorded == source[first:] and first <= 4
    for row, following in zip(rows, rows[1:]):
        assert following[1] == pytest.approx(row[2], abs=1e-3)


def test_a_network_nvdec_streams_recording_is_teed_past_the_serving_process(det_bundle_square, tmp_path, monkeypatch,
                                                                           panning_video, panning_h264):
    """A camera NVDEC decodes (its packets through a remux ffmpeg): the recording process reads them from the
    ffmpeg's second copy; the serving process keeps none (no arena), and the segments are the camera's pictures
    on the clock of the frames NVDEC decoded."""
    pytest.importorskip("av", reason="PyAV (pip install av) reads the teed packets in the recording process")
    ts = tmp_path / "panning.ts"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(panning_h264), "-c", "copy", "-f", "mpegts",
                    str(ts)], check=True)
    remuxer = remux_or_stand_in(monkeypatch, ts.read_bytes())
    server = StreamServer(ts.read_bytes(), once=True)  # one pass a connection, then the camera hangs up
    folder = tmp_path / "rec"
    try:
        records, summary = serve_nvdec_door(det_bundle_square, tmp_path, panning_video, server.url,
                                            ["--record", str(folder), "--frames", str(panning_video.frames)])
    finally:
        server.unplug()
    recording = summary["recording"]
    assert recording["teed_streams"] == 1 and recording["rings_s"] == 0, (remuxer, recording)
    assert recording["failed"] == 0 and recording["segments"] >= 1
    with sqlite3.connect(folder / "index.sqlite3") as db:
        rows = db.execute("SELECT path, t0, open FROM segments ORDER BY start, path").fetchall()
    assert all(open_ == 0 for *_, open_ in rows)
    recorded = [md5 for path, *_ in rows for md5 in _frame_md5s(folder / path)]
    source = _frame_md5s(panning_h264)
    assert recorded[:len(source)] == source  # the first connection whole, from its first picture
    # the segments start at keyframes on the frames' clock (no B-frames: a keyframe's decode time is its frame's).
    # The keyframes are the stream's: the camera sends its file at once, and the live stream may drop a keyframe's
    # frame (an H100 dropped 12 of 40, the one at a segment's start among them)
    import av

    with av.open(str(ts)) as container:
        stream = container.streams.video[0]
        keys = [float(p.pts * stream.time_base) for p in container.demux(stream) if p.is_keyframe and p.size]
    frames = sorted({r["pts"] for r in records if "schema" not in r})
    assert rows[0][1] == pytest.approx(frames[0], abs=1e-3)
    assert all(any(abs(t0 - key) < 1e-3 for key in keys) for _, t0, _ in rows)


def _refused_network_stream(device, tmp_path, monkeypatch):
    """A camera NVDEC turns out not to take (4:4:4, learnt once it connects): its video (90 frames, a keyframe
    every 15), its server, and its NVDEC source with the FFmpeg fallback (decoding the same stream from the file:
    the GPU machines' ffmpeg cannot read a socket). No model runs: the CUDA device alone, no ONNX Runtime."""
    pytest.importorskip("PyNvVideoCodec", reason="PyNvVideoCodec (pip install pynvvideocodec) not installed")
    if not shutil.which("ffmpeg"):
        pytest.skip("ffmpeg is not installed")
    from jetpipe import uri as uris
    from jetpipe.pipelines.ingest.sources import FFmpegSource
    from jetpipe.pipelines.ingest.sources.ffmpeg import RemuxFeed
    from jetpipe.runtime.nvdec import open_nvdec
    from tests.pipelines.ingest.test_sources import as_mpegts, encode

    video = encode(tmp_path / "yuv444.mp4", "640x480", 90, pix_fmt="yuv444p", extra=("-g", "15", "-bf", "0"))
    ts = as_mpegts(video, tmp_path / "yuv444.ts").read_bytes()
    remux_or_stand_in(monkeypatch, ts)
    server = StreamServer(ts, once=True)
    uri = uris.parse(server.url)
    source = open_nvdec(device, uri, feed=RemuxFeed(uri), fallback=lambda: FFmpegSource(uris.parse(str(video))))
    return video, server, source


def _read_to_the_end(device, source) -> int:
    """The stream's frames read into a device slot, as the daemon reads them: how many."""
    import numpy as np

    from jetpipe.frames import frame_shape
    from jetpipe.pipelines.ingest.sources import EndOfStream
    from jetpipe.runtime.ring import DeviceSlot

    info = source.open()
    assert source.describe().endswith("(ffmpeg: NVDEC cannot take it)")
    nbytes = int(np.prod(frame_shape(info.format, info.height, info.width)))
    with device.active():
        memory = device.alloc(nbytes)
    slot = DeviceSlot(int(memory), nbytes, info.format, info.height, info.width)
    frames = 0
    with pytest.raises(EndOfStream):
        while True:
            source.read_into(slot)
            frames += 1
    return frames


def test_a_network_stream_nvdec_cannot_take_is_recorded_from_its_ffmpeg_fallback(device, tmp_path, monkeypatch):
    """The recording teed to the camera's feed at attach gets the FFmpeg fallback's packets once NVDEC turns the
    stream down (it got nothing after the feed's ffmpeg stopped): every picture of the stream, in order."""
    pytest.importorskip("av", reason="PyAV (pip install av) reads the teed packets in the recording process")
    from jetpipe.pipelines.outputs.recording.process import RecordingProcess
    from tests.pipelines.outputs.test_recording import _config, _index, _wait
    from tests.pipelines.outputs.test_recording_teed import _pipes_of

    video, server, source = _refused_network_stream(device, tmp_path, monkeypatch)
    folder = tmp_path / "rec"
    recorder = RecordingProcess(_config(folder), 5.0, 5.0, 64)
    try:
        recorder.attach(0, source, "all")
        assert source.packet_ring is None  # teed to the feed's ffmpeg: no arena
        baseline = _pipes_of(recorder.process.pid)
        frames = _read_to_the_end(device, source)
        source.close()
        _wait(lambda: _pipes_of(recorder.process.pid) <= baseline)  # both connections' pipes read to their end
    finally:
        source.close()
        recorder.close()
        server.unplug()
    assert frames == 90 and recorder.summary()["teed_streams"] == 1
    rows = _index(folder, "SELECT path FROM segments ORDER BY id")  # as written: the feed's pass first
    recorded = [md5 for (path,) in rows for md5 in _frame_md5s(folder / path)]
    expected = _frame_md5s(video)
    assert recorded[-len(expected):] == expected  # the fallback's run whole (after what the feed sent first)


def test_a_network_stream_nvdec_cannot_take_keeps_its_clips_packets_from_its_ffmpeg_fallback(device, tmp_path,
                                                                                           monkeypatch):
    """The clips' ring set on the camera's source at attach is the FFmpeg fallback's too once NVDEC turns the
    stream down (before, it kept nothing more: no clip of such a camera)."""
    pytest.importorskip("av", reason="PyAV (pip install av) reads the packets the fallback's decoder copies")
    from jetpipe.pipelines.ingest.packet_ring import shared_ring

    _, server, source = _refused_network_stream(device, tmp_path, monkeypatch)
    try:
        ring = shared_ring(source, 60.0, 64 << 20)
        frames = _read_to_the_end(device, source)
        source.close()
    finally:
        source.close()
        server.unplug()
    assert frames == 90
    kept = ring.between(float("-inf"), float("inf"))
    assert len(kept) >= 90 and ring.bytes > 0  # the fallback's 90 (after what the feed's demuxer kept first)
