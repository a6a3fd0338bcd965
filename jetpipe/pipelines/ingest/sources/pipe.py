"""Decoder subprocesses (ffmpeg, gst-launch-1.0) writing raw YUV frames to a pipe, read straight into ring slots.

The decoder runs in its own process (its own cores, no GIL); this side only
copies bytes from the pipe into the slot the frame goes to: no per-frame
allocation, no colour conversion. Its stderr is drained by a thread and every
line counted as a decode error (the decoders run at error level), logged with
the source's name at the 1st, 10th, 100th, ... occurrence.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import shlex
import subprocess
import threading
from collections import deque

import numpy as np

from jetpipe.errors import worth_logging
from jetpipe.frames import frame_shape
from jetpipe.pipelines.ingest.sources import packet_tap
from jetpipe.pipelines.ingest.sources.base import EndOfStream, FrameInfo, SourceError, read_whole
from jetpipe.pipelines.ingest.sources.packet_tap import PacketTap

log = logging.getLogger(__name__)

F_SETPIPE_SZ = 1031  # Linux: larger pipe buffer, fewer read() calls per frame
PIPE_BYTES = 1 << 20


class DecoderProcess:
    """One run of a decoder command; read_frame() fills a slot with exactly one frame."""

    def __init__(self, argv: list[str], frame_bytes: int, name: str, pass_fds: tuple[int, ...] = ()):
        """pass_fds: more pipes the decoder writes to (named in argv by their numbers)."""
        self.argv, self.frame_bytes, self.name = argv, frame_bytes, name
        self.errors, self.recent = 0, deque(maxlen=5)
        self.interrupted = False
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, bufsize=0, start_new_session=True,
                                         pass_fds=pass_fds)
        except OSError as exc:
            raise SourceError(f"{name}: cannot start {argv[0]} ({exc.strerror})") from None
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.proc.stdout.fileno(), F_SETPIPE_SZ, PIPE_BYTES)
        self._stderr = threading.Thread(target=self._drain_stderr, name=f"{name}-stderr", daemon=True)
        self._stderr.start()

    def _drain_stderr(self) -> None:
        for raw in iter(self.proc.stderr.readline, b""):
            line = raw.decode(errors="replace").strip()
            if not line or self.interrupted:  # what a decoder says while being stopped is no decode error
                continue
            self.errors += 1
            self.recent.append(line)
            if worth_logging(self.errors):
                log.warning("%s: decode error #%d: %s", self.name, self.errors, line[:200])

    def read_frame(self, slot: np.ndarray) -> bool:
        """True when a whole frame was read into `slot`; False at the end of the stream."""
        view = memoryview(slot).cast("B")
        filled = 0
        while filled < self.frame_bytes:
            got = self.proc.stdout.readinto(view[filled:self.frame_bytes])
            if not got:
                break
            filled += got
        if filled == self.frame_bytes:
            return True
        if filled and not self.interrupted:
            self.errors += 1
            self.recent.append(f"last frame truncated ({filled} of {self.frame_bytes} bytes)")
        return False

    def read_chunk(self, buffer) -> int:
        """Whatever the decoder has written, up to len(buffer) bytes (0 at the end): for byte streams that
        another parser splits (a hardware decoder's demuxer). The GIL is released while the pipe is empty."""
        try:
            return self.proc.stdout.readinto(buffer) or 0
        except (OSError, ValueError):  # closed under us by interrupt()/close()
            return 0

    def finish(self) -> int | None:
        """Wait for the decoder to exit after the end of its output; its exit code (None: did not exit)."""
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        self._stderr.join(timeout=1)
        return code

    def why(self) -> str:
        return self.recent[-1] if self.recent else "no message"

    def interrupt(self) -> None:
        self.interrupted = True
        self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    def close(self) -> None:
        self.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()
        self._stderr.join(timeout=1)


def started_with_copy(tee, start, from_first_key: bool = False):
    """start(fd, pass_fds) -> a process writing a copy of its packets to fd (None: no copy; pass_fds: the fds it
    is given), given the pipe `tee` (a recording's TeePipe: open_pipe(), started(), failed(); None: none) opens
    for this run."""
    fd = tee.open_pipe() if tee is not None else None
    if fd is None:
        return start(None, ())
    try:
        process = start(fd, (fd,))
    except BaseException:
        tee.failed()
        raise
    tee.started(from_first_key)
    return process


class DecoderRuns:
    """A decoder subprocess that is started again and again (loops, reconnects): the current run and the
    errors of the runs that ended."""

    _process: DecoderProcess | None = None
    _past_errors = 0

    @property
    def decode_errors(self) -> int:
        return self._past_errors + (self._process.errors if self._process else 0)

    def _end_process(self) -> None:
        if self._process is not None:
            self._past_errors += self._process.errors
            self._process.close()
            self._process = None

    def restart(self) -> bool:
        """End the current run (a live stream that stalled): the read in progress fails and the daemon
        reconnects. Unlike interrupt(), the source opens again."""
        process = self._process
        if process is not None:
            process.interrupt()
        return True


class PipeSource(DecoderRuns):
    shares_thread = False  # a read waits for its process's pipe
    """A source whose frames come from a decoder subprocess; subclasses say which command and format.

    Files end (EndOfStream) or restart when looping; live sources raise
    SourceError at the end so the daemon reconnects with backoff.
    """

    memory = "host"
    decoder_name = "decoder"
    keeps_packets = True  # its decoder also writes them to a pipe (packet_tap); codecs a clip cannot take: said

    def __init__(self, uri, loop: bool = False, realtime: bool = False):
        self.source_uri, self.uri, self.loop, self.realtime = uri, uri.text, loop, realtime
        self.live = uri.live or realtime  # paced sources drop their oldest frame when processing falls behind
        self.info: FrameInfo | None = None
        self._index = 0
        self._interrupted = False
        self._probe_process = None  # a running probe (ffprobe): killed by interrupt()
        self._tap: PacketTap | None = None  # where clips keep the packets (packet_tap)
        self.packet_ring = None  # clips.PacketRing: the stream's packets, copied by its decoder (packet_tap)
        self._tee_lock = threading.Lock()
        self._ran = False        # a decoder run was started: a tee set now would miss its packets
        self._tee = None         # a recording's TeePipe: each run's packets to its pipe (tee_packets)

    def _probing(self, process) -> None:
        self._probe_process = process
        if self._interrupted:
            process.kill()

    # subclasses
    def command(self, packets_fd: int | None = None) -> list[str]:
        """The decoder's argv; with packets_fd, it also writes the stream's packets, untouched, as MPEG-TS to
        that pipe (sources that can: keeps_packets)."""
        raise NotImplementedError

    def probe(self) -> FrameInfo:
        raise NotImplementedError

    def restarts_itself(self) -> bool:
        """The command loops the file by itself (ffmpeg -stream_loop)."""
        return False

    def describe(self) -> str:
        return f"{self.uri} ({self.decoder_name})"

    def open(self) -> FrameInfo:
        self._end_process()
        if self.info is None or self.source_uri.live:
            self.info = self.probe()
        if self._interrupted:
            raise SourceError(f"{self.uri}: stopped")
        size = int(np.prod(frame_shape(self.info.format, self.info.height, self.info.width)))
        self._process = self._start_process(size)
        self._index = 0
        log.info("source %s: %s %dx%d %s %s range: %s", self.uri, self.info.format, self.info.width,
                 self.info.height, self.info.standard, self.info.range, shlex.join(self._process.argv))
        return self.info

    def _start_process(self, frame_bytes: int) -> DecoderProcess:
        """This run's decoder; where clips keep the stream's packets (packet_ring set on a source that can copy
        them), it also writes them to the tap's pipe; where a recording takes them (tee_packets), to its pipe."""
        with self._tee_lock:
            self._ran, tee = True, self._tee
        if tee is not None:
            codec = self.packet_codec()
            if codec not in packet_tap.ANNEXB_CODECS:
                log.warning("source %s: not recorded: its codec (%s) is not H.264 or HEVC", self.uri, codec)
                self._tee = None
            else:
                return started_with_copy(tee, lambda fd, fds: DecoderProcess(
                    self.command(packets_fd=fd), frame_bytes, self.describe(), pass_fds=fds), from_first_key=True)
        tap = self._packet_tap()
        if tap is None or not tap.takes(self.packet_codec()):
            return DecoderProcess(self.command(), frame_bytes, self.describe())
        fd = tap.open_pipe()
        try:
            process = DecoderProcess(self.command(packets_fd=fd), frame_bytes, self.describe(), pass_fds=(fd,))
        except BaseException:
            tap.failed()
            raise
        tap.started(self.packet_codec())
        return process

    def packet_codec(self) -> str:
        """The stream's codec, ffprobe's name (what a tap takes: H.264, HEVC)."""
        return "?"

    def _packet_tap(self) -> PacketTap | None:
        if self.packet_ring is None:
            return None
        if self._tap is None:
            why = packet_tap.missing()
            if why is not None:
                log.warning("source %s: no clips: %s", self.uri, why)
                self.packet_ring = None
                return None
            self._tap = PacketTap(self.packet_ring, self.uri)
        return self._tap

    read_queued = read_whole  # the frame is in the slot when read_into returns

    def tee_packets(self, tee) -> bool:
        """Each decoder run's packets also to `tee`'s pipe (its second output), from the next run on; False where
        a run was started already, or clips keep the packets here (the decoder writes one copy: the tap's)."""
        with self._tee_lock:
            if self._ran or self.packet_ring is not None or not self.keeps_packets:
                return False
            self._tee = tee
            return True

    def read_into(self, slot: np.ndarray) -> float | None:
        while True:
            if self._process.read_frame(slot):
                self._index += 1
                return (self._index - 1) / self.info.fps if self.info.fps > 0 else None
            self._stream_ended()
            if self._interrupted or not self.loop or self.source_uri.live or self.restarts_itself():
                break
            self.open()  # loop a file: decode it again
        if self.source_uri.live:
            raise SourceError(f"{self.uri}: stream ended ({self._process.why()})")
        raise EndOfStream(self.uri)

    def _stream_ended(self) -> None:
        process = self._process
        code = process.finish()
        if code not in (0, None) and not process.interrupted:
            process.errors += 1
            log.warning("source %s: %s exited with code %s after %d frames: %s", self.uri, self.decoder_name,
                        code, self._index, process.why())

    def restart(self) -> bool:
        """End the current connection, also while it is being probed (a camera that accepts the connection and
        sends nothing hangs ffprobe): the open or read in progress fails and the daemon reconnects."""
        if self._probe_process is not None and self._probe_process.poll() is None:
            self._probe_process.kill()
        return super().restart()

    def interrupt(self) -> None:
        self._interrupted = True
        if self._probe_process is not None and self._probe_process.poll() is None:
            self._probe_process.kill()
        if self._process is not None:
            self._process.interrupt()

    def close(self) -> None:
        self._end_process()
        if self._tap is not None:
            self._tap.close()
