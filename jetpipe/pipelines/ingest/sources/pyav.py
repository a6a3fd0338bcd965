"""Video files decoded in this process by FFmpeg's libraries (PyAV): the decoder's YUV planes copied once,
straight into the ring slot.

An ffmpeg subprocess writing raw frames to a pipe costs, per 1080p frame, a copy
into its output packet, two kernel copies through the pipe and the syscalls
around them: 1.5-3.7 ms of CPU more than decoding in-process (H.264 and HEVC on
the H100 and H200 hosts, docs/lab/benchmarks.md), as much as OpenCV spends converting
colour. Here the only copy is plane -> slot; decoding runs in FFmpeg's threads
with the GIL released.

Files only: opening a network stream or a camera can hang inside FFmpeg, and
PyAV offers no way to interrupt it from another thread; those stay on the ffmpeg
subprocess, which a stopping daemon kills. Frames stay YUV as decoded (I420,
NV12, YUYV, UYVY); planar 4:2:2 (MJPEG) is repacked to YUYV without changing a
value; other layouts (4:4:4, 10-bit) are converted to NV12 by swscale.

hwaccel (FFmpeg's hardware decoding: cuda, qsv, ... as PyAV's FFmpeg was built): the decoder runs on
the GPU or media engine and each frame is downloaded as NV12 into the slot; a
stream the hardware cannot decode is decoded in software (said in the log). The
layout is taken from the first decoded frame, so it is known only after open().
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from fractions import Fraction

import numpy as np

from jetpipe.errors import JetpipeError, worth_logging
from jetpipe.pipelines.ingest.packet_ring import Packet
from jetpipe.pipelines.ingest.sources.base import EndOfStream, FrameInfo, SourceError, not_teed, read_whole
from jetpipe.pipelines.ingest.sources.ffmpeg import NATIVE, StreamFormat
from jetpipe.uri import SourceURI

log = logging.getLogger(__name__)

# planar 4:2:2 is repacked here value for value, so full-range MJPEG stays full range (swscale would rescale it)
REPACKED_422 = {"yuv422p": ("yuyv", "yuv422p", None), "yuvj422p": ("yuyv", "yuvj422p", "full")}
PYAV_NATIVE = {**NATIVE, **REPACKED_422}
# AVColorSpace / AVColorRange codes -> the names ffprobe prints (StreamFormat speaks those)
COLOR_SPACES = {1: "bt709", 4: "fcc", 5: "bt470bg", 6: "smpte170m", 7: "smpte240m"}
COLOR_RANGES = {1: "tv", 2: "pc"}


def missing() -> str | None:
    """None when PyAV can be imported, else why not (with the fix)."""
    try:
        import av  # noqa: F401
    except ImportError as exc:
        return f"PyAV is not installed ({exc}): pip install av"
    return None


def hwaccels() -> list[str]:
    """FFmpeg's hardware device types in PyAV's build (those its decoders can use where the hardware is)."""
    from av.codec.hwaccel import hwdevices_available

    return list(hwdevices_available())


def _metadata_options(version: str) -> dict:
    """PyAV before 19 decodes metadata strictly as UTF-8 unless told otherwise (a Latin-1 title failed the
    open); 19 removed the option (a TypeError for every file) and keeps undecodable bytes as surrogates."""
    return {"metadata_errors": "ignore"} if int(version.split(".")[0]) < 19 else {}


def _open(location: str, name: str, hwaccel: str | None = None):
    import av

    extra = _metadata_options(av.__version__)
    if hwaccel:
        from av.codec.hwaccel import HWAccel

        extra["hwaccel"] = HWAccel(hwaccel, allow_software_fallback=True)
    try:
        container = av.open(location, **extra)
    except (av.error.FFmpegError, OSError, UnicodeDecodeError) as exc:
        if hwaccel:  # the file itself opened without it (probed first): the device is what failed
            raise SourceError(f"source {name}: hwaccel {hwaccel}: cannot use it here ({str(exc)[:200]}): check "
                              f"the device and its driver, or leave hwaccel out") from None
        raise SourceError(f"cannot open {name}: {str(exc)[:200]} (is it a video FFmpeg can read?)") from None
    if not container.streams.video:
        container.close()
        raise SourceError(f"cannot open {name}: no video stream (is it a video FFmpeg can read?)")
    return container


def _declared_seconds(container, stream) -> float | None:
    """How long the file says its video lasts (the stream's duration, else the container's), if it says."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    return container.duration / 1e6 if container.duration else None


def frame_size(location: str, name: str) -> tuple[int, int] | None:
    """(height, width) of a file's video, from its header; None where it does not open."""
    try:
        container = _open(location, name)
    except SourceError:
        return None
    try:
        video = container.streams.video[0].codec_context
        return (video.height, video.width) if video.height and video.width else None
    finally:
        container.close()


def stream_format(stream) -> StreamFormat:
    context = stream.codec_context
    if not context.width or not context.height or context.format is None:
        raise SourceError("the video stream has no frame size or pixel format")
    rate = stream.average_rate or stream.guessed_rate or Fraction(0)
    return StreamFormat(codec=context.name, width=context.width, height=context.height,
                        pix_fmt=context.format.name, fps=float(rate),
                        color_space=COLOR_SPACES.get(int(context.colorspace), "unknown"),
                        color_range=COLOR_RANGES.get(int(context.color_range), "unknown"))


class PyAVSource:
    """A video file decoded in-process; every frame delivered (files wait for room), or paced with realtime."""

    memory = "host"
    live = False
    shares_thread = False  # a read decodes on the CPU: a thread of its own
    keeps_packets = True  # its demuxer's, as the container holds them

    def __init__(self, uri: SourceURI, loop: bool = False, realtime: bool = False, threads: int | None = None,
                 hwaccel: str | None = None):
        """threads: decoder threads (None: FFmpeg's choice, one per core); hwaccel: an FFmpeg hardware device
        type (hwaccels()) to decode with."""
        if uri.scheme != "file":
            raise JetpipeError(f"source {uri.text}: in-process decoding is for files; streams use the ffmpeg process")
        self.source_uri, self.uri, self.loop, self.realtime, self.threads = uri, uri.text, loop, realtime, threads
        self.hwaccel = hwaccel or None
        self.live = realtime  # paced like a camera: drop-oldest when processing falls behind
        self.decode_errors = 0
        self._container = self._packets = self._reformatter = None
        self._pending: list = []  # frames a packet gave beyond the first
        self._changed_to = None  # the layout frames changed to mid-file (scaled back), if they did
        self._layout = None  # (width, height, pixel format) of the first frame: what the slots get
        self._offset = self._last_pts = 0.0  # pts: seconds from the file's start, going on across loops
        self._start = None  # the stream's first timestamp (seconds)
        self._clock = None  # realtime: monotonic time of pts 0
        self._stopped = threading.Event()
        self.packet_ring = None  # clips.PacketRing: each demuxed packet kept there too (clips around events)
        if self.hwaccel and self.hwaccel not in hwaccels():
            raise JetpipeError(f"source {uri.text}: hwaccel {self.hwaccel!r}: PyAV's FFmpeg has "
                               f"{', '.join(hwaccels()) or 'none'}")
        try:  # a file that cannot be opened fails now, in one line, not in a reconnect loop
            container = _open(uri.location, uri.text)
            try:
                self.stream = stream_format(container.streams.video[0])
                self.bit_rate = float(container.bit_rate or 0)  # bits a second (0: not said): a clips ring's size
            finally:
                container.close()
            if self.hwaccel:  # and so does a device that cannot be used
                _open(uri.location, uri.text, self.hwaccel).close()
        except SourceError as exc:
            raise JetpipeError(str(exc)) from None
        self.info: FrameInfo = self.stream.frame_info(PYAV_NATIVE)  # the size; the layout comes with open()

    def describe(self) -> str:
        return f"{self.uri} (ffmpeg in-process{', ' + self.hwaccel if self.hwaccel else ''})"

    def open(self) -> FrameInfo:
        self.close()
        self._container = _open(self.source_uri.location, self.uri, self.hwaccel)
        stream = self._container.streams.video[0]
        if self.hwaccel:  # the device decodes: FFmpeg's frame threads only add hand-offs (halved the H100's rate)
            stream.thread_count = 1
        else:
            stream.thread_type = "AUTO"  # frame and slice threads
            stream.thread_count = self.threads or 0
        self._packets = self._container.demux(stream)
        self._start = float(stream.start_time * stream.time_base) if stream.start_time is not None else None
        self._declared = _declared_seconds(self._container, stream)
        first = self._next_frame()
        if first is None:
            raise EndOfStream(self.uri)  # not one decodable frame (the decode errors say why)
        self._pending.insert(0, first)
        if self._layout is None:
            self._take_layout(first)
        return self.info

    def _take_layout(self, frame) -> None:
        """The slots' layout is the first frame's (with hwaccel: what the device hands back, usually NV12)."""
        self._layout = (frame.width, frame.height, frame.format.name)
        decoded = replace(self.stream, width=frame.width, height=frame.height, pix_fmt=frame.format.name)
        self.info = decoded.frame_info(PYAV_NATIVE)
        self._writer = _writer_for(frame.format.name, self.info, self._to_nv12)
        # a frame the device decoded was downloaded into another layout (NV12, P010) than the software
        # decoder's; a stream it could not take comes in the software layout (is_hwaccel only says it was asked)
        hardware = bool(self.hwaccel) and frame.format.name != self.stream.pix_fmt
        how = f"{self.hwaccel} (hardware)" if hardware else "software"
        if self.hwaccel and not hardware:
            how += f": {self.hwaccel} cannot decode this stream ({self.stream.codec} {self.stream.pix_fmt})"
        log.log(logging.WARNING if self.hwaccel and not hardware else logging.INFO,
                "source %s: %s %dx%d %s %s range, decoded in-process by FFmpeg (PyAV, %s threads), %s", self.uri,
                self.info.format, self.info.width, self.info.height, self.info.standard, self.info.range,
                1 if self.hwaccel else self.threads or "auto", how)

    read_queued = read_whole  # the frame is in the slot when read_into returns
    tee_packets = not_teed  # its packets, where it keeps them, are demuxed in this process

    def read_into(self, slot: np.ndarray) -> float | None:
        frame = self._next_frame()
        if frame is None and self.loop and not self._stopped.is_set():
            self._offset = self._last_pts + (1.0 / self.info.fps if self.info.fps > 0 else 0.0)
            self.open()  # decode the file again; timestamps go on from where it ended
            frame = self._next_frame()
        if frame is None:
            if self.packet_ring is not None:
                self.packet_ring.end()  # clips waiting for later seconds are cut with what there is
            raise EndOfStream(self.uri)
        if (frame.width, frame.height, frame.format.name) != self._layout:
            frame = self._as_first_frames(frame)
        self._writer(frame, slot)
        pts = self._pts(frame)
        if self.realtime:
            self._pace(pts)
        return pts

    def _next_frame(self):
        """The next decoded frame, None at the end (or when interrupted). Decode errors are counted, not fatal."""
        import av

        while not self._pending:
            if self._stopped.is_set() or self._packets is None:
                return None
            try:
                packet = next(self._packets)
            except StopIteration:
                self._packets = None
                self._check_whole()
                return None
            except av.error.FFmpegError as exc:  # the container itself is damaged: what was read is all
                self._count(f"demuxing: {exc}")
                self._packets = None
                return None
            if self.packet_ring is not None and packet.size:
                self._keep(packet)
            try:
                self._pending = list(packet.decode())  # the last (empty) packet flushes the decoder
            except av.error.FFmpegError as exc:
                self._count(str(exc))
        frame = self._pending.pop(0)
        if getattr(frame, "is_corrupt", False):
            self._count("frame decoded with errors (concealed)")
        return frame

    def _check_whole(self) -> None:
        """At the file's end: frames that stop well before the duration its container declares are a truncated
        file (a copy cut short, a recording whose writer died), counted and said rather than ended as whole."""
        shown = self._last_pts - self._offset  # the last frame's time in this pass over the file
        frame_s = 1.0 / self.info.fps if self.info.fps > 0 else 0.04
        if self._declared and shown < self._declared - 2 * frame_s - 0.1:
            self._count(f"the file ends at {shown:.2f} s of the {self._declared:.2f} s its container declares: "
                        "truncated")

    def _keep(self, packet) -> None:
        """The packet into the clips' ring, its times on the frames' clock (shifted across loops as theirs).
        Floats, not the time base's Fractions: this runs for every packet. One packet in a few is timed
        (PacketRing.clock)."""
        ring = self.packet_ring
        started = ring.clock()
        if ring.time_base is None:  # the ring may come after open() (a stream added while serving)
            ring.time_base = packet.time_base
        seconds = float(ring.time_base)
        shift = round((self._offset - (self._start or 0.0)) / seconds)  # in the time base's units
        pts, dts = packet.pts, packet.dts
        pts = None if pts is None else pts + shift
        dts = None if dts is None else dts + shift
        at = pts if pts is not None else dts
        if at is not None:
            ring.add(Packet(at * seconds, bytes(packet), pts, dts, packet.duration or 0, packet.is_keyframe))
        ring.clocked(started)  # what keeping packets costs (the summary's clips.cpu_s)

    def _pts(self, frame) -> float | None:
        if frame.time is None:
            return None
        if self._start is None:
            self._start = frame.time
        self._last_pts = self._offset + frame.time - self._start
        return self._last_pts

    def _pace(self, pts: float | None) -> None:
        if pts is None:
            return
        now = time.monotonic()
        if self._clock is None:
            self._clock = now - pts
        self._stopped.wait(max(0.0, self._clock + pts - now))

    def _count(self, why: str) -> None:
        self.decode_errors += 1
        if worth_logging(self.decode_errors):
            log.warning("%s: decode error #%d: %s", self.describe(), self.decode_errors, why[:200])

    def _as_first_frames(self, frame):
        """A frame whose size or layout changed mid-file, scaled back to the stream's first (the ring slots are
        sized for it); each change counted once, so that it is seen."""
        layout, (width, height, pix_fmt) = (frame.width, frame.height, frame.format.name), self._layout
        if layout != self._changed_to:
            self._changed_to = layout
            self._count(f"frames changed to {frame.width}x{frame.height} {frame.format.name} mid-stream: scaled "
                        f"to {width}x{height} {pix_fmt}")
        return self._swscale(frame, format=pix_fmt, width=width, height=height)

    def _to_nv12(self, frame):
        """Layouts the kernel does not read (4:4:4, 10-bit): NV12 by swscale."""
        return self._swscale(frame, format="nv12")

    def _swscale(self, frame, **target):
        if self._reformatter is None:  # its scaling context is kept between frames
            from av.video.reformatter import VideoReformatter

            self._reformatter = VideoReformatter()
        return self._reformatter.reformat(frame, interpolation="AREA", **target)

    def interrupt(self) -> None:
        self._stopped.set()

    def restart(self) -> bool:
        """A file has no connection to end."""
        return False

    def close(self) -> None:
        self._packets, self._pending = None, []
        if self._container is not None:
            self._container.close()
            self._container = None


# --- frame -> slot: the decoder's planes, cropped to even sizes -----------------------------------------------

def _plane(frame, index: int, rows: int, row_bytes: int) -> np.ndarray:
    plane = frame.planes[index]
    pitch = plane.line_size
    return np.frombuffer(plane, np.uint8, count=rows * pitch).reshape(rows, pitch)[:, :row_bytes]


def _planes(fmt: str, h: int, w: int) -> list[tuple[int, int, int]]:
    """(plane index, rows, bytes per row) of each plane of an h x w frame of this format, in slot order."""
    if fmt == "i420":
        return [(0, h, w), (1, h // 2, w // 2), (2, h // 2, w // 2)]
    if fmt == "nv12":
        return [(0, h, w), (1, h // 2, w)]
    return [(0, h, 2 * w)]  # yuyv, uyvy: one packed plane


def _copy_planes(layout):
    """A writer copying planes (index, rows, bytes per row) one after another into the flat slot."""
    def write(frame, slot):
        flat, at = slot.reshape(-1), 0
        for index, rows, row_bytes in layout:
            np.copyto(flat[at:at + rows * row_bytes].reshape(rows, row_bytes), _plane(frame, index, rows, row_bytes))
            at += rows * row_bytes
    return write


def _repack_422_to_yuyv(h: int, w: int):
    def write(frame, slot):
        packed = slot.reshape(h, w // 2, 4)
        luma = _plane(frame, 0, h, w)
        packed[..., 0], packed[..., 2] = luma[:, 0::2], luma[:, 1::2]
        packed[..., 1], packed[..., 3] = _plane(frame, 1, h, w // 2), _plane(frame, 2, h, w // 2)
    return write


def _writer_for(pix_fmt: str, info: FrameInfo, to_nv12):
    """write(frame, slot) for frames of this pixel format; info.format (PYAV_NATIVE) says what the slot holds;
    to_nv12(frame): the conversion of layouts it does not know (4:4:4, 10-bit)."""
    if pix_fmt in REPACKED_422:
        return _repack_422_to_yuyv(info.height, info.width)
    copy = _copy_planes(_planes(info.format, info.height, info.width))
    if pix_fmt in PYAV_NATIVE:
        return copy
    return lambda frame, slot: copy(to_nv12(frame), slot)
