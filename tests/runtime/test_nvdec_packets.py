"""An NVDEC source's demuxed packets into its ring (runtime.nvdec_packets), with an object standing for
PyNvVideoCodec's PacketData: one object for every packet, its fields changed in place, as PyNvVideoCodec 2.2.4's
demuxer gives them (checked on an H100), and the bytes in a buffer the next packet overwrites."""

import ctypes
import logging
import os

from jetpipe.pipelines.ingest.packet_arena import ArenaReader, PacketArena
from jetpipe.runtime.nvdec_packets import NO_TIME, DemuxedPackets


class _Demuxer:
    """One packet object and one buffer for every packet."""

    def __init__(self):
        self.buffer = ctypes.create_string_buffer(64)
        self.packet = type("PacketData", (), {})()

    def packet_number(self, n: int, timed: bool = True):
        ctypes.memset(self.buffer, n + 1, 64)
        p = self.packet
        p.bsl_data, p.bsl, p.duration, p.key = ctypes.addressof(self.buffer), 64, 1, n % 4 == 0
        p.pts = p.dts = n if timed else NO_TIME
        return p


def _arena():
    arena = PacketArena(10_000)
    reader = ArenaReader(os.dup(arena.fd), 10_000)
    arena.handed_over()
    return arena, reader


def test_the_openings_packets_wait_for_a_ring_set_after_it_and_go_in_first():
    demuxer, packets = _Demuxer(), DemuxedPackets("in.mp4")
    packets.start_opening(0.5, "h264")
    for n in range(3):  # the opening: no ring yet
        packets.demuxed(demuxer.packet_number(n), 64, None)
    packets.opened()
    arena, reader = _arena()
    try:
        for n in range(3, 6):
            packets.demuxed(demuxer.packet_number(n, timed=n != 4), 64, arena)  # the fifth has no time: not kept
        read = reader.packets(arena.take()[0])
    finally:
        reader.close()
    assert arena.time_base == 0.5 and arena.annexb == "h264"
    assert [(p.t, p.pts, p.key) for p in read] == [(0.0, 0, True), (0.5, 1, False), (1.0, 2, False),
                                                     (1.5, 3, False), (2.5, 5, False)]
    assert [p.data for p in read] == [bytes([n + 1]) * 64 for n in (0, 1, 2, 3, 5)]


def test_a_codec_clips_are_not_cut_from_keeps_nothing_and_says_so_once(caplog):
    demuxer, packets = _Demuxer(), DemuxedPackets("in.mkv")
    packets.start_opening(0.5, None)  # VP9, AV1: a clip is cut from H.264 or HEVC only
    packets.demuxed(demuxer.packet_number(0), 64, None)
    packets.opened()
    arena, reader = _arena()
    reader.close()
    with caplog.at_level(logging.WARNING):
        for n in range(1, 4):
            packets.demuxed(demuxer.packet_number(n), 64, arena)
    assert arena.take() == ([], False) and arena.time_base is None
    assert sum("no clips" in r.getMessage() for r in caplog.records) == 1
