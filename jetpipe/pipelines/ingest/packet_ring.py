"""A stream's compressed packets of the last seconds, as its demuxer gave them: what a clip is cut from.

Kept by group of pictures (GOP: a keyframe and the packets after it), so that what is kept always starts
at a keyframe and a clip can start at the last keyframe at or before the moment it asks for. The ring holds
`keep_s` seconds back from its newest packet, plus the GOP that reaches into them, and never more than
`max_bytes` (the oldest GOPs go first; a clip then starts later than asked, and says so). GOPs older than
that go when the next GOP starts.

Timestamps are the source's: `t` in seconds on the clock the frames' pts use (a looped file's go on across
loops), `pts` and `dts` in the stream's time base, shifted the same way. Where that clock goes back (NVDEC's
looped file starting again, a camera's clock reset), what was kept goes: the ring starts again.

Packets come in one of two forms: as the container holds them (PyAV's demuxer; a clip copies the codec
parameters of the file itself: `template`), or as NVDEC's demuxer gives them, H.264 / HEVC in Annex B
(start codes, the parameter sets before each keyframe: `annexb` names the codec; a clip takes its parameters
from the packets themselves).
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from dataclasses import dataclass, field

from jetpipe.pipelines.ingest.packet_arena import PacketArena
from jetpipe.video import KeepClock, Packet

BACKWARDS_S = 1.0  # a packet this much older than the newest is a clock that went back (B-frames: a few frames)


@dataclass
class Gop:
    packets: list[Packet] = field(default_factory=list)
    bytes: int = 0

    @property
    def start(self) -> float:
        return self.packets[0].t


class PacketRing(KeepClock):
    def __init__(self, keep_s: float, max_bytes: int, template: str, time_base, annexb: str | None = None):
        """template: the file whose stream's codec parameters a clip copies; time_base: its stream's; annexb:
        "h264" or "hevc" where the packets are Annex B (the source may set it, and time_base, at its first)."""
        self.keep_s, self.max_bytes, self.template, self.time_base = keep_s, max_bytes, template, time_base
        self.annexb = annexb
        self.lock = threading.Lock()
        self.gops: deque[Gop] = deque()
        self.bytes = 0
        self.newest = float("-inf")
        self.ended = False
        self.forget = False  # its stream was removed: the ring goes once no clip waits for it
        self.opened = None   # the template's container, once a clip was cut (cut.open_template)
        self.cpu_s = 0.0     # the source's CPU time keeping packets here (copying them, add()): KeepClock
        self.trimmed_for_room = 0  # GOPs that went because of max_bytes (not of age)
        self.pins: dict[int, float] = {}  # a waiting clip's start: kept however old (max_bytes still holds)
        self.on_restart = None  # called (the source's thread) before the ring starts again: clips waiting take
        #                         their packets (the clips' thread cuts them)
        self.generation = 0  # counts the ring's starts again (a reader that follows it: the recorder)
        self.arena: PacketArena | None = None  # the recording's, where it records the stream too (link_arena)

    def add(self, packet: Packet) -> None:
        """One demuxed packet (the source's capture thread). Packets before the first keyframe decode to
        nothing on their own: not kept. This runs for every packet of every stream, in a thread that has just
        woken for its frame (where each Python step costs several times what it does in a warm loop), so it
        does as little as it can: old GOPs go when a new one starts, or when the bytes pass max_bytes."""
        if self.arena is not None:
            self.arena.add(packet)
        t, size = packet.t, len(packet.data)
        if t < self.newest - BACKWARDS_S:  # the clock went back (a loop, a reset): start again
            if self.on_restart is not None:
                self.on_restart()  # the clips waiting for this pass's packets take what it left
            with self.lock:
                self.gops.clear()
                self.bytes, self.newest = 0, float("-inf")
                self.generation += 1
                # a reader's pin is a time of the last pass (clips unpinned theirs in on_restart): the new pass
                # is kept from its start until the reader pins again
                self.pins = {key: float("-inf") for key in self.pins}
        with self.lock:
            if packet.key:
                self.gops.append(Gop())
            elif not self.gops:
                return
            gop = self.gops[-1]
            gop.packets.append(packet)
            gop.bytes += size
            self.bytes += size
            if t > self.newest:
                self.newest = t
            if packet.key or self.bytes > self.max_bytes:
                self._trim()

    def add_from(self, address: int, size: int, t: float, pts: int | None, dts: int | None, duration: int,
                 key: bool) -> None:
        """A packet's bytes at address, in a buffer its demuxer reuses (NVDEC's): copied (as PacketArena's)."""
        self.add(Packet(t, ctypes.string_at(address, size), pts, dts, duration, key))

    def pin(self, key: int, start: float) -> None:
        """Keep what a waiting clip starts with until unpin(key)."""
        with self.lock:
            self.pins[key] = start

    def unpin(self, key: int) -> None:
        with self.lock:
            self.pins.pop(key, None)

    def _trim(self) -> None:
        horizon = self.newest - self.keep_s
        if self.pins:
            horizon = min(horizon, *self.pins.values())
        while len(self.gops) > 1 and (self.gops[1].start <= horizon or self.bytes > self.max_bytes):
            if self.gops[1].start > horizon:
                self.trimmed_for_room += 1
            self.bytes -= self.gops.popleft().bytes

    def whole_gops_after(self, after: float, last_too: bool = False) -> tuple[int, list[Gop]]:
        """(generation, the GOPs that start after `after` and are whole: a newer one has started, or the stream
        ended, or last_too). A whole GOP is never changed again: the caller reads its packets without the lock."""
        with self.lock:
            whole = len(self.gops) if (self.ended or last_too) else len(self.gops) - 1
            return self.generation, [g for k, g in enumerate(self.gops) if k < whole and g.start > after]

    def first_gop(self) -> bytes:
        """The oldest kept GOP's bytes (an Annex B stream's parameter sets and a picture)."""
        with self.lock:
            return b"".join(p.data for p in self.gops[0].packets) if self.gops else b""

    def close(self) -> None:
        if self.opened is not None:
            self.opened.close()
            self.opened = None

    def end(self) -> None:
        """The stream ended: no packet will come (a clip waiting for its end is cut with what there is)."""
        with self.lock:
            self.ended = True

    def covers(self, until: float) -> bool:
        with self.lock:
            return self.ended or self.newest >= until

    def between(self, start: float, end: float) -> list[Packet]:
        """The packets of [start, end] in decode order: from the last keyframe at or before `start` (the oldest
        kept where none is) to the last packet shown at or before `end` (with those it references)."""
        with self.lock:
            gops = list(self.gops)
        first = 0
        for k, gop in enumerate(gops):
            if gop.start <= start:
                first = k
        packets = [p for gop in gops[first:] for p in gop.packets]
        last = max((k for k, p in enumerate(packets) if p.t <= end + 1e-6), default=-1)
        return packets[:last + 1]


def shared_ring(source, keep_s: float, max_bytes: int) -> PacketRing:
    """The ring the source keeps its packets in, made where it has none (the clips and a recorder in this process,
    as the tests run one, read one ring a stream: each packet is copied once), widened to keep at least keep_s
    and max_bytes. A serve's recording has an arena instead (packet_arena.link_arena): kept beside the ring."""
    ring = source.packet_ring
    if ring is None or isinstance(ring, PacketArena):
        arena, ring = ring, PacketRing(keep_s, max_bytes, source.source_uri.location, None)
        if arena is not None:
            ring.time_base, ring.annexb, ring.arena = arena.time_base, arena.annexb, arena
        source.packet_ring = ring
    else:
        with ring.lock:
            ring.keep_s, ring.max_bytes = max(ring.keep_s, keep_s), max(ring.max_bytes, max_bytes)
    return ring
