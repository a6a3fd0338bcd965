"""Any machine: FFmpeg decodes (files, RTSP, V4L2) into raw YUV in the stream's own layout, no colour conversion.

ffprobe tells the stream's pixel format, size, rate and colour metadata; ffmpeg
then writes frames as I420 (from yuv420p), NV12, YUYV or UYVY: the planes the
decoder produced, repacked at most (4:2:2 planar -> YUYV), never RGB. The GPU
kernel (or the CPU runtime's reference path) converts colour. Odd sizes lose
their last row/column (crop, still YUV): 4:2:0 needs even sizes.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import threading
from dataclasses import dataclass
from fractions import Fraction

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.ingest.sources.base import FrameInfo, SourceError
from jetpipe.pipelines.ingest.sources.pipe import DecoderProcess, DecoderRuns, PipeSource, started_with_copy
from jetpipe.uri import SourceURI

# decoder pixel format -> (jetpipe format, ffmpeg output format, range when the format implies one)
NATIVE = {
    "yuv420p": ("i420", "yuv420p", None), "yuvj420p": ("i420", "yuvj420p", "full"),
    "nv12": ("nv12", "nv12", None),
    "yuyv422": ("yuyv", "yuyv422", None), "uyvy422": ("uyvy", "uyvy422", None),
    # MJPEG cameras: 4:2:2 planar repacked to YUYV; swscale rescales full range to limited on the way
    "yuv422p": ("yuyv", "yuyv422", None), "yuvj422p": ("yuyv", "yuyv422", "limited"),
}
FALLBACK = ("nv12", "nv12", None)  # anything else (10-bit, 4:4:4): FFmpeg repacks to NV12, still YUV
BT601_SPACES = ("smpte170m", "bt470bg", "fcc", "smpte240m")
PROBE_TIMEOUT_S = 15


def tools_available() -> str | None:
    """None when ffmpeg and ffprobe are on PATH, else what is missing."""
    missing = [t for t in ("ffmpeg", "ffprobe") if shutil.which(t) is None]
    return f"{' and '.join(missing)} not found on PATH (apt install ffmpeg)" if missing else None


@dataclass(frozen=True)
class StreamFormat:
    codec: str
    width: int
    height: int
    pix_fmt: str
    fps: float
    color_space: str
    color_range: str
    bit_rate: float = 0.0  # bits a second where the container says (0: not said, as a network stream's)

    def frame_info(self, native: dict = NATIVE) -> FrameInfo:
        """What frames of this stream become; `native`: decoder pixel format -> (format, _, implied range)."""
        fmt, _, implied_range = native.get(self.pix_fmt, FALLBACK)
        if self.color_space == "bt709":
            standard = "bt709"
        elif self.color_space in BT601_SPACES:
            standard = "bt601"
        else:  # unspecified: HD is BT.709, SD is BT.601 (what players assume)
            standard = "bt709" if self.height >= 720 else "bt601"
        value_range = implied_range or ("full" if self.color_range in ("pc", "jpeg") else "limited")
        return FrameInfo(fmt, self.height // 2 * 2, self.width // 2 * 2, standard, value_range, self.fps)

    def output_pix_fmt(self) -> str:
        return NATIVE.get(self.pix_fmt, FALLBACK)[1]


def input_args(uri: SourceURI) -> list[str]:
    if uri.scheme in ("rtsp", "rtsps"):
        return ["-rtsp_transport", "tcp"]
    if uri.scheme == "v4l2":
        return ["-f", "v4l2"]
    return []


QUICK_START_SCHEMES = ("rtsp", "rtsps", "tcp", "udp", "srt")  # streaming_args: MPEG-TS or RTSP, streams known at open


def streaming_args(uri: SourceURI) -> list[str]:
    """Input options for an ffmpeg that passes a network stream on (decoding or remuxing it) and for the ffprobe
    before it: FFmpeg's default analysis held a TCP camera's MPEG-TS 5.2 s (an RTSP camera's 0.9 s) before the
    first frame came out, then gave the frames it had read all at once, more than a stream's queue holds (dropped
    as if the pipeline were overloaded, at every connection), and ffprobe took as long at every connection.
    -analyzeduration 1 ends the analysis once the stream's codec and format are known (ffprobe said the same size,
    pixel format and rate, 30/1, in 0.24 s against 5.2 s; RTSP 0.16-0.20 against 0.82 s); a camera joined between
    keyframes is opened at the next one, as before. Only where the streams are known when the input opens
    (MPEG-TS's tables, RTSP's session description): RTMP's FLV and HTTP's formats may make their video stream
    only when its first packet comes, so they keep FFmpeg's analysis."""
    return [*input_args(uri), "-analyzeduration", "1"] if uri.scheme in QUICK_START_SCHEMES else input_args(uri)


def probe(uri: SourceURI, started=None) -> StreamFormat:
    """The first video stream's format; SourceError (one line, naming the source and the cause) if unreadable.

    started(process) is called with the running ffprobe, so a stopping daemon can kill a hanging probe."""
    argv = ["ffprobe", "-v", "error", *streaming_args(uri), "-select_streams", "v:0", "-show_entries",
            "stream=codec_name,width,height,pix_fmt,avg_frame_rate,r_frame_rate,color_space,color_range,bit_rate",
            "-of", "json", uri.location]
    try:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
    except OSError as exc:
        raise SourceError(f"cannot run ffprobe for {uri.text} ({exc.strerror}): apt install ffmpeg") from None
    if started is not None:
        started(process)
    try:
        stdout, stderr = process.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise SourceError(f"cannot open {uri.text}: no answer within {PROBE_TIMEOUT_S} s") from None
    why = (stderr.strip().splitlines() or ["no video stream"])[-1]
    try:
        streams = json.loads(stdout or "{}").get("streams") or []
    except json.JSONDecodeError:
        streams = []
    if process.returncode != 0 or not streams or not streams[0].get("width"):
        raise SourceError(f"cannot open {uri.text}: {why[:200]} (is it a video FFmpeg can read?)")
    s = streams[0]
    return StreamFormat(codec=s.get("codec_name", "?"), width=int(s["width"]), height=int(s["height"]),
                        pix_fmt=s.get("pix_fmt", "?"), fps=_rate(s.get("avg_frame_rate"), s.get("r_frame_rate")),
                        color_space=s.get("color_space", "unknown"), color_range=s.get("color_range", "unknown"),
                        bit_rate=float(s["bit_rate"]) if str(s.get("bit_rate", "")).isdigit() else 0.0)


def _rate(*candidates) -> float:
    for text in candidates:
        try:
            value = Fraction(text or "0/0")
        except (ValueError, ZeroDivisionError):
            continue
        if value > 0:
            return float(value)
    return 0.0


LOW_DELAY_MAX_HEIGHT = 1088  # live streams up to 1080p (1088: coded height) decode without frame threads


class FFmpegSource(PipeSource):
    decoder_name = "ffmpeg"

    def __init__(self, uri: SourceURI, loop: bool = False, realtime: bool = False, threads: int | None = None):
        """threads: decoder threads of this stream's ffmpeg (None: FFmpeg's default, one per core)."""
        super().__init__(uri, loop, realtime)
        self.threads = threads
        self.stream: StreamFormat | None = None
        if uri.scheme == "file":  # a file that cannot be opened fails now, in one line, not in a reconnect loop
            try:
                self.info = self.probe()
            except SourceError as exc:
                raise JetpipeError(str(exc)) from None

    def probe(self) -> FrameInfo:
        self.stream = probe(self.source_uri, started=self._probing)
        return self.stream.frame_info()

    def restarts_itself(self) -> bool:
        return self.loop and self.source_uri.scheme == "file"

    @property
    def bit_rate(self) -> float:
        """Bits a second, where the container says (a clips ring's size); 0 where not (a network stream)."""
        return self.stream.bit_rate if self.stream is not None else 0.0

    def packet_codec(self) -> str:
        return self.stream.codec if self.stream is not None else "?"

    def _thread_args(self) -> list[str]:
        """The decoder's threads (many streams: a few each, not one per core each). A live stream up to 1080p is
        decoded without frame threads: FFmpeg's H.264 decoder gives a frame once threads - 1 more have come in, so
        each frame thread held a camera's frames one frame interval longer (8 frame threads: 405 ms behind the
        camera, 8 slice threads: 172 ms; 2-core CPU, a 1080p30 MPEG-TS camera over TCP, scripts/diag/
        camera_start.py), before the capture time the latency starts from. Slice threads hold none; one core
        decodes such a frame in a few ms (3.9 ms here). Files, and larger live streams, which one core may not
        keep up with, keep frame threads."""
        count = ["-threads", str(self.threads)] if self.threads else []
        if self.source_uri.live and self.stream is not None and self.stream.height <= LOW_DELAY_MAX_HEIGHT:
            return ["-thread_type", "slice", *count]
        return count

    def command(self, packets_fd: int | None = None) -> list[str]:
        info, stream = self.info, self.stream
        argv = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", *streaming_args(self.source_uri)]
        if self.realtime:
            argv.append("-re")
        if self.restarts_itself():
            argv += ["-stream_loop", "-1"]
        argv += self._thread_args()
        argv += ["-i", self.source_uri.location, "-map", "0:v:0", "-an", "-sn"]
        if (info.width, info.height) != (stream.width, stream.height):
            argv += ["-vf", f"crop={info.width}:{info.height}:0:0"]
        # avioflags direct: each frame goes to the pipe in one write, not copied through a 32 KiB buffer first
        argv += ["-vsync", "passthrough", "-f", "rawvideo", "-pix_fmt", stream.output_pix_fmt(),
                 "-avioflags", "direct", "pipe:1"]
        if packets_fd is not None:  # a second output: the packets as they are (clips)
            argv += ["-map", "0:v:0", "-an", "-sn", "-dn", "-c:v", "copy", "-f", "mpegts", "-flush_packets", "1",
                     f"pipe:{packets_fd}"]
        return argv


# An RTSP camera's first packet may come without a decoding time (H.264 with B-frames: FFmpeg 5.1 gave gst-rtsp-server's
# first one none); the MPEG-TS muxer refuses it ("first pts and dts value must be set") and the remux ended at every
# connection: such a camera never reached NVDEC. setts fills a missing time with the other (FFmpeg 4.4 on). It holds
# each packet until the next has come (a frame interval: 134 against 101 ms behind a TCP camera), so only RTSP, whose
# packets' times come from RTP, gets it; an MPEG-TS stream carries each PES's times.
FILL_TIMES = "setts=dts=if(eq(DTS\\,NOPTS)\\,PTS\\,DTS):pts=if(eq(PTS\\,NOPTS)\\,DTS\\,PTS)"
FILL_TIMES_SCHEMES = ("rtsp", "rtsps")


@functools.cache
def has_bitstream_filter(name: str) -> bool:
    """Whether this machine's ffmpeg has the bitstream filter (asked once)."""
    try:
        listed = subprocess.run(["ffmpeg", "-hide_banner", "-bsfs"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return name in listed.stdout.split()


def remux_command(uri: SourceURI, copy_fd: int | None = None) -> list[str]:
    """ffmpeg copying a network stream's video packets into MPEG-TS on stdout: no decoding, timestamps kept.
    copy_fd: the same MPEG-TS also to this pipe (another process's: a recording's), through FFmpeg's tee muxer:
    one muxer's packets twice, so both carry the same timestamps, and the copy's reader may go (its process
    ended: said once on stderr) while the stream goes on."""
    argv = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", *streaming_args(uri), "-i", uri.location,
            "-map", "0:v:0", "-an", "-sn", "-dn", "-c:v", "copy"]
    if uri.scheme in FILL_TIMES_SCHEMES and has_bitstream_filter("setts"):
        argv += ["-bsf:v", FILL_TIMES]
    # each PES of up to 64 KB says its length (FFmpeg omits a video one's by default): the demuxer NVDEC reads has such
    # a frame whole when its last byte comes, not when the next frame's first comes, a frame interval later
    if copy_fd is None:
        return [*argv, "-f", "mpegts", "-flush_packets", "1", "-omit_video_pes_length", "0", "pipe:1"]
    return [*argv, "-f", "tee", "[f=mpegts:flush_packets=1:omit_video_pes_length=0]pipe\\:1|"
            f"[f=mpegts:flush_packets=1:onfail=ignore]pipe\\:{copy_fd}"]


class RemuxFeed(DecoderRuns):
    """The bytes of a network stream for a hardware decoder's demuxer, from an ffmpeg that only remuxes.

    FFmpeg speaks the protocol (RTSP over TCP, reconnects are the daemon's); the demuxer reads MPEG-TS
    through fill(). A connect that hangs blocks in a pipe read (GIL released) that interrupt() ends by
    killing the process: a demuxer reading the network itself could not be stopped. Where a recording takes
    the stream's packets from the ffmpeg too (tee_packets), each connection's ffmpeg also writes them to a
    pipe of the recording's."""

    def __init__(self, uri: SourceURI):
        self.uri = uri
        self.received = 0  # bytes of this connection
        self._lock = threading.Lock()
        self._connected = False  # a connection was started: a tee set now would miss its packets
        self._tee = None         # a TeePipe (recording/process.py): open_pipe(), started(), failed()

    def tee_packets(self, tee) -> bool:
        """Each connection's packets also to `tee`'s pipe, from the next connection on; False where a connection
        was started already (its packets until the next would be missing: the caller keeps them another way)."""
        with self._lock:
            if self._connected:
                return False
            self._tee = tee
            return True

    def start(self) -> None:
        self._end_process()
        self.received = 0
        with self._lock:
            self._connected, tee = True, self._tee
        name = f"{self.uri.text} (remux)"
        self._process = started_with_copy(tee, lambda fd, fds: DecoderProcess(
            remux_command(self.uri, fd), 0, name, pass_fds=fds))

    def fill(self, buffer) -> int:
        """The demuxer's read (runtime.nvdec_pipe.FeedReader hands it a buffer of its own): bytes written into `buffer`,
        0 at the end of the stream."""
        got = self._process.read_chunk(buffer) if self._process is not None else 0
        self.received += got
        return got

    def why(self) -> str:
        return self._process.why() if self._process else "not started"

    def interrupt(self) -> None:
        if self._process is not None:
            self._process.interrupt()

    def stop(self) -> None:
        self._end_process()
