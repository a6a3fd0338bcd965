"""A network stream's MPEG-TS for NVDEC, demuxed by PyAV from its feed (the remux ffmpeg's pipe).

Why not PyNvVideoCodec's own demuxer read through a callback, as before: it hands each read a buffer the size of
FFmpeg's I/O buffer's free room (2.5-6.8 MB) and spends ~1.3 ms of CPU in its own code a read, the GIL held,
however few bytes the read returns (measured on an H100; what it does with the buffer is inferred: making and
copying one that size). A live camera's bytes come a frame at a time, so that was a read a frame: 16 cameras held
the serving process's GIL ~0.45 s a second (py-spy: 39 % of its samples), and 7 % of their frames were dropped
where 16 files dropped none (scripts/diag/demux_callback.py; issue 66). PyAV asks for at most READ_BYTES a read,
into a buffer of its own; the wait for the camera's bytes is the feed's pipe read, the GIL released.

PipeDemuxer answers what NvdecSource asks a PyNvVideoCodec demuxer (the stream's codec, chroma, bit depth,
clock, rate and colour), and its packets are the decoder's PacketData, each pointing into PyAV's packet, which
is kept until the next one is demuxed (as PyNvVideoCodec's demuxer keeps its buffer). A file is still demuxed by
PyNvVideoCodec (its reads are FFmpeg's, no Python call between).
"""

from __future__ import annotations

NO_TIME = -(1 << 63)  # FFmpeg's AV_NOPTS_VALUE: a packet's time PyAV gives as None
READ_BYTES = 1 << 16  # PyAV's reads: a 1080p frame or two of H.264, a keyframe in a few
RATE_FRAMES = 2  # frames FFmpeg reads for the stream's rate when it opens (fewer: H.264's field rate, twice the rate)
CODECS = {"h264": "H264", "hevc": "HEVC", "av1": "AV1", "vp9": "VP9", "vp8": "VP8", "mpeg2video": "MPEG2",
          "mpeg4": "MPEG4", "mjpeg": "JPEG"}  # PyAV's codec names -> PyNvVideoCodec's cudaVideoCodec members
COLOUR_SPACES = {1: "bt709", 5: "bt470bg", 6: "smpte170m"}  # AVColorSpace (others: unspecified)
FULL_RANGE = 2  # AVCOL_RANGE_JPEG


class FeedReader:
    """The feed as the file object PyAV reads: each read one fill() (the pipe's bytes as they come)."""

    def __init__(self, feed):
        self.feed = feed
        self._buffer = bytearray(READ_BYTES)

    def read(self, size: int = -1) -> bytes:
        view = memoryview(self._buffer)[:READ_BYTES if size < 0 else min(size, READ_BYTES)]
        return bytes(view[:self.feed.fill(view)])


class PipeDemuxer:
    """The feed's video stream, opened now (its first bytes read and probed)."""

    def __init__(self, feed, packet_type, codec_ids):
        """packet_type: PyNvVideoCodec's PacketData; codec_ids: its cudaVideoCodec."""
        import av

        self._packet_type, self._codec_ids = packet_type, codec_ids
        # the rate from two frames, not FFmpeg's twenty: the frames read while probing come out at once (0.7 s of
        # a camera's, more than its queue holds), and the decoder waited for them
        self._container = av.open(FeedReader(feed), format="mpegts", buffer_size=READ_BYTES,
                                  options={"fpsprobesize": str(RATE_FRAMES)})
        self._stream = self._container.streams.video[0]
        self._context = self._stream.codec_context

    def GetNvCodecId(self):  # noqa: N802 (PyNvVideoCodec's names: NvdecSource reads either demuxer)
        name = self._context.name
        if name not in CODECS:
            raise ValueError(f"NVDEC does not decode {name}")
        return getattr(self._codec_ids, CODECS[name])

    def ChromaFormat(self) -> str:  # noqa: N802
        pix_fmt = self._context.pix_fmt or ""
        for chroma in ("420", "422", "444"):
            if chroma in pix_fmt:
                return chroma
        return {"nv12": "420", "nv21": "420", "nv16": "422", "gray": "400"}.get(pix_fmt, pix_fmt or "unknown")

    def BitDepth(self) -> int:  # noqa: N802
        import av

        try:
            return int(av.VideoFormat(self._context.pix_fmt).components[0].bits)
        except (TypeError, ValueError):  # none found, or one PyAV does not know: not one NVDEC takes here
            return 0

    def GetTimebaseNum(self) -> int:  # noqa: N802
        return self._stream.time_base.numerator

    def GetTimebaseDen(self) -> int:  # noqa: N802
        return self._stream.time_base.denominator

    def FrameRate(self) -> float:  # noqa: N802
        rate = self._stream.average_rate or self._stream.base_rate
        return float(rate) if rate else 0.0

    def ColorSpace(self) -> str:  # noqa: N802
        return COLOUR_SPACES.get(getattr(self._context, "colorspace", 2), "unspecified")

    def ColorRange(self) -> str:  # noqa: N802
        return "jpeg" if getattr(self._context, "color_range", 0) == FULL_RANGE else "mpeg"

    def __iter__(self):
        """The stream's packets, one PacketData (its fields set again for each: the decoder reads it before
        the next); where the feed ends (the camera went, the connection was ended), an empty one last, as
        PyNvVideoCodec's demuxer ends: given to the decoder, it gives the pictures it still holds."""
        import av

        packet = self._packet_type()
        demuxed = self._container.demux(self._stream)
        while True:
            try:  # `got`, the packet PacketData points into, is held until the next one has come
                got = next(demuxed)
            except (StopIteration, av.error.FFmpegError, OSError):
                packet.bsl_data = packet.bsl = 0
                yield packet
                return
            if not got.size:
                continue
            packet.bsl_data, packet.bsl = got.buffer_ptr, got.size
            packet.pts = NO_TIME if got.pts is None else got.pts
            packet.dts = NO_TIME if got.dts is None else got.dts
            packet.duration, packet.key = got.duration or 0, int(got.is_keyframe)
            yield packet

    def close(self) -> None:
        self._container.close()
