"""A network stream's packets teed to the recording process by its remux ffmpeg, or by the decoder process that
decodes it (recording/teed.py): the recording is written from packets the serving process never read, on the
clock of the frames it decodes, across reconnects; a recording process that goes does not stop the stream.

The stream here is what NvdecSource takes from its feed (the remux ffmpeg's MPEG-TS, read through fill()), with
the frames' clock read from those bytes; NVDEC itself is the GPU test's (test_recording_gpu.py)."""

import io
import os
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

from jetpipe import uri as uris
from jetpipe.frames import frame_shape
from jetpipe.pipelines.ingest.sources.ffmpeg import FFmpegSource, RemuxFeed
from jetpipe.pipelines.outputs.recording.process import RecordingProcess
from tests.pipelines.outputs.test_recording import (
    FPS,
    GOP,
    _config,
    _decodes,
    _index,
    _rows,
    _video,
    _wait,
    needs_ffmpeg,
)
from tests.stream_server import StreamServer
from tests.support import jetson_pipeline_in_software

av = pytest.importorskip("av", reason="PyAV (pip install av) reads the teed packets")


class _RemuxedStream:
    """The source's side the recording reads, of a network stream whose packets come through a remux ffmpeg
    (as NvdecSource's)."""

    keeps_packets = True
    bit_rate = 0.0
    packet_ring = None

    def __init__(self, url: str):
        self.source_uri = uris.parse(url)
        self.feed = RemuxFeed(self.source_uri)

    def describe(self) -> str:
        return f"{self.source_uri.text} (remuxed)"

    def tee_packets(self, tee) -> bool:
        return self.feed.tee_packets(tee)

    def connection(self, at_first_bytes=lambda: None) -> list[tuple[float, bool]]:
        """One connection read to its end as the NVDEC demuxer reads it: its packets' (decode time in seconds,
        keyframe)."""
        self.feed.start()
        data, buffer = bytearray(), bytearray(1 << 16)
        while got := self.feed.fill(buffer):
            if not data:
                at_first_bytes()
            data += buffer[:got]
        self.feed.stop()
        with av.open(io.BytesIO(bytes(data)), format="mpegts") as container:
            stream = container.streams.video[0]
            return [(float(p.dts * stream.time_base), p.is_keyframe) for p in container.demux(stream)
                    if p.size and p.dts is not None]


def _ts(tmp_path: Path, seconds: float = 4, cut: bool = False) -> bytes:
    """The test video as a camera sends it: MPEG-TS; cut: from a TS packet a fifth of a GOP in, as a connection
    to a camera starts mid-GOP (the remux then starts at the next keyframe, not at decode time 0)."""
    video = _video(tmp_path / "in.mp4", seconds=seconds)
    out = tmp_path / "in.ts"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(video), "-c", "copy", "-f", "mpegts", str(out)],
                   check=True)
    data = out.read_bytes()
    return data[len(data) // int(seconds * FPS / GOP) // 5 // 188 * 188:] if cut else data


def _pipes_of(pid: int) -> set[str]:
    pipes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed since the folder was listed
            continue
        if target.startswith("pipe:"):
            pipes.add(target)
    return pipes


@needs_ffmpeg
@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs Linux's /proc to see a process's pipes")
def test_a_teed_streams_recording_is_its_own_packets_on_the_decoded_clock_across_a_reconnect(tmp_path):
    server = StreamServer(_ts(tmp_path, cut=True), once=True)  # each connection: the stream once, from its start
    folder = tmp_path / "rec"
    recorder = RecordingProcess(_config(folder), 5.0, 5.0, 64)
    try:
        stream = _RemuxedStream(server.url)
        recorder.attach(0, stream, "all")
        assert stream.packet_ring is None  # no arena: nothing of the packets goes through this process
        baseline = _pipes_of(recorder.process.pid)
        connections = []
        for n in range(2):  # a reconnect: the camera's clock starts again, the recording's second pass
            connections.append(stream.connection())
            # its pipe read to its end (its last GOP whole), its segments begun
            _wait(lambda: _pipes_of(recorder.process.pid) <= baseline)
            _wait(lambda n=n: len(_rows(folder)) >= 2 * (n + 1))
    finally:
        recorder.close()
        server.unplug()
    rows = _index(folder, "SELECT path, t0, packets, open FROM segments ORDER BY t0, path")
    # from the first keyframe after the cut: 3.5 of the 4 s
    assert [len(c) for c in connections] == [4 * FPS - GOP] * 2 and connections[0][0][1]
    assert sum(r[2] for r in rows) == 2 * (4 * FPS - GOP)  # every packet of both connections
    assert all(r[3] == 0 and _decodes(folder / r[0]) == r[2] for r in rows)
    # on the clock of the packets NVDEC decodes (the remux ffmpeg's), each connection in two 2-s segments (a segment
    # starts at its first packet's decode time)
    first = connections[0][0][0]
    assert first > 0.1 and [r[1] for r in rows] == pytest.approx([first, first, first + 2, first + 2], abs=1e-4)
    summary = recorder.summary()
    assert summary["teed_streams"] == 1 and summary["rings_s"] == 0 and summary["unkept_packets"] == 0
    assert summary["lost_gops"] == 0 and summary["segments"] == len(rows) == 4


@needs_ffmpeg
@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs Linux's /proc to see a process's pipes")
@pytest.mark.parametrize("when", ["mid-connection", "before the connection"])
def test_a_stream_goes_on_whole_when_its_recording_process_went(tmp_path, when):
    """The copy's reader gone (the recording process killed while it reads the connection's copy, or before the
    connection: its pipe then never reaches it): the remux ffmpeg drops the copy, not the stream (a minute of
    video, 2 MB: most of it comes after the kill)."""
    seconds = 60
    server = StreamServer(_ts(tmp_path, seconds), once=True)
    recorder = RecordingProcess(_config(tmp_path / "rec"), 5.0, 5.0, 64)
    try:
        stream = _RemuxedStream(server.url)
        recorder.attach(0, stream, "all")
        baseline = _pipes_of(recorder.process.pid)

        def kill_the_recording():
            if when == "mid-connection":
                _wait(lambda: _pipes_of(recorder.process.pid) - baseline)  # it reads the connection's copy
            recorder.process.kill()
            recorder.process.join(30)

        if when == "before the connection":
            kill_the_recording()
        packets = stream.connection(at_first_bytes=kill_the_recording if when == "mid-connection" else lambda: None)
        assert len(packets) == seconds * FPS
        assert recorder.health() == "recording: its process stopped"
    finally:
        recorder.close()
        server.unplug()


# --- a stream a decoder process decodes (FFmpeg here; a Jetson's GStreamer the same way) -------------------------
def _decoded(source, on_first_frame=lambda: None) -> list[float]:
    """One run of the source read to its end, as its capture thread reads it: the frames' times."""
    from jetpipe.pipelines.ingest.sources.base import SourceError

    info = source.open()
    slot = np.empty(frame_shape(info.format, info.height, info.width), np.uint8)
    times = []
    while True:
        try:
            times.append(source.read_into(slot))
        except SourceError:  # a live stream's end
            return times
        if len(times) == 1:
            on_first_frame()


@needs_ffmpeg
@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs Linux's /proc to see a process's pipes")
def test_a_decoder_process_tees_its_packets_counted_from_its_first_keyframe_as_its_frames_are(tmp_path):
    """An FFmpeg-decoded camera joined mid-GOP: its decoder writes the packets to the recording process's pipe
    (no arena, no tap in this process); they are counted from the run's first keyframe, as the frames are (a copy
    on the camera's own clock would start 0.4 s late), and each is a decoded frame."""
    ts = _ts(tmp_path, cut=True)
    with av.open(io.BytesIO(ts), format="mpegts") as container:  # the first keyframe's reorder delay
        stream = container.streams.video[0]
        key = next(p for p in container.demux(stream) if p.is_keyframe)
        delay = float((key.pts - key.dts) * stream.time_base)
    server = StreamServer(ts, once=True)
    folder = tmp_path / "rec"
    recorder = RecordingProcess(_config(folder), 5.0, 5.0, 64)
    try:
        source = FFmpegSource(uris.parse(server.url), False, False)
        recorder.attach(0, source, "all")
        assert source.packet_ring is None  # no arena: nothing of the packets goes through this process
        baseline = _pipes_of(recorder.process.pid)
        frames = _decoded(source)
        source.close()
        _wait(lambda: _pipes_of(recorder.process.pid) <= baseline)  # its pipe read to its end
        _wait(lambda: len(_rows(folder)) >= 2)
    finally:
        recorder.close()
        server.unplug()
    rows = _index(folder, "SELECT path, t0, packets, open FROM segments ORDER BY t0")
    assert len(frames) == 4 * FPS - GOP and frames[0] == 0.0  # from the first keyframe after the cut
    assert sum(r[2] for r in rows) == len(frames) and all(r[3] == 0 and _decodes(folder / r[0]) == r[2] for r in rows)
    # on the frames' clock (the first keyframe shown at 0), 2-s segments, each from its first packet's decode time
    assert [r[1] for r in rows] == pytest.approx([-delay, 2.0 - delay], abs=1e-4) and delay < 0.2
    summary = recorder.summary()
    assert summary["teed_streams"] == 1 and summary["rings_s"] == 0 and summary["segments"] == 2


@needs_ffmpeg
@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs Linux's /proc to see a process's pipes")
def test_a_decoder_process_goes_on_whole_when_the_recording_process_went(tmp_path):
    """The recording process killed after the first frame of a minute's camera (2 MB of packets, twice the pipe's
    buffer, most after the kill): the decoder's copy is drained here from then on, so it neither fails on a
    closed pipe nor waits on a full one, and every frame comes; the next run gets no copy."""
    seconds = 60
    server = StreamServer(_ts(tmp_path, seconds), once=True)
    recorder = RecordingProcess(_config(tmp_path / "rec"), 5.0, 5.0, 64)
    try:
        source = FFmpegSource(uris.parse(server.url), False, False)
        recorder.attach(0, source, "all")

        def kill_the_recording():
            recorder.process.kill()
            recorder.process.join(30)

        stuck = threading.Timer(120, source.interrupt)  # a decoder waiting on a full pipe: fail, do not hang
        stuck.start()
        try:
            assert len(_decoded(source, on_first_frame=kill_the_recording)) == seconds * FPS
        finally:
            stuck.cancel()
        assert recorder.health() == "recording: its process stopped"
        again = _decoded(source)  # a reconnect: its decoder writes no copy
        assert len(again) == seconds * FPS and "mpegts" not in source._process.argv
        source.close()
    finally:
        recorder.close()
        server.unplug()


@needs_ffmpeg
def test_a_jetsons_gstreamer_pipeline_tees_its_packets_to_the_recording_process(tmp_path, monkeypatch):
    """The GStreamer pipeline built for a Jetson (a software decoder in nvv4l2decoder's place: no Jetson on hand)
    with a recording: the tee after its parser sends the packets to the recording process's pipe, not to a tap
    here; every frame's packet is recorded, on the frames' clock."""
    from jetpipe.pipelines.ingest.sources import EndOfStream, gstreamer, open_source

    jetson_pipeline_in_software(monkeypatch)
    video = _video(tmp_path / "in.mp4", seconds=4)
    folder = tmp_path / "rec"
    recorder = RecordingProcess(_config(folder), 5.0, 5.0, 64)
    frames = []
    try:
        source = open_source(str(video), decoder="gstreamer")  # as a Jetson opens it (its size and bit rate probed)
        assert isinstance(source, gstreamer.GstSource) and source.bit_rate > 0
        recorder.attach(0, source, "all")
        assert source.packet_ring is None
        info = source.open()
        assert "mpegtsmux" in " ".join(source._process.argv)
        slot = np.empty(frame_shape(info.format, info.height, info.width), np.uint8)
        with pytest.raises(EndOfStream):
            while True:
                frames.append(source.read_into(slot))
        source.close()
        _wait(lambda: len(_rows(folder)) >= 2)
    finally:
        recorder.close()
    rows = _index(folder, "SELECT path, t0, packets, open FROM segments ORDER BY t0")
    assert len(frames) == 4 * FPS and sum(r[2] for r in rows) == len(frames)
    assert all(r[3] == 0 and _decodes(folder / r[0]) == r[2] for r in rows)
    assert rows[0][1] <= frames[0] < rows[0][1] + 0.2 and rows[1][1] == pytest.approx(rows[0][1] + 2, abs=1e-4)
    summary = recorder.summary()
    assert summary["teed_streams"] == 1 and summary["rings_s"] == 0
