"""A recording's packet arena: the source's copy into shared memory, what the recording process reads back out
of it, its room given back, and what is not kept where there is none."""

import os
from types import SimpleNamespace

import pytest

from jetpipe.pipelines.ingest.packet_arena import ArenaReader, PacketArena, arena_bytes, link_arena
from jetpipe.pipelines.ingest.packet_ring import PacketRing, shared_ring
from jetpipe.pipelines.outputs.recording.child import ForwardedRing
from jetpipe.video import Packet


def _packet(n: int, size: int = 100, key: bool = False, t: float | None = None) -> Packet:
    return Packet(n / 10 if t is None else t, bytes([n % 256]) * size, n, n, 1, key)


def _pair(capacity: int) -> tuple[PacketArena, ArenaReader]:
    """An arena and a reader of it, as the recording process maps it (its own descriptor)."""
    arena = PacketArena(capacity)
    reader = ArenaReader(os.dup(arena.fd), capacity)
    arena.handed_over()
    return arena, reader


def test_packets_read_back_as_kept_and_across_the_arenas_end():
    arena, reader = _pair(1300)
    try:
        sent = [_packet(n, size=300, key=n % 3 == 0) for n in range(9)]
        read = []
        for k in range(0, 9, 3):  # three at a time, as passes read them
            for p in sent[k:k + 3]:
                arena.add(p)
            described, ended = arena.take()
            assert not ended and len(described) == 3
            read += reader.packets(described)
        assert read == sent and arena.lost == 0
        # 0-900; 900, 1200 would cross the end: 1300 (0 again); 1900, 2200, 2500 would cross it: 2600
        assert arena.read_to() == arena.head == 2900
    finally:
        reader.close()


def test_a_full_arena_keeps_nothing_until_the_next_keyframe_and_counts_it():
    arena, reader = _pair(1000)
    try:
        for n in range(4):  # 800 bytes: none read yet
            arena.add(_packet(n, size=200, key=n == 0))
        arena.add(_packet(4, size=240))         # no room (not too large: a quarter is 250)
        arena.add(_packet(5, size=100))         # there would be room: its GOP lost its packet before it
        read = reader.packets(arena.take()[0])  # the room comes back
        arena.add(_packet(6, size=100))         # still the broken GOP
        arena.add(_packet(7, size=100, key=True))
        later = reader.packets(arena.take()[0])
        assert [p.pts for p in read] == [0, 1, 2, 3] and [p.pts for p in later] == [7]
        assert arena.lost == 3
        arena.add(_packet(8, size=300))         # a quarter of the arena at most
        assert arena.lost == 4 and not arena.take()[0]
    finally:
        reader.close()


def test_a_packet_is_never_written_over_what_the_reader_has_not_read():
    """The writer reads the reader's position only where the room it knows of is short: room given back is seen
    then, and what is unread is never overwritten, however far the positions have gone round."""
    arena, reader = _pair(1000)
    try:
        for lap in range(3):
            sent = [_packet(10 * lap + n, size=200, key=n == 0) for n in range(6)]
            for p in sent:  # five fill the arena; the sixth would go over the first, unread
                arena.add(p)
            assert arena.lost == lap + 1
            assert reader.packets(arena.take()[0]) == sent[:5]
            arena.add(_packet(99, size=200, key=True))  # the room came back: it starts the next lap
            assert reader.packets(arena.take()[0])[0].pts == 99 and arena.lost == lap + 1
    finally:
        reader.close()


def test_a_removed_streams_arena_keeps_nothing_more_and_an_end_is_said_once():
    arena = PacketArena(1000)
    arena.handed_over()
    arena.add(_packet(0, key=True))
    arena.end()
    assert arena.take() == ([(0.0, 0, 100, 0, 0, 1, True)], True)
    assert arena.take() == ([], False)
    arena.stop()
    arena.add(_packet(1, key=True))
    assert arena.take() == ([], False) and arena.lost == 1


def test_the_arena_is_sized_by_the_streams_bit_rate_within_the_rings_bound():
    assert arena_bytes(0.0, 64_000_000) == 16_000_000            # a camera's: unknown
    assert arena_bytes(40e6, 64_000_000) == 40_000_000           # 8 s of 40 Mbit/s
    assert arena_bytes(200e6, 64_000_000) == 64_000_000          # ring_mb
    assert arena_bytes(0.0, 8_000_000) == 8_000_000


def test_a_clips_ring_made_after_the_arena_keeps_it_and_copies_each_packet_into_it():
    source = SimpleNamespace(packet_ring=None, source_uri=SimpleNamespace(location="in.mp4"))
    arena = PacketArena(10_000)
    arena.handed_over()
    link_arena(source, arena)
    arena.time_base = 1 / 90000
    ring = shared_ring(source, 5.0, 10**6)
    assert source.packet_ring is ring and ring.arena is arena and ring.time_base == arena.time_base
    ring.add(_packet(0, key=True))
    ring.add_from(b"x" * 50, 50, 0.1, 1, 1, 1, False)
    assert [d[2] for d in arena.take()[0]] == [100, 50] and len(ring.between(0.0, 1.0)) == 2
    other = SimpleNamespace(packet_ring=PacketRing(5.0, 10**6, "in.mp4", None))
    link_arena(other, arena)  # clips first (the daemon's order): the arena beside the ring
    assert other.packet_ring.arena is arena


def test_the_recording_processs_ring_makes_whole_gops_and_keeps_a_looped_files_passes_apart():
    ring = ForwardedRing("in.mp4", 10**6)
    for n in range(6):  # a pass: two GOPs, then its clock goes back
        ring.add(_packet(n, key=n % 3 == 0, t=float(n)))
    ring.add(_packet(9, key=False, t=0.0))  # the new pass's first packet is no keyframe: not kept
    ring.add(_packet(10, key=True, t=0.1))
    ring.add(_packet(11, t=0.2))
    generation, gops = ring.whole_gops_after(float("-inf"))
    assert generation == 0 and [[p.pts for p in g.packets] for g in gops] == [[0, 1, 2], [3, 4, 5]]
    ring.pin(None, gops[-1].start)  # written
    ring.close_gop()  # its stream ended
    generation, gops = ring.whole_gops_after(float("-inf"))
    assert generation == 1 and [[p.pts for p in g.packets] for g in gops] == [[10, 11]]


def test_every_keeper_a_source_may_hold_copies_a_packet_out_of_a_demuxers_buffer():
    """NVDEC's source hands its ring the demuxer's buffer (add_from), timed (clock, clocked): the clips ring, the
    recording's arena, and a decode process's batch all take it, copied (the buffer is reused after)."""
    import ctypes

    from jetpipe.runtime.nvdec_procs import PacketBatch

    buffer = ctypes.create_string_buffer(b"\x00\x00\x00\x01e" + b"p" * 95, 100)
    arena = PacketArena(10_000)
    reader = ArenaReader(os.dup(arena.fd), 10_000)
    arena.handed_over()
    ring, batch = PacketRing(5.0, 10**6, "in.mp4", None), PacketBatch()
    try:
        for keeper in (ring, arena, batch):
            started = keeper.clock()
            keeper.add_from(ctypes.addressof(buffer), 100, 0.5, 45000, 45000, 3000, True)
            keeper.clocked(started)
        kept = bytes(buffer)
        buffer[4] = b"x"  # the demuxer's next packet
        assert ring.between(0.0, 1.0)[0].data == kept
        assert reader.packets(arena.take()[0])[0] == Packet(0.5, kept, 45000, 45000, 3000, True)
        assert batch.take()[2] == [(0.5, kept, 45000, 45000, 3000, True)]
    finally:
        reader.close()


def _resident_bytes(address: int) -> int | None:
    """The resident bytes of the mapping holding address (/proc/self/smaps), None where it cannot be read."""
    try:
        lines = open("/proc/self/smaps").read().splitlines()
    except OSError:
        return None
    inside = False
    for line in lines:
        head = line.split()[0]
        if "-" in head and ":" not in head:  # a mapping's first line: its address range
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and head == "Rss:":
            return int(line.split()[1]) * 1024
    return None


def test_the_arenas_memory_is_taken_when_it_is_made_not_by_the_frames():
    """A page's first write is a fault that allocates and zeroes it (45 us a packet on an H100 host, against ~4 for
    written pages): the constructor touches all of it."""
    import ctypes

    arena = PacketArena(4_000_000)
    arena.handed_over()
    resident = _resident_bytes(ctypes.addressof(ctypes.c_char.from_buffer(arena.memory)))
    if resident is None:
        pytest.skip("needs Linux's /proc/self/smaps")
    assert resident >= 4_000_000


def test_the_copy_into_the_arena_keeps_the_gil():
    """ctypes.memmove lets the GIL go for its copy, and taking it back among a busy process's threads cost a
    source's thread several times the copy. Another thread ready to run must not run while packets are copied:
    the switch interval is set long (no waiting thread asks for the GIL), so only a call that lets the GIL go lets
    it in, and a 4-MB copy is long enough for it to come in then."""
    import ctypes
    import sys
    import threading

    arena, reader = _pair(16_000_000)
    buffer = ctypes.create_string_buffer(4_000_000)
    go, ran = threading.Event(), []
    other = threading.Thread(target=lambda: (go.wait(), ran.append(True)))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    copied = 0
    try:
        other.start()  # it runs until it blocks in go.wait()
        go.set()  # it is ready now and waits for the GIL
        while copied < 50 and not ran:
            arena.add_from(ctypes.addressof(buffer), 4_000_000, copied / 30, copied, copied, 1, True)
            reader.packets(arena.take()[0])  # the room given back
            copied += 1
        ran_while_copying = bool(ran)
    finally:
        sys.setswitchinterval(interval)
        go.set()
        other.join()
        reader.close()
    assert not ran_while_copying, f"another thread ran during copy {copied}"
    assert copied == 50 and arena.lost == 0
