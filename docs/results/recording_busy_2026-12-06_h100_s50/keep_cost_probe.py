"""Issue 67: what one step of keeping a packet costs a source's thread woken for its frame (16 threads, each
paced at 30 packets a second, as 16 cameras' source threads are), on its CPU clock. The packets are the 72-word
video's, demuxed once by PyAV into ctypes buffers (standing for NVDEC's demuxer buffer, read by address).

  python keep_cost_probe.py VIDEO MODE [ARENA_BYTES]
  MODE: noop (the two clock reads), zero (a ctypes copy of 0 bytes: the call alone), copy (the packet into the
        arena's memory, as PacketArena does), copy2 (the same copy twice: the second one warm), memview (a
        memoryview slice assignment instead: no ctypes call), add (PacketArena.add_from whole)
"""
import ctypes
import sys
import threading
import time

import av

from jetpipe.pipelines.ingest import packet_arena

VIDEO, MODE = sys.argv[1], sys.argv[2]
ROOM = int(sys.argv[3]) if len(sys.argv) > 3 else 15_000_000
with av.open(VIDEO) as container:
    PACKETS = [bytes(p) for p in container.demux(video=0) if p.size]
BUFFERS = [ctypes.create_string_buffer(b, len(b)) for b in PACKETS]


def source(stop: threading.Event, out: list) -> None:
    arena = packet_arena.PacketArena(16_000_000)
    arena.handed_over()
    base = ctypes.addressof(ctypes.c_char.from_buffer(arena.memory)) + packet_arena.HEADER
    spent, n, head, next_t = 0.0, 0, 0, time.monotonic()
    while not stop.is_set():
        for buffer in BUFFERS:
            if stop.is_set():
                break
            next_t += 1 / 30
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            size, address = len(buffer), ctypes.addressof(buffer)
            view = memoryview(buffer) if MODE == "memview" else None
            at = head % ROOM
            started = time.thread_time()
            if MODE == "zero":
                packet_arena._copy(base + at, address, 0)
            elif MODE == "copy":
                packet_arena._copy(base + at, address, size)
            elif MODE == "copy2":
                packet_arena._copy(base + at, address, size)
                packet_arena._copy(base + at, address, size)
            elif MODE == "memview":
                arena.memory[packet_arena.HEADER + at:packet_arena.HEADER + at + size] = view
            elif MODE == "add":
                arena.add_from(address, size, 0.0, 1, 1, 1, False)
            spent += time.thread_time() - started
            n += 1
            head += size
            if len(arena.packets) > 200:  # the recording process's reads give the room back
                described, _ = arena.take()
                arena._read.value = described[-1][1] + described[-1][2]
    out.append((n, spent))


stop, out = threading.Event(), []
threads = [threading.Thread(target=source, args=(stop, out)) for _ in range(16)]
for t in threads:
    t.start()
time.sleep(6)
stop.set()
for t in threads:
    t.join()
n = sum(o[0] for o in out)
print(f"{MODE}: {sum(o[1] for o in out) / n * 1e6:.2f} us a packet on its thread's CPU clock ({n} packets)")
