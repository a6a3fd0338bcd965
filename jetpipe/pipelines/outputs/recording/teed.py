"""A stream's packets straight from the process that receives them to the recording process, past the serving
process (Source.tee_packets): an NVDEC network stream's remux ffmpeg writes its MPEG-TS twice, once for NVDEC's
demuxer, once to a pipe whose read end goes to the recording process, which demuxes it there with PyAV. A stream
a decoder process decodes (FFmpeg, a Jetson's GStreamer: sources/pipe.py) has that decoder write its packets to
the pipe (the second output packet_tap.py reads where clips keep them); its frames count from 0 at the run's
first keyframe, so the recording's copy is counted from there too (`from_first_key`).

Why: the packets a source's thread copies into an arena (ingest/packet_arena.py) cost the serving process 22 us a
packet, 2.0 % of its CPU with 16 busy 1080p30 NVDEC streams on an H100 (issue 67 asks for 1 %), and PyNvVideoCodec
gives every packet in one object whose fields it changes in place, so nothing of that copy can leave the
source's thread. A packet the serving process never touches costs it nothing.

The two copies come from one muxer (FFmpeg's tee), so the recording's packets carry the same timestamps as the
ones NVDEC decodes: the frames' clock, as NVDEC's demuxer reads it (the stream's own, not counted from 0). Each
connection (a reconnect starts a new ffmpeg) gets a new pipe; its reader takes over the stream's ring once the
last connection's reader ended. The pipe is always read to its end: an unread pipe would stop the ffmpeg, and
with it the stream's frames (its buffer is PIPE_BYTES, about a second of a busy 1080p stream, for a recording
process that is slow to be scheduled). If the recording process goes, the copy's writer must not fail: the
remux ffmpeg's tee drops the copy (onfail=ignore), and for any writer the serving process keeps its own read end
of each connection's pipe, unread while the recording process reads, and drains it to its end once that process
is gone (RecordingProcess.watch); a new connection then gets no pipe.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from multiprocessing.reduction import send_handle

from jetpipe.pipelines.ingest.sources.packet_tap import ANNEXB_CODECS, demuxed, read_to_end
from jetpipe.pipelines.ingest.sources.pipe import F_SETPIPE_SZ, PIPE_BYTES

log = logging.getLogger(__name__)

JOIN_S = 5.0  # a connection's reader ends at its pipe's end, once its ffmpeg exited


class TeePipe:
    """The serving process's side: a new pipe for each connection of the stream (its source's capture thread),
    the read end sent to the recording process after the process that writes to it started."""

    def __init__(self, recording, stream_id: int):
        """recording: the RecordingProcess (its connection, its lock for sending, its process, its watch)."""
        self.recording, self.stream_id = recording, stream_id
        self._read_fd: int | None = None
        self._write_fd: int | None = None
        self._kept: int | None = None  # the last connection's read end, kept here (drained if the recording goes)
        self.said = False

    def open_pipe(self) -> int | None:
        """The pipe for the next connection; the end its writer writes to (passed to it); None where the recording
        process is gone (the connection goes without a copy)."""
        self._close_fds()
        if not self.recording.process.is_alive():
            self._say("the recording process is gone")
            return None
        self._read_fd, self._write_fd = os.pipe()
        with contextlib.suppress(OSError):
            fcntl.fcntl(self._write_fd, F_SETPIPE_SZ, PIPE_BYTES)
        return self._write_fd

    def started(self, from_first_key: bool = False) -> None:
        """The writer holds the write end now: this process's copy closes, and the read end goes to the recording
        process, its copy kept here (watched: drained once the recording process is gone, so that the writer
        never fails on it). from_first_key: the packets are counted from the connection's first keyframe (the
        frames of a decoder process are)."""
        os.close(self._write_fd)
        self._write_fd = None
        recording = self.recording
        try:
            with recording.send_lock:
                recording.conn.send(("tee", self.stream_id, from_first_key))
                send_handle(recording.conn, self._read_fd, recording.process.pid)
        except (OSError, ValueError) as exc:
            self._say(f"it cannot be sent there ({exc})")
        self._kept, self._read_fd = self._read_fd, None
        recording.watch(self)

    def failed(self) -> None:
        """The writer did not start: the pipe goes."""
        self._close_fds()

    def drain(self) -> None:
        """The recording process is gone: the kept read end is read to its end here (its writer goes on)."""
        fd, self._kept = self._kept, None
        if fd is not None:
            threading.Thread(target=_drained, args=(fd,), name=f"tee-drain-{self.stream_id}", daemon=True).start()

    def _say(self, why: str) -> None:
        if not self.said:
            self.said = True
            log.warning("stream %d: its packets do not reach the recording process: %s", self.stream_id, why)

    def _close_fds(self) -> None:
        for fd in (self._read_fd, self._write_fd, self._kept):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._read_fd = self._write_fd = self._kept = None


def _drained(fd: int) -> None:
    read_to_end(fd)
    with contextlib.suppress(OSError):
        os.close(fd)


class TeedPackets:
    """The recording process's side: one connection's pipe, demuxed into the stream's ring (child.ForwardedRing)
    by a thread of its own; at the pipe's end, the ring's last GOP is whole (the connection ended)."""

    def __init__(self, fd: int, ring, name: str, before: TeedPackets | None = None, from_first_key: bool = False):
        """before: the stream's last connection's reader (it ends first: the ring never takes two connections'
        packets interleaved); from_first_key: the packets' clock starts at the connection's first keyframe."""
        self.ring, self.name, self.from_first_key = ring, name, from_first_key
        self.thread = threading.Thread(target=self._run, args=(fd, before), name=f"tee-{name}", daemon=True)
        self.thread.start()

    def join(self, timeout: float = JOIN_S) -> None:
        self.thread.join(timeout)

    def _run(self, fd: int, before: TeedPackets | None) -> None:
        if before is not None:
            before.join()
        try:
            self._keep(fd)
        except Exception as exc:  # noqa: BLE001 (PyAV's errors, a broken stream: the stream goes on unrecorded)
            log.warning("stream %s: its packets could not be read (%s)", self.name, exc)
        finally:
            read_to_end(fd)  # the writer must never wait on this pipe
            with self.ring.adding:
                self.ring.close_gop()
            os.close(fd)  # (after: a closed pipe says its packets are all in the ring)

    def _keep(self, fd: int) -> None:
        """Demuxed by FFmpeg's own pipe protocol (its reads in C, the GIL released while it waits)."""
        import av

        ring = self.ring
        with av.open(f"pipe:{fd}", format="mpegts") as container:
            stream = container.streams.video[0]
            codec = stream.codec_context.name
            if codec not in ANNEXB_CODECS:
                log.warning("stream %s: not recorded: its codec (%s) is not H.264 or HEVC", self.name, codec)
                return
            with ring.adding:
                ring.time_base, ring.annexb = stream.time_base, codec
            for packet in demuxed(container, stream, self.from_first_key):
                with ring.adding:
                    ring.add(packet)
