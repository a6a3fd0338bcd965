"""Desktop NVIDIA GPUs: NVDEC through PyNvVideoCodec, NV12 in device memory straight into device ring slots.

The decoded picture never touches host memory. PyNvVideoCodec hands out its
output surface, valid until the next Decode call; the source copies it
device-to-device into the ring slot the frame goes to (a few microseconds for
1080p) on its own stream, and the preprocessing kernel reads it there.
Optional (`pip install pynvvideocodec`): without it, on a Jetson (GStreamer's
nvv4l2decoder serves there), or for a stream NVDEC cannot take (not 8-bit 4:2:0,
a codec the GPU lacks), open_nvdec() says why and returns None, and the caller
decodes with FFmpeg.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from jetpipe.errors import JetpipeError, worth_logging
from jetpipe.uri import NETWORK_SCHEMES, SourceURI
from jetpipe.video import EndOfStream, FrameInfo, SourceError

log = logging.getLogger(__name__)


def import_nvdec():
    try:
        import PyNvVideoCodec as nvc
    except ImportError:
        return None
    return nvc


def open_nvdec(device, uri: SourceURI, loop: bool = False, realtime: bool = False):
    """An NvdecSource for a video file, or None (logged why) where NVDEC cannot serve it.

    Network streams stay with FFmpeg for now: this source opens its demuxer (and decodes the first
    picture) when it is made, which for a camera that does not answer would block start-up with no
    way to interrupt it; a live NVDEC source must open in its capture thread first."""
    if uri.scheme in NETWORK_SCHEMES:
        log.info("source %s: network streams are decoded by FFmpeg (NVDEC serves files)", uri.text)
        return None
    if uri.scheme != "file":
        return None
    if device.integrated:
        log.debug("source %s: integrated GPU, NVDEC is reached through GStreamer's nvv4l2decoder", uri.text)
        return None
    nvc = import_nvdec()
    if nvc is None:
        log.info("source %s: NVDEC needs PyNvVideoCodec (pip install pynvvideocodec): decoding with FFmpeg", uri.text)
        return None
    try:
        return NvdecSource(device, nvc, uri, loop, realtime)
    except Exception as exc:  # unsupported codec / chroma / bit depth, unreadable file: FFmpeg says more
        log.warning("source %s: NVDEC cannot decode it (%s): decoding with FFmpeg", uri.text,
                    str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        return None


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

    def __init__(self, device, nvc, uri: SourceURI, loop: bool = False, realtime: bool = False):
        self.device, self.nvc, self.source_uri, self.uri = device, nvc, uri, uri.text
        self.loop, self.realtime, self.live = loop, realtime, uri.live or realtime
        self.decode_errors = 0
        self._interrupted = False
        self._decoder = self._demuxer = None
        with device.active():
            self._stream = device.stream()
        self._start()  # a file NVDEC cannot take fails here, and the caller falls back

    # --- opening -------------------------------------------------------------------------------------------
    def _start(self) -> None:
        nvc, device = self.nvc, self.device
        with device.active():
            demuxer = nvc.CreateDemuxer(filename=self.source_uri.location)
            chroma, depth = str(demuxer.ChromaFormat()), int(demuxer.BitDepth())
            if "420" not in chroma or depth != 8:
                raise JetpipeError(f"NVDEC path takes 8-bit 4:2:0 streams, this one is {chroma} {depth}-bit")
            self._decoder = nvc.CreateDecoder(gpuid=device.ordinal, codec=demuxer.GetNvCodecId(),
                                              cudacontext=device.context.handle, cudastream=self._stream.handle,
                                              usedevicememory=True)
        self._demuxer, self._packets = demuxer, iter(demuxer)
        self._pending: deque = deque()
        self._index = 0
        first = self._next_frame()  # size and colour come from the decoded picture
        self._pending.appendleft(first)
        height, width = int(self._decoder.GetHeight()), int(self._decoder.GetWidth())
        fps = float(demuxer.FrameRate() or 0)
        self._timebase = demuxer.GetTimebaseNum() / max(1, demuxer.GetTimebaseDen())
        self.info = FrameInfo("nv12", height, width, _standard(str(demuxer.ColorSpace()), height),
                                     _range(str(demuxer.ColorRange())), fps)
        self._frame_bytes = height * width * 3 // 2
        if int(first.framesize()) != self._frame_bytes:
            raise JetpipeError(f"decoded frame of {first.framesize()} bytes, expected NV12 {width}x{height}")

    def describe(self) -> str:
        return f"{self.uri} (nvdec)"

    def open(self):
        if self._decoder is None:
            self._start()
        self._next_time = time.monotonic()
        log.info("source %s: nv12 %dx%d %s via NVDEC (device memory)", self.uri, self.info.width, self.info.height,
                 self.info.standard)
        return self.info

    # --- frames --------------------------------------------------------------------------------------------
    def _next_frame(self):
        while not self._pending:
            if self._interrupted:
                raise SourceError(f"{self.uri}: stopped")
            packet = next(self._packets, None)
            looping = self.loop and not self.source_uri.live
            if looping and (packet is None or packet.bsl == 0):  # the end, or the decoder's flush packet
                self._rewind()
                continue
            if packet is None:
                if self.source_uri.live:
                    raise SourceError(f"{self.uri}: stream ended")
                raise EndOfStream(self.uri)
            try:
                with self.device.active():
                    self._pending.extend(self._decoder.Decode(packet))
            except Exception as exc:  # a corrupt packet: counted, the stream goes on
                self.decode_errors += 1
                if worth_logging(self.decode_errors):
                    log.warning("%s: decode error #%d: %s", self.describe(), self.decode_errors, exc)
        return self._pending.popleft()

    def _rewind(self) -> None:
        """Loop: a new demuxer feeding the same decoder, which takes the next pass like one long stream
        (its last frames come out as the first packets of the next pass arrive). Re-creating the
        decoder instead would stall the whole GPU: its memory is freed and allocated again."""
        with self.device.active():
            self._demuxer = self.nvc.CreateDemuxer(filename=self.source_uri.location)
        self._packets = iter(self._demuxer)

    def read_into(self, slot) -> float | None:
        """Copy the next decoded picture into a DeviceSlot (device to device); return its time."""
        frame = self._next_frame()
        if slot.nbytes != self._frame_bytes:
            raise JetpipeError(f"{self.uri}: ring slot of {slot.nbytes} bytes for a {self._frame_bytes}-byte frame")
        with self.device.active():
            self.device.cuda.memcpy_dtod_async(slot.address, frame.GetPtrToPlane(0), slot.nbytes, self._stream)
            self._stream.synchronize()  # the surface is the decoder's again at the next Decode
        self._index += 1
        fps = self.info.fps
        if self.realtime and fps > 0:
            self._next_time += 1.0 / fps
            delay = self._next_time - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        return frame.getPTS() * self._timebase  # the stream's presentation time, seconds

    # --- stopping ------------------------------------------------------------------------------------------
    def interrupt(self) -> None:
        self._interrupted = True

    def _close_decoder(self) -> None:
        self._pending = deque()
        self._decoder = self._demuxer = self._packets = None  # PyNvVideoCodec frees them with the objects

    def close(self) -> None:
        if self._decoder is not None:
            with self.device.active():
                self._stream.synchronize()
            self._close_decoder()
