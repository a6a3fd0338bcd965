"""A network stream's MPEG-TS demuxed by PyAV for NVDEC (runtime.nvdec_pipe): a camera served over TCP, its real
remux ffmpeg (sources.ffmpeg.RemuxFeed), the demuxer's packets against the same file demuxed by PyAV itself.
PyNvVideoCodec's PacketData and cudaVideoCodec are stood for by a plain object and a namespace (the decoder that
reads them runs on the GPU machine: tests/pipelines/ingest/test_video_gpu.py's network tests)."""

import ctypes
import os
import shutil
import subprocess
import threading
import types

import pytest

from jetpipe import uri as uris
from jetpipe.pipelines.ingest.sources.ffmpeg import RemuxFeed, remux_command
from jetpipe.runtime.nvdec_pipe import NO_TIME, READ_BYTES, PipeDemuxer
from tests.pipelines.ingest.test_sources import as_mpegts, encode
from tests.stream_server import StreamServer, frame_offset
from tests.support import wait_for

pytestmark = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg not installed (apt-get install ffmpeg)")
CODEC_IDS = types.SimpleNamespace(H264="cudaVideoCodec.H264", HEVC="cudaVideoCodec.HEVC")


class PacketData:
    """PyNvVideoCodec's PacketData's fields."""
    bsl_data = bsl = pts = dts = duration = key = 0


def _camera_file(path, pix_fmt="yuv420p", frames=45):
    """What the camera sends: an H.264 video (a keyframe every 15 frames, BT.709 said) as MPEG-TS."""
    video = encode(path.with_suffix(".mp4"), "320x240", frames, pix_fmt=pix_fmt, extra=("-g", "15", "-colorspace",
                                                                                      "bt709"))
    return as_mpegts(video, path)


def _reference(path) -> list[tuple]:
    """The file's video packets as PyAV demuxes it: (bytes, pts, dts, key)."""
    import av

    with av.open(str(path)) as container:
        return [(bytes(p), p.pts, p.dts, p.is_keyframe) for p in container.demux(container.streams.video[0])
                if p.size]


class CountingFeed(RemuxFeed):
    """The real feed, the sizes its reads were asked for kept."""

    def __init__(self, uri):
        super().__init__(uri)
        self.asked: list[int] = []

    def fill(self, buffer) -> int:
        self.asked.append(len(buffer))
        return super().fill(buffer)


def _demux_camera(ts) -> tuple[PipeDemuxer, CountingFeed, list, StreamServer]:
    server = StreamServer(ts.read_bytes(), once=True)
    feed = CountingFeed(uris.parse(server.url))
    feed.start()
    demuxer = PipeDemuxer(feed, PacketData, CODEC_IDS)
    got = [(ctypes.string_at(p.bsl_data, p.bsl) if p.bsl else b"", None if p.pts == NO_TIME else p.pts,
            None if p.dts == NO_TIME else p.dts, bool(p.key)) for p in demuxer]
    return demuxer, feed, got, server


def test_a_cameras_packets_come_whole_with_their_times_and_the_streams_format(tmp_path):
    """Every packet of the camera's stream, its bytes (Annex B, as in the TS), times and keyframe flag as PyAV
    reads them from the file; the stream's codec, chroma, bit depth, clock, rate and colour as NvdecSource asks
    a PyNvVideoCodec demuxer; the feed's reads asked for at most READ_BYTES (PyNvVideoCodec's asked for
    megabytes, a bytearray of that size made and copied each read with the GIL held)."""
    ts = _camera_file(tmp_path / "cam.ts")
    demuxer, feed, got, server = _demux_camera(ts)
    try:
        assert got[:-1] == _reference(ts) and len(got) == 46 and got[0][3]
        assert got[-1][0] == b""  # the end: an empty packet, the decoder's flush
        assert demuxer.GetNvCodecId() == "cudaVideoCodec.H264"
        assert (demuxer.ChromaFormat(), demuxer.BitDepth()) == ("420", 8)
        assert (demuxer.GetTimebaseNum(), demuxer.GetTimebaseDen()) == (1, 90000)
        assert demuxer.FrameRate() == pytest.approx(30.0)
        assert (demuxer.ColorSpace(), demuxer.ColorRange()) == ("bt709", "mpeg")
        assert feed.received == ts.stat().st_size and max(feed.asked) <= READ_BYTES
    finally:
        demuxer.close()
        feed.stop()
        server.unplug()


def test_a_stream_nvdec_cannot_take_says_its_chroma(tmp_path):
    """A 4:4:4 camera: ChromaFormat says so (NvdecSource then hands it to the FFmpeg fallback)."""
    demuxer, feed, got, server = _demux_camera(_camera_file(tmp_path / "cam444.ts", "yuv444p", frames=10))
    try:
        assert (demuxer.ChromaFormat(), demuxer.BitDepth()) == ("444", 8) and len(got) == 11
    finally:
        demuxer.close()
        feed.stop()
        server.unplug()


def test_the_packets_end_where_the_connection_is_ended(tmp_path):
    """restart() / interrupt() end the feed's ffmpeg: the demuxer's packets end (no error), as a camera that
    went."""
    ts = _camera_file(tmp_path / "cam.ts", frames=300)
    server = StreamServer(ts.read_bytes(), seconds=10.0)  # in real time: the end is not reached here
    feed = RemuxFeed(uris.parse(server.url))
    feed.start()
    demuxer = PipeDemuxer(feed, PacketData, CODEC_IDS)
    try:
        packets = iter(demuxer)
        next(packets)
        feed.interrupt()
        assert sum(1 for _ in packets) < 299  # (the last: the flush)
    finally:
        demuxer.close()
        feed.stop()
        server.unplug()


def _demux_a_camera_that_goes_silent(tmp_path, wanted: int, check=None) -> None:
    """Wait until `wanted` packets of a TCP camera that sends its first 16 KB and then nothing (the connection left
    open: 15 frames begun, 14 whole) have come out of the remux ffmpeg and the demuxer NVDEC reads; check(demuxer)
    then."""
    ts = _camera_file(tmp_path / "cam.ts", frames=300)
    server = StreamServer(ts.read_bytes(), stall_after=frame_offset(ts, 12))  # to the end of that 16 KB piece
    feed = RemuxFeed(uris.parse(server.url))
    got, opened = [], []

    def demux():
        try:
            demuxer = PipeDemuxer(feed, PacketData, CODEC_IDS)
        except Exception:  # the feed ended by interrupt() below, before the stream was known
            return
        opened.append(demuxer)
        got.extend(p.bsl for p in demuxer)

    feed.start()
    reader = threading.Thread(target=demux, daemon=True)
    reader.start()
    try:
        wait_for(lambda: len(got) >= wanted, 30, f"{wanted} frames, the camera silent after them")
        if check is not None:
            check(opened[0])
    finally:
        feed.interrupt()
        reader.join(10)
        for demuxer in opened:
            demuxer.close()
        feed.stop()
        server.unplug()
    assert not reader.is_alive()


def test_a_cameras_first_frames_come_out_before_it_sends_more(tmp_path):
    """A camera whose first frames have come, and no more yet: they reach the decoder now. FFmpeg's defaults
    held them: the remux ffmpeg analysed 5 s of the stream before writing a byte, and PyAV read 20 frames for the
    rate before its first packet, then gave all it had read at once (more than a stream's queue holds: dropped at
    every connection, and a camera opened 5.9 s late)."""

    def rate_is_the_frame_rate(demuxer):
        assert demuxer.FrameRate() == pytest.approx(30.0)  # not H.264's field rate (60), as with fewer frames

    _demux_a_camera_that_goes_silent(tmp_path, 8, rate_is_the_frame_rate)


def test_an_mpegts_cameras_remux_holds_no_frame_for_its_times(tmp_path):
    """The same camera: 12 of its frames reach the decoder. The remux's setts filter (for RTSP cameras whose first
    packet has no decoding time) held each packet until the next had come: 11, every frame of an MPEG-TS camera a
    frame interval later (134 against 101 ms behind the camera); MPEG-TS carries its times. (The 2 frames still
    held are the demuxers' H.264 parsers', each waiting for the next frame to begin.)"""
    _demux_a_camera_that_goes_silent(tmp_path, 12)


def test_a_frame_reaches_the_decoder_when_its_last_byte_has_come(tmp_path):
    """The remux's MPEG-TS up to the end of frame 20 in a pipe kept open: 20 of those 21 frames are demuxed
    (FFmpeg's H.264 parser holds the last until the next begins), not 19: without the PES's length, which FFmpeg
    leaves out of a video PES by default, the demuxer held one more frame, a frame interval of latency a camera."""
    ts = _camera_file(tmp_path / "cam.ts", frames=60)
    remuxed = subprocess.run(remux_command(uris.parse(str(ts))), capture_output=True, check=True).stdout
    (tmp_path / "remuxed.ts").write_bytes(remuxed)
    cut = frame_offset(tmp_path / "remuxed.ts", 21)
    read_end, write_end = os.pipe()

    class Pipe:
        def fill(self, buffer) -> int:
            return os.readv(read_end, [buffer])

    got = []

    def demux():
        got.extend(p.bsl for p in PipeDemuxer(Pipe(), PacketData, CODEC_IDS))

    reader = threading.Thread(target=demux, daemon=True)
    reader.start()
    try:
        os.write(write_end, remuxed[:cut])  # (the reader runs: more than a pipe's 64 KB would not block)
        wait_for(lambda: len(got) >= 20, 30, "the frames whose bytes have all come")
    finally:
        os.close(write_end)  # the end: the demuxer gives the rest and ends
        reader.join(10)
        os.close(read_end)
    assert not reader.is_alive()
