"""The compressed packets of a stream a decoder subprocess decodes, for the clips' ring (pipelines/outputs/clips).

The decoder that decodes the stream also writes its video packets, untouched, as MPEG-TS to a second pipe: an
ffmpeg through a second output (`-c:v copy`: no decode, no encode), a Jetson's GStreamer pipeline through a tee
after its parser (sources/gstreamer.py). A thread of the source's own demuxes them with PyAV and keeps each in
the ring. MPEG-TS carries H.264 and HEVC in Annex B, with the parameter sets before each keyframe, so the ring
takes them as it takes NVDEC's demuxer's. The frames of a decoder run count from 0 at its first frame, which
is its first keyframe: the packets' clock starts there too. A reconnect starts both again from 0, and the
ring starts again (its clock went back).

The pipe is always read to its end, even where a packet cannot be kept: an unread pipe would stop the decoder,
and with it the stream's frames.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time

from jetpipe.video import Packet

log = logging.getLogger(__name__)

ANNEXB_CODECS = ("h264", "hevc")  # what a clip of MPEG-TS packets is cut from (clips.cut: Annex B)
READ_BYTES = 1 << 16
JOIN_S = 5.0  # the thread ends at the pipe's end, once its decoder exited


def read_to_end(fd: int) -> None:
    """The pipe read to its end, what is left of it thrown away: its writer must never wait on it."""
    with contextlib.suppress(OSError):
        while os.read(fd, READ_BYTES):
            pass


def demuxed(container, stream, from_first_key: bool = True):
    """The stream's packets as a ring keeps them; from_first_key: only from its first keyframe on, their times
    counted from it (as a decoder process's frames are: the frames before were not decoded), else on the
    stream's own clock."""
    base, first = stream.time_base, None if from_first_key else 0
    for p in container.demux(stream):
        at = p.pts if p.pts is not None else p.dts
        if not p.size or at is None:
            continue
        if first is None:
            if not p.is_keyframe:
                continue
            first = at
        yield Packet(float((at - first) * base), bytes(p), None if p.pts is None else p.pts - first,
                     None if p.dts is None else p.dts - first, p.duration or 0, p.is_keyframe)


def missing() -> str | None:
    """None where the packets can be read (PyAV imports), else why not, with the fix."""
    try:
        import av  # noqa: F401
    except ImportError:
        return "the packets a decoder process copies are read with PyAV, which is not installed: pip install av"
    return None


class PacketTap:
    def __init__(self, ring, name: str):
        """ring: the stream's clips.PacketRing; name: the source, for the log."""
        self.ring, self.name = ring, name
        self.write_fd: int | None = None
        self._read_fd: int | None = None
        self.thread: threading.Thread | None = None
        self.said = False

    def takes(self, codec: str) -> bool:
        """Whether a stream of this codec (ffprobe's name) has packets a clip is cut from (said once where not:
        raw video, MJPEG)."""
        if codec in ANNEXB_CODECS:
            return True
        self._say(f"its codec ({codec}) is not H.264 or HEVC")
        return False

    def open_pipe(self) -> int:
        """A new pipe for the decoder's next run; the end it writes to (passed to the process). The last run's
        reader ends first (its process is gone: its pipe's end is near), so that the ring never takes the two
        runs' packets interleaved."""
        if self.thread is not None:
            self.thread.join(JOIN_S)
        self._close_fds()
        self._read_fd, self.write_fd = os.pipe()
        return self.write_fd

    def started(self, codec: str) -> None:
        """The decoder's run holds its end now: this process's copy closes (its exit is the pipe's end), and the
        packets are read. codec: the stream's, one it takes()."""
        os.close(self.write_fd)
        self.write_fd = None
        fd, self._read_fd = self._read_fd, None
        self.thread = threading.Thread(target=self._run, args=(fd, codec), name=f"{self.name}-packets", daemon=True)
        self.thread.start()

    def failed(self) -> None:
        """The decoder's run did not start: the pipe goes."""
        self._close_fds()

    def close(self) -> None:
        self._close_fds()
        if self.thread is not None:
            self.thread.join(JOIN_S)

    def _close_fds(self) -> None:
        for fd in (self.write_fd, self._read_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.write_fd = self._read_fd = None

    def _run(self, fd: int, codec: str) -> None:
        try:
            self._keep(fd, codec)
        except Exception as exc:  # noqa: BLE001 (PyAV's errors, a broken stream: the frames go on)
            self._say(f"its packets could not be read ({exc})")
        finally:
            read_to_end(fd)  # the decoder must never wait on this pipe
            os.close(fd)

    def _keep(self, fd: int, codec: str) -> None:
        """Demuxed by FFmpeg's own pipe protocol (its reads in C, the GIL released while it waits: through a
        Python file object, every read was a Python call). The thread's whole time is the ring's cpu_s."""
        import av

        last = time.thread_time()
        with av.open(f"pipe:{fd}", format="mpegts") as container:
            stream = container.streams.video[0]
            ring = self.ring
            if ring.time_base is None:
                ring.time_base, ring.annexb = stream.time_base, codec
            for packet in demuxed(container, stream):
                ring.add(packet)
                now = time.thread_time()
                ring.cpu_s += now - last  # demuxing and keeping: all this thread does
                last = now

    def _say(self, why: str) -> None:
        if not self.said:
            self.said = True
            log.warning("source %s: no clips: %s", self.name, why)
