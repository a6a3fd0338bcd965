"""Desktop NVIDIA GPUs: NVDEC through PyNvVideoCodec, NV12 in device memory straight into device ring slots.

The decoded picture never touches host memory. PyNvVideoCodec hands out its
output surface, valid until the next Decode call; the source copies it
device-to-device into the ring slot the frame goes to (a few microseconds for
1080p) on its own stream, and the preprocessing kernel reads it there. The
capture thread does not wait for that copy (read_queued): the frame carries an
event that the kernel's stream waits for, and the source waits for it only
before its decoder's next picture, a frame period later.
Optional (`pip install pynvvideocodec`): without it, on a Jetson (GStreamer's
nvv4l2decoder serves there), or for a file NVDEC cannot take (not 8-bit 4:2:0,
a codec the GPU lacks), open_nvdec() says why and returns None, and the caller
decodes with FFmpeg.

Network streams come through a feed: an ffmpeg that only remuxes their packets
into MPEG-TS, demuxed by PyAV from its pipe (nvdec_pipe.py). Nothing is
opened until open() runs in the stream's capture thread (a camera that does not
answer never holds up start-up), interrupt() ends a connect that hangs, and a
stream NVDEC turns out not to take is decoded by the fallback (FFmpeg, host
memory) and copied into the same device slots, said in the log.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque

import numpy as np

from jetpipe.errors import JetpipeError, worth_logging
from jetpipe.frames import frame_shape
from jetpipe.runtime.nvdec_packets import DemuxedPackets
from jetpipe.runtime.nvdec_pipe import PipeDemuxer
from jetpipe.uri import NETWORK_SCHEMES, SourceURI
from jetpipe.video import EndOfStream, FrameInfo, SourceError, file_bit_rate

log = logging.getLogger(__name__)


def import_nvdec():
    try:
        import PyNvVideoCodec as nvc
    except ImportError:
        return None
    return nvc


def decodes_to_device(runtime) -> bool:
    """Whether NVDEC decodes into the runtime's GPU memory (a discrete GPU with PyNvVideoCodec): the sources
    then take hardware_decoder(runtime)."""
    return runtime.device is not None and not runtime.device.integrated and import_nvdec() is not None


def hardware_decoder(runtime):
    """What opens a source that decodes on the runtime's GPU into device memory: open(uri, loop, realtime,
    feed, fallback) -> an NvdecSource or None (logged why); None where the runtime has no GPU. feed: a network
    stream's bytes (ffmpeg.RemuxFeed); fallback(): a host-memory source for a network stream the hardware turns
    out not to take."""
    if runtime.device is None:
        return None
    return functools.partial(open_nvdec, runtime.device)


def open_nvdec(device, uri: SourceURI, loop: bool = False, realtime: bool = False, feed=None, fallback=None):
    """An NvdecSource for a video file or (given its feed) a network stream, or None (logged why) where
    NVDEC cannot serve it. A file is opened now, so one NVDEC cannot take falls back at once."""
    if uri.scheme != "file" and not (uri.scheme in NETWORK_SCHEMES and feed is not None):
        return None
    if device.integrated:
        log.debug("source %s: integrated GPU, NVDEC is reached through GStreamer's nvv4l2decoder", uri.text)
        return None
    nvc = import_nvdec()
    if nvc is None:
        log.info("source %s: NVDEC needs PyNvVideoCodec (pip install pynvvideocodec): decoding with FFmpeg", uri.text)
        return None
    try:
        return NvdecSource(device, nvc, uri, loop, realtime, feed=feed, fallback=fallback)
    except Exception as exc:  # unsupported codec / chroma / bit depth, unreadable file: FFmpeg says more
        log.warning("source %s: NVDEC cannot decode it (%s): decoding with FFmpeg", uri.text, first_line(exc))
        return None


def display_latency(nvc, live: bool) -> dict:
    """CreateDecoder's display latency for a stream: a live one's frames as soon as they can be shown (LOW). The
    default (NATIVE, "a latency of 4 frames" in PyNvVideoCodec's words) gives a frame out only after more packets
    have come in: for a camera, frame intervals before jetpipe's capture time, where its latency is counted from.
    A file keeps the default ({}), as does a PyNvVideoCodec without the setting."""
    kinds = getattr(nvc, "DisplayDecodeLatencyType", None)
    if not live or kinds is None or not hasattr(kinds, "LOW"):
        return {}
    return {"latency": kinds.LOW}


def first_line(exc: Exception) -> str:
    """What an exception says in one line; PyNvVideoCodec's own say it on an "Error Type :" line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Error Type")), None)
    return (said or (lines[0] if lines else type(exc).__name__))[:200]


class Unsupported(JetpipeError):
    """A stream NVDEC cannot decode (chroma, bit depth, codec): FFmpeg should."""


def _standard(text: str, height: int) -> str:
    text = text.lower()
    if "709" in text:
        return "bt709"
    if any(code in text for code in ("601", "470", "170")):
        return "bt601"
    return "bt709" if height >= 720 else "bt601"  # unspecified: what players assume


def _range(text: str) -> str:
    return "full" if any(word in text.lower() for word in ("full", "jpeg", "pc")) else "limited"


class NvdecSource:
    """A source whose frames NVDEC decodes into device memory (ring slots are DeviceSlots)."""

    memory = "device"
    decoder_name = "nvdec"
    paced_by_caller = False  # set by a shared capture thread: it waits for due_in(), read_into does not sleep
    keeps_packets = True  # its demuxer's (H.264 / HEVC; said where the codec is another)

    def __init__(self, device, nvc, uri: SourceURI, loop: bool = False, realtime: bool = False, feed=None,
                 fallback=None):
        self.device, self.nvc, self.source_uri, self.uri = device, nvc, uri, uri.text
        self.loop, self.realtime, self.live = loop, realtime, uri.live or realtime
        self.feed, self.fallback = feed, fallback
        self._decode_errors = 0
        self._interrupted = False
        self._decoder = self._demuxer = None
        self._host = None          # the fallback source, once NVDEC turned out not to take the stream
        self._staging = None       # pinned host frame the fallback decodes into, copied to the slot
        self.info = None
        self.packet_ring = None  # clips.PacketRing / a recording's arena: each demuxed packet kept there too
        self._tee = None          # a recording's TeePipe the feed's ffmpeg writes to (the fallback's too)
        self._kept = DemuxedPackets(uri.text)  # the packets into it (and the opening's, for a ring set later)
        with device.active():
            self._stream = device.stream()
            self._copied = device.event(blocking=True)  # read_queued's copy: waited for at the next Decode
        self._copy_pending = False
        if feed is None:
            self._start()  # a file NVDEC cannot take fails here, and the caller falls back

    @property
    def shares_thread(self) -> bool:
        """A file's read is a decode and a copy on the GPU, never a wait for the network: a capture thread
        can read several (pipelines.capture). A network stream's read waits for its packets."""
        return self.feed is None

    def due_in(self) -> float:
        """Seconds until the next frame is due (--realtime; <= 0: now)."""
        if not (self.realtime and self.info is not None and self.info.fps > 0 and self.feed is None):
            return 0.0
        return self._next_time + 1.0 / self.info.fps - time.monotonic()

    @property
    def decode_errors(self) -> int:
        host = self._host.decode_errors if self._host is not None else 0
        return self._decode_errors + host + (self.feed.decode_errors if self.feed is not None else 0)

    # --- opening -------------------------------------------------------------------------------------------
    def _demux(self):
        nvc = self.nvc
        if self.feed is None:
            return nvc.CreateDemuxer(filename=self.source_uri.location)
        self.feed.start()
        try:  # PyAV's demuxing of the feed's MPEG-TS, not PyNvVideoCodec's through a callback (nvdec_pipe.py: the GIL)
            demuxer = PipeDemuxer(self.feed, nvc.PacketData, nvc.cudaVideoCodec)
            failure = None
        except Exception as exc:
            demuxer, failure = None, first_line(exc)
        if self._interrupted:
            raise SourceError(f"{self.uri}: stopped")
        if demuxer is None or self.feed.received == 0:  # refused, unreachable, not a video stream
            raise SourceError(f"{self.uri}: cannot open ({self.feed.why()}{'; ' + failure if failure else ''})")
        return demuxer

    def _start(self) -> None:
        nvc, device = self.nvc, self.device
        with device.active():
            demuxer = self._demux()
            chroma, depth = str(demuxer.ChromaFormat()), int(demuxer.BitDepth())
            if "420" not in chroma or depth != 8:
                raise Unsupported(f"NVDEC path takes 8-bit 4:2:0 streams, this one is {chroma} {depth}-bit")
            try:
                self._decoder = nvc.CreateDecoder(gpuid=device.ordinal, codec=demuxer.GetNvCodecId(),
                                                  cudacontext=device.context.handle,
                                                  cudastream=self._stream.handle, usedevicememory=True,
                                                  **display_latency(nvc, self.live))
            except Exception as exc:
                raise Unsupported(first_line(exc)) from None
        self._demuxer, self._packets = demuxer, iter(demuxer)
        self._timebase = demuxer.GetTimebaseNum() / max(1, demuxer.GetTimebaseDen())
        codec = str(demuxer.GetNvCodecId()).rsplit(".", 1)[-1].lower()
        self._pending: deque = deque()
        self._index = 0
        self._kept.start_opening(self._timebase, {"h264": "h264", "hevc": "hevc"}.get(codec))
        try:
            first = self._next_frame()  # size and colour come from the decoded picture
        finally:
            self._kept.opened()
        self._pending.appendleft(first)
        height, width = int(self._decoder.GetHeight()), int(self._decoder.GetWidth())
        fps = float(demuxer.FrameRate() or 0)
        self.info = FrameInfo("nv12", height, width, _standard(str(demuxer.ColorSpace()), height),
                              _range(str(demuxer.ColorRange())), fps)
        self._frame_bytes = height * width * 3 // 2
        if int(first.framesize()) != self._frame_bytes:
            raise JetpipeError(f"decoded frame of {first.framesize()} bytes, expected NV12 {width}x{height}")

    def describe(self) -> str:
        return f"{self.uri} ({'ffmpeg: NVDEC cannot take it' if self._host is not None else 'nvdec'})"

    def open(self):
        if self._host is not None:
            return self._open_host()
        if self._decoder is None:
            try:
                self._start()
            except Unsupported as exc:
                if self.fallback is None:
                    raise
                log.warning("source %s: NVDEC cannot decode it (%s): decoding with FFmpeg", self.uri, exc)
                self._close_decoder()
                self._host = self._fallen_back()
                return self._open_host()
        self.pace_from_now()
        log.info("source %s: nv12 %dx%d %s via NVDEC (device memory)", self.uri, self.info.width, self.info.height,
                 self.info.standard)
        return self.info

    def _fallen_back(self):
        """The fallback source, given what clips and a recording took from this one when they attached (before
        the stream's first read): the clips' ring, the recording's tee (its decoder process writes the packets the
        feed's ffmpeg wrote). Where clips keep its packets the fallback's decoder writes their copy alone, and the
        teed recording gets none: said."""
        host = self.fallback()
        host.packet_ring = self.packet_ring
        if self._tee is not None and not host.tee_packets(self._tee):
            log.warning("source %s: not recorded while FFmpeg decodes it: its decoder writes one copy of the "
                        "packets, and clips keep it", self.uri)
        return host

    def pace_from_now(self) -> None:
        """--realtime: the first frame is due a frame period from now. open() starts the pace; a reader that
        opens the stream well before it reads (a decode process, at start-up) starts it again at its first
        read, or the frames due in between would come at once."""
        self._next_time = time.monotonic()

    def _open_host(self):
        """The fallback decodes into a pinned frame that is copied into the device slot."""
        self.info = info = self._host.open()
        shape = frame_shape(info.format, info.height, info.width)
        if self._staging is None or self._staging.shape != shape:
            with self.device.active():
                self._staging = self.device.pinned(shape, np.uint8)  # once per stream size, not per frame
        return info

    # --- frames --------------------------------------------------------------------------------------------
    def _next_frame(self):
        while not self._pending:
            if self._interrupted:
                raise SourceError(f"{self.uri}: stopped")
            packet = next(self._packets, None)
            size = 0 if packet is None else packet.bsl
            if size == 0 and self.loop and not self.source_uri.live:  # the end, or the decoder's flush packet
                self._rewind()
                continue
            if size and (self.packet_ring is not None or self._kept.opening):
                self._kept.demuxed(packet, size, self.packet_ring)
            if packet is None:
                if self.source_uri.live:
                    why = f" ({self.feed.why()})" if self.feed is not None else ""
                    raise SourceError(f"{self.uri}: stream ended{why}")
                raise EndOfStream(self.uri)
            try:
                with self.device.active():
                    if self._copy_pending:  # the surface read_queued's copy reads is the decoder's again now
                        self._copied.synchronize()  # (done long since: a frame period ago)
                        self._copy_pending = False
                    self._pending.extend(self._decoder.Decode(packet))
            except Exception as exc:  # a corrupt packet: counted, the stream goes on
                if self._index == 0 and "not supported" in str(exc).lower():  # its codec/profile: before any frame
                    raise Unsupported(first_line(exc)) from None
                self._decode_errors += 1
                if worth_logging(self._decode_errors):
                    log.warning("%s: decode error #%d: %s", self.describe(), self._decode_errors, exc)
        return self._pending.popleft()

    def tee_packets(self, tee) -> bool:
        """A network stream's packets to the recording process straight from its remux ffmpeg, and from the
        fallback's decoder where NVDEC does not take the stream (a file's are demuxed here)."""
        if self._host is not None:
            return self._host.tee_packets(tee)
        if self.feed is None or not self.feed.tee_packets(tee):
            return False
        self._tee = tee
        return True

    @property
    def bit_rate(self) -> float:
        """Bits a second of a file (its size over its length: a clips ring's size); 0 for a network stream."""
        return 0.0 if self.feed is not None else file_bit_rate(self.source_uri.location)

    def _rewind(self) -> None:
        """Loop: a new demuxer feeding the same decoder, which takes the next pass like one long stream
        (its last frames come out as the first packets of the next pass arrive). Re-creating the
        decoder instead would stall the whole GPU: its memory is freed and allocated again."""
        with self.device.active():
            self._demuxer = self.nvc.CreateDemuxer(filename=self.source_uri.location)
        self._packets = iter(self._demuxer)

    def read_into(self, slot) -> float | None:
        """Copy the next decoded picture into a DeviceSlot (device to device); return its time."""
        pts = self.start_read(slot)
        self.finish_read()
        return pts

    def read_queued(self, slot) -> tuple[float | None, object | None]:
        """read_into without waiting for the copy: (the frame's time, an event its readers on the GPU wait for;
        None where the copy was waited for). Why: waiting, a capture thread spins on a core until the GPU has
        done the copy, and where the GPU is busy under CUDA MPS that took milliseconds a frame (32 streams on an
        H100: 8 capture threads spun 6.6 cores and fell behind the cameras). The copy is waited for before the
        decoder's next picture takes its surface, a frame period later."""
        if self._host is not None:
            return self._read_host(slot), None
        pts = self.start_read(slot)
        with self.device.active():
            self._copied.record(self._stream)
        self._copy_pending = True
        return pts, self._copied

    def start_read(self, slot) -> float | None:
        """read_into's copy queued on this source's stream, not waited for; finish_read() waits, and comes
        before the next start_read (the surface is the decoder's again at the next Decode). A thread that
        reads several sources queues each one's copy, then waits for all: one sleep a round, not one a frame,
        and the next source's Decode goes to NVDEC while the copies run."""
        if self._host is not None:
            return self._read_host(slot)
        frame = self._next_frame()
        self._check_slot(slot, self._frame_bytes)
        with self.device.active():
            self.device.cuda.memcpy_dtod_async(slot.address, frame.GetPtrToPlane(0), slot.nbytes, self._stream)
        self._index += 1
        fps = self.info.fps
        if self.realtime and fps > 0 and self.feed is None:  # a network stream comes at its own pace
            self._next_time += 1.0 / fps
            delay = self._next_time - time.monotonic()
            if delay > 0 and not self.paced_by_caller:
                time.sleep(delay)
        return frame.getPTS() * self._timebase  # the stream's presentation time, seconds

    def finish_read(self) -> None:
        """Wait for the copy start_read queued (the fallback's copy was waited for in its read)."""
        if self._host is None:
            with self.device.active():
                self._stream.synchronize()
            self._copy_pending = False

    def _read_host(self, slot) -> float | None:
        pts = self._host.read_into(self._staging)
        self._check_slot(slot, self._staging.nbytes)
        with self.device.active():
            self.device.cuda.memcpy_htod_async(slot.address, self._staging, self._stream)
            self._stream.synchronize()  # the staging frame is written again by the next read
        return pts

    def _check_slot(self, slot, frame_bytes: int) -> None:
        if slot.nbytes != frame_bytes:
            raise JetpipeError(f"{self.uri}: ring slot of {slot.nbytes} bytes for a {frame_bytes}-byte frame")

    # --- stopping ------------------------------------------------------------------------------------------
    def interrupt(self) -> None:
        """Unblock a connect or read in progress: the feed's ffmpeg is killed, so the demuxer reads its end."""
        self._interrupted = True
        if self.feed is not None:
            self.feed.interrupt()
        if self._host is not None:
            self._host.interrupt()

    def restart(self) -> bool:
        """End this connection (a network stream that stalled: connected, no frame for the stall timeout):
        the feed's ffmpeg is ended, the demuxer reads its end, the read in progress fails and the daemon
        reconnects. Unlike interrupt(), the source opens again. A file has no connection to end."""
        if self._host is not None:
            return self._host.restart()
        if self.feed is not None:
            return self.feed.restart()
        return False

    def _close_decoder(self) -> None:
        self._pending = deque()
        if isinstance(self._demuxer, PipeDemuxer):
            self._demuxer.close()
        self._decoder = self._demuxer = self._packets = None  # PyNvVideoCodec frees them with the objects
        if self.feed is not None:
            self.feed.stop()

    def close(self) -> None:
        """Ends this connection (a network stream opens again at the next open(): a reconnect)."""
        if self._host is not None:
            self._host.close()
        if self._decoder is not None:
            with self.device.active():
                self._stream.synchronize()
        self._close_decoder()
