"""An NVDEC source's demuxed packets beside their decoding: kept in the source's ring (a clips ring, a recording's
arena) on the frames' clock, in Annex B as NVDEC's demuxer gives them.

A ring may be set after the stream opened (a file opens when its source is made, before clips and recording
attach): the packets the opening demuxed to decode its first picture are gathered then and kept at the first
packet after. Each packet runs through here first thing after its thread woke for its frame, where each Python
step costs several times its warm price, so the path is short: each of the packet's fields is read once, and one
packet in a few is timed (PacketRing.clock). PyNvVideoCodec's demuxer gives every packet in one object whose
fields it changes in place (checked on an H100, session 51), so they are read before the next packet is demuxed.
"""

from __future__ import annotations

import ctypes
import logging
from fractions import Fraction

from jetpipe.video import Packet as RingPacket

log = logging.getLogger(__name__)
NO_TIME = -(1 << 63)  # FFmpeg's AV_NOPTS_VALUE: a packet without a time


class DemuxedPackets:
    """One NVDEC source's packets on their way into its ring (source.packet_ring)."""

    def __init__(self, uri: str):
        self.uri = uri
        self.codec: str | None = None  # "h264" / "hevc": the codecs whose Annex B packets a clip is cut from
        self.timebase = 0.0            # seconds a tick of the demuxer's clock
        self._said_no_clips = False    # another codec's stream with a ring: said once
        # the packets the opening demuxed to decode its first frame (the keyframe a clip of the stream's first
        # seconds starts with): gathered while opening (a list only then), kept for a ring set after the opening
        # until its first packet
        self._opening: list | None = None
        self._opened: list | None = None

    @property
    def opening(self) -> bool:
        return self._opening is not None

    def start_opening(self, timebase: float, codec: str | None) -> None:
        self.timebase, self.codec, self._opening = timebase, codec, []

    def opened(self) -> None:
        """The first picture came (or the opening failed): what it demuxed waits for a ring set after it (none
        where a ring already kept them, or where the codec is not one a clip is cut from)."""
        self._opened, self._opening = self._opening or None, None

    def demuxed(self, packet, size: int, ring) -> None:
        """A demuxed packet of `size` bytes (not the flush): into the ring, or gathered while opening."""
        if ring is None:
            if self._opening is not None and self.codec is not None:
                self._opening.append(self._ring_packet(packet, size))
            return
        if self.codec is None:
            if not self._said_no_clips:
                self._said_no_clips = True
                log.warning("source %s: no clips: its codec's packets are not H.264 or HEVC", self.uri)
            return
        started = ring.clock()
        if ring.time_base is None:
            ring.time_base, ring.annexb = Fraction(self.timebase).limit_denominator(1 << 30), self.codec
            for early in self._opened or ():  # demuxed at the opening, before the ring was set
                if early is not None:
                    ring.add(early)
            self._opened = None
        times = self._times(packet)
        if times is not None:  # copied from the demuxer's buffer (into a recording's arena: no bytes object made)
            ring.add_from(packet.bsl_data, size, *times, int(packet.duration or 0), bool(packet.key))
        ring.clocked(started)  # the summary's clips.cpu_s, a recording's rings_s

    def _ring_packet(self, packet, size: int) -> RingPacket | None:
        """The packet as a ring keeps it, its bytes copied (the demuxer reuses its buffer); None without a time."""
        times = self._times(packet)
        if times is None:
            return None
        return RingPacket(times[0], ctypes.string_at(packet.bsl_data, size), *times[1:], int(packet.duration or 0),
                          bool(packet.key))

    def _times(self, packet) -> tuple | None:
        """(t on the frames' clock, pts, dts) of a demuxed packet; None where it has neither time."""
        pts, dts = packet.pts, packet.dts
        pts = None if pts is None or pts == NO_TIME else int(pts)
        dts = None if dts is None or dts == NO_TIME else int(dts)
        at = pts if pts is not None else dts
        return None if at is None else (at * self.timebase, pts, dts)
