"""What a packet's copy into a recording arena costs the source's thread, into pages never written (a memfd's page
is allocated and zeroed at its first write) and into pages written once before. 600 packets (15 kB, a 150 kB
keyframe every 30: ~12 MB, so a 16-MB arena never comes round), timed on the thread's CPU clock. Since the arena's
constructor touches every page itself (session 48), both arms read the same; before, "fresh" was 23-40 us and
"prefaulted" 3.8-4.4 us on the 2-core machine.

    python docs/results/recording_arena_2026-12-06/arena_fault_microtest.py   # from the repository's root
"""

import ctypes
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from jetpipe.pipelines.ingest.packet_arena import PacketArena  # noqa: E402

source = ctypes.create_string_buffer(150_000)
address = ctypes.addressof(source)


def run(prefault: bool) -> float:
    arena = PacketArena(16_000_000)
    if prefault:
        ctypes.memset(ctypes.addressof(ctypes.c_char.from_buffer(arena.memory)), 0, len(arena.memory))
    started = time.thread_time()
    for i in range(600):
        size = 150_000 if i % 30 == 0 else 15_000
        arena.add_from(address, size, i / 30, i, i, 1, i % 30 == 0)
    spent = time.thread_time() - started
    arena.take()
    arena.handed_over()
    return spent / 600 * 1e6


for _ in range(3):
    print("fresh", round(run(False), 2), "prefaulted", round(run(True), 2), "us/packet")
