"""A recording's segment: a stream's packets, as its source gave them, in a fragmented MP4 (never decoded or
encoded).

Fragmented (a `moof` + `mdat` pair a GOP, after an empty `moov`): what is on disk plays up to its last whole
fragment, so a process killed mid-segment loses only what its muxer still held; at the next start
`whole_length` finds where the last whole fragment ends and the rest is cut off (`repair`). Each file's time 0
is its first packet's decode time; the index keeps where that lies on the stream's clock (`t0`).

A segment file is made by this code (O_EXCL | O_NOFOLLOW: refused where anything has its name, a link too)
and then written through that descriptor, so that it never writes into a file it did not make.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from jetpipe.pipelines.outputs.sinks.safe_open import MODE, NEW_FILE
from jetpipe.video import Packet

FRAGMENTED = {"movflags": "+frag_keyframe+empty_moov+default_base_moof"}
# what a segment adds to its packets' bytes, at most: the header (ftyp + an empty moov: ~0.8 kB measured),
# a fragment's boxes a GOP (~0.4 kB) and an entry a packet (12-16 bytes), the closing index (mfra)
HEADER_BYTES, GOP_BYTES, PACKET_BYTES = 4096, 1024, 32
NOT_DECODED = {"skip_frame": "all"}  # an Annex B template's options: probed by its parser alone


def reserve_for(packets: list[Packet]) -> int:
    """The bytes writing these packets (one GOP) may add to a segment file, at most."""
    return sum(len(p.data) for p in packets) + GOP_BYTES + PACKET_BYTES * len(packets)


@dataclass
class Written:
    """A closed segment: the stream's clock at its time 0 and past its last frame, its size and packets."""
    t0: float
    t1: float
    bytes: int
    packets: int


class SegmentFile:
    """One open segment. The template is a container whose video stream has the packets' codec parameters
    (template_of); time_base: the packets' pts and dts unit; base: the decode time (in time_base units) that
    becomes the file's 0."""

    def __init__(self, path: Path, template, time_base: Fraction, base: int):
        import av

        self.path, self.time_base, self.base = path, time_base, base
        # unbuffered: what the muxer hands over (a fragment, as the next GOP starts) is on disk at once
        self.file = os.fdopen(os.open(path, NEW_FILE, MODE), "wb", buffering=0)
        try:
            self.out = av.open(self.file, "w", format="mp4", options=FRAGMENTED)
            self.stream = self.out.add_stream_from_template(template.streams.video[0])
        except BaseException:
            self.file.close()
            path.unlink(missing_ok=True)
            raise
        self.packets = 0
        self.last = None  # the stream's clock past the newest packet written (its time + its duration)

    def write(self, packets: list[Packet]) -> None:
        """One GOP, in decode order. Raises OSError (a full disk) or av.error.FFmpegError."""
        import av

        seconds = float(self.time_base)
        for p in packets:
            packet = av.Packet(p.data)
            packet.pts = None if p.pts is None else p.pts - self.base
            packet.dts = None if p.dts is None else p.dts - self.base
            packet.duration, packet.is_keyframe = p.duration, p.key
            packet.stream, packet.time_base = self.stream, self.time_base
            self.out.mux(packet)
            end = p.t + p.duration * seconds
            if self.last is None or end > self.last:
                self.last = end
        self.packets += len(packets)

    def close(self, t1: float | None = None) -> Written:
        """The file finished (its last fragment and index written); t1: where the stream's clock goes on
        (the next segment's start: consecutive segments meet), else past its newest packet."""
        try:
            self.out.close()
        finally:
            self.file.close()
        t0 = self.base * float(self.time_base)
        return Written(t0, t1 if t1 is not None else (self.last or t0), self.path.stat().st_size, self.packets)

    def abandon(self) -> None:
        """Closed without its trailer where writing failed (the file then holds its whole fragments)."""
        try:
            self.out.close()
        except Exception:  # the disk that failed the write fails the trailer too: what is whole stays
            pass
        finally:
            self.file.close()


def whole_length(path: Path) -> int:
    """Bytes of the file up to the end of its last whole fragment (0: not even a header): MP4's top-level boxes
    walked (each a 32-bit size, or 64-bit where that is 1, and a type)."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        at, whole, header = 0, 0, False
        while at + 8 <= size:
            f.seek(at)
            head = f.read(16)
            length = int.from_bytes(head[:4], "big")
            kind = head[4:8]
            if length == 1 and len(head) == 16:
                length = int.from_bytes(head[8:16], "big")
            elif length == 0:
                length = size - at
            if length < 8 or at + length > size:
                break
            at += length
            if kind == b"moov":
                header, whole = True, at
            elif header and kind in (b"mdat", b"mfra"):  # a fragment's media, or the closing index
                whole = at
        return whole


@dataclass
class Probed:
    packets: int
    seconds: float  # from the first decode time to past the last frame shown


def probe(path: Path) -> Probed | None:
    """The segment's packets and length as a demuxer reads them; None where it holds none or is not an MP4."""
    import av

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            first, last, count = None, None, 0
            for packet in container.demux(stream):
                if packet.size == 0:
                    continue
                at = packet.dts if packet.dts is not None else packet.pts
                end = (packet.pts if packet.pts is not None else at) + (packet.duration or 0)
                first = at if first is None else min(first, at)
                last = end if last is None else max(last, end)
                count += 1
            if not count:
                return None
            return Probed(count, float((last - first) * stream.time_base))
    except (av.error.FFmpegError, IndexError, OSError):
        return None


def repair(path: Path) -> Probed | None:
    """A segment left open by a killed process: cut after its last whole fragment, then probed (None: nothing
    in it plays)."""
    whole = whole_length(path)
    if whole == 0:
        return None
    if whole < path.stat().st_size:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, whole)
        finally:
            os.close(fd)
    return probe(path)


def template_of(annexb: str | None, file_template: str, packets: list[Packet]):
    """A container whose video stream has the packets' codec parameters: the input file itself (PyAV's
    packets, as the container holds them), or for Annex B packets (NVDEC's, a pipe's) a raw stream of the
    GOP's keyframe, whose parameter sets FFmpeg reads (a camera may change them between segments). That
    keyframe is not decoded: the parser's size and parameter sets are what the muxer copies for H.264 and
    HEVC (probing by decoding it cost 25-37 ms at 1080p, for a segment the same to the byte)."""
    import av

    if annexb is None:
        return av.open(file_template)
    # PyAV before 17 opens an encoder for a stream added from a template, which wants the pixel format only
    # decoding finds: there the keyframe is decoded (options reach the stream's decoder too: PyAV 19 has no
    # stream_options)
    undecoded = NOT_DECODED if int(av.__version__.split(".")[0]) >= 17 else {}
    return av.open(io.BytesIO(packets[0].data), format=annexb, options=undecoded)


_SETS = {"h264": (7, 8), "hevc": (32, 33, 34)}  # SPS, PPS (HEVC: VPS, SPS, PPS)


def parameter_sets(data: bytes, codec: str) -> bytes:
    """The parameter-set NAL units before the first picture of an Annex B keyframe (NVDEC's demuxer puts them
    there): what its codec parameters come from, so a template is opened again only where they changed."""
    wanted, found = _SETS[codec], []
    at = data.find(b"\x00\x00\x01")
    while at != -1 and at + 3 < len(data):
        start = at + 3
        header = data[start]
        kind = header & 0x1F if codec == "h264" else (header >> 1) & 0x3F
        following = data.find(b"\x00\x00\x01", start)
        if kind in wanted:
            found.append(data[start:following if following != -1 else len(data)].rstrip(b"\x00"))
        elif (codec == "h264" and kind in (1, 5)) or (codec == "hevc" and kind < 32):
            break  # a picture: the parameter sets come before it
        at = following
    return b"".join(found)
