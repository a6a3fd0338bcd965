"""A stream's packets on their way to the recording process: copied once, by the source's thread, into memory
the recording process maps too, and described by a tuple a packet that the forwarding thread hands over.

Why: keeping each packet as a bytes object in a ring and pickling it over a pipe cost the serving process about
33 us a packet with 16 busy 1080p30 streams (26 keeping it, 7.6 handing it over: 2.4 % of its CPU; issue 67
asks for 1 %). A copy into memory that is mapped and touched already allocates nothing, and what crosses the
pipe is seven numbers a packet.

The memory is a memfd (not /dev/shm, which a container may keep at 64 MB), passed to the recording process
as a file descriptor. One writer (the source's thread), one reader (the recording process): positions count
bytes from the start and never wrap; a packet lies whole at position % capacity (one that would cross the end
starts at 0). The reader says how far it has read in the first 8 bytes; the writer never overwrites what it
has not read: where there is no room (the recording process stalled), packets are not kept until the next
keyframe (`lost`: the recording has a gap there, and counts it).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections import deque

from jetpipe.video import KeepClock, Packet

HEADER = 64                   # the reader's position (8 bytes), then the packets from a cache line on
ARENA_MIN_BYTES = 16_000_000  # 16 s of a busy 1080p30 stream: the recording process reads every half second
ARENA_S = 8.0                 # or this much of a stream whose bit rate is known (a file's), where larger
LARGEST = 4                   # a packet larger than capacity / LARGEST is not kept (it would stall the rest)

# memmove that keeps the GIL. ctypes.memmove lets the GIL go for the copy (a CFUNCTYPE), and taking it back
# among a busy serving process's threads cost a source's thread 13-16 us a packet against 6 holding it (16
# paced sources and a busy thread on the 2-core machine; on an H100 host the copies' time fell 15 %). A copy of
# at most a keyframe is shorter than any hand-over of the GIL.
_copy = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(
    ctypes.cast(ctypes.memmove, ctypes.c_void_p).value)  # the same C function, called holding the GIL


def arena_bytes(bit_rate: float, max_bytes: int) -> int:
    """A stream's arena: ARENA_S of it at its bit rate (0: unknown, a camera's), at least ARENA_MIN_BYTES,
    at most max_bytes (ring_mb: a stream's packets held at most while not yet written)."""
    return int(min(max_bytes, max(ARENA_MIN_BYTES, ARENA_S * bit_rate / 8)))


class PacketArena(KeepClock):
    """Stands for a clips ring where only the recording keeps the packets (source.packet_ring), or beside one
    (PacketRing.arena). Its memory is never unmapped while the arena lives: a source's thread may be copying
    into it when the stream is removed (stop() only ends the keeping)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.fd: int | None = os.memfd_create("jetpipe-packets", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, HEADER + capacity)
            self.memory = mmap.mmap(self.fd, HEADER + capacity)
        except BaseException:
            self.handed_over()
            raise
        self._read = ctypes.c_uint64.from_buffer(self.memory, 0)  # how far the recording process has read
        self._start = ctypes.c_char.from_buffer(self.memory, HEADER)  # (an export: the map cannot be closed)
        self._base = ctypes.addressof(self._start)
        # every page touched now: a page's first write is a fault that allocates and zeroes it, which made a
        # packet's copy 45 us instead of ~4 on an H100 host (a 30-s run never came round to written pages)
        ctypes.memset(ctypes.addressof(self._read), 0, HEADER + capacity)
        self.head = 0                  # where the next packet goes (bytes since the start)
        self._free_to = capacity       # head may reach this without reading the reader's position again
        self.skipping = False          # no room was left: nothing is kept until the next keyframe
        self.packets: deque[tuple] = deque()  # (t, position, size, pts, dts, duration, key) not handed over yet
        self.time_base = self.annexb = None   # set by the source at its first packet, as a ring's
        self.cpu_s = 0.0               # the source's CPU time keeping packets here (KeepClock)
        self.lost = 0                  # packets not kept (no room, or too large)
        self.ended = False             # the stream ended since the last take (its last GOP is whole)
        self.stopped = False           # its stream was removed: nothing more is kept

    def add_from(self, address: int, size: int, t: float, pts: int | None, dts: int | None, duration: int,
                 key: bool) -> None:
        """A packet's bytes at address (a demuxer's buffer, or a bytes object) copied in (the source's thread:
        it runs for every packet of every stream, so it does as little as it can)."""
        if self.stopped or (self.skipping and not key):
            self.lost += 1
            return
        head, capacity = self.head, self.capacity
        at = head % capacity
        if at + size > capacity:  # it would cross the end: it starts at 0
            head += capacity - at
            at = 0
        if head + size > self._free_to:
            # the reader's position is read only where the room known is short (it only grows between two reads):
            # a ctypes read of shared memory is one more cold call a packet in a source's just-woken thread
            self._free_to = self._read.value + capacity
        if head + size > self._free_to or size * LARGEST > capacity:
            self.skipping = True
            self.lost += 1
            return
        self.skipping = False
        _copy(self._base + at, address, size)
        self.head = head + size
        self.packets.append((t, head, size, pts, dts, duration, key))

    def add(self, packet: Packet) -> None:
        """A packet a demuxer made (PyAV's, a decode process's, a clips ring's)."""
        self.add_from(packet.data, len(packet.data), packet.t, packet.pts, packet.dts, packet.duration, packet.key)

    def end(self) -> None:
        """The stream ended (it may start again: a camera reconnects): its last GOP is whole."""
        self.ended = True

    def stop(self) -> None:
        self.stopped = True

    def take(self) -> tuple[list[tuple], bool]:
        """(what was kept since the last take, whether the stream ended since): the forwarding thread's."""
        ended, self.ended = self.ended, False
        packets = self.packets
        return [packets.popleft() for _ in range(len(packets))], ended

    def read_to(self) -> int:
        """How far the recording process has read (what it gave back to be written again)."""
        return self._read.value

    def handed_over(self) -> None:
        """The recording process holds the descriptor now (or never will): this process's copy closes (the
        memory stays mapped here)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class ArenaReader:
    """The recording process's side of a stream's arena: the packets a pass described, copied out."""

    def __init__(self, fd: int, capacity: int):
        self.capacity = capacity
        try:
            self.memory = mmap.mmap(fd, HEADER + capacity)
        finally:
            os.close(fd)
        self._read = ctypes.c_uint64.from_buffer(self.memory, 0)

    def packets(self, described: list[tuple]) -> list[Packet]:
        """The packets described (in the order kept), their memory given back to the writer."""
        memory, capacity = self.memory, self.capacity
        read = []
        for t, position, size, pts, dts, duration, key in described:
            at = HEADER + position % capacity
            read.append(Packet(t, memory[at:at + size], pts, dts, duration, key))
        if described:
            _, position, size, *_ = described[-1]
            self._read.value = position + size
        return read

    def close(self) -> None:
        del self._read
        self.memory.close()


def link_arena(source, arena: PacketArena) -> None:
    """The source keeps its packets in the arena too: in it alone where no clips ring keeps them, else beside
    the ring (each packet copied into both)."""
    ring = source.packet_ring
    if ring is None:
        source.packet_ring = arena
    else:
        ring.arena = arena
