"""Issue 67: 16 'source' threads wake 30 times a second and copy a packet (9 kB, a 150 kB keyframe every 30th)
into an arena, as PacketArena.add_from does, beside one busy Python thread (the post stage's stand-in); the copy
by ctypes.memmove (a CFUNCTYPE: it lets the GIL go) or by a PYFUNCTYPE of the same memmove (it keeps it). Prints
the copy's CPU time a packet on its thread's clock.

  python gil_memmove.py c|py [SECONDS]
"""

import ctypes
import mmap
import os
import sys
import threading
import time

MODE = sys.argv[1]
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 8.0
if MODE == "c":
    memmove = ctypes.memmove
else:
    signature = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    memmove = signature(ctypes._memmove_addr)
SOURCE = os.urandom(150_000)
ADDRESS = ctypes.cast(ctypes.c_char_p(SOURCE), ctypes.c_void_p).value


def source(stop: threading.Event, out: list) -> None:
    fd = os.memfd_create("arena")
    os.ftruncate(fd, 16_000_000)
    memory = mmap.mmap(fd, 16_000_000)
    base = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    ctypes.memset(base, 0, 16_000_000)
    spent, n, head, next_t = 0.0, 0, 0, time.monotonic()
    while not stop.is_set():
        next_t += 1 / 30
        delay = next_t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        size = 150_000 if n % 30 == 0 else 9_000
        started = time.thread_time()
        memmove(base + head % 15_000_000, ADDRESS, size)
        spent += time.thread_time() - started
        head += size
        n += 1
    out.append((n, spent))


def busy(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        for j in range(1000):
            x += j * j


stop, out = threading.Event(), []
threads = [threading.Thread(target=source, args=(stop, out)) for _ in range(16)]
threads.append(threading.Thread(target=busy, args=(stop,)))
for t in threads:
    t.start()
time.sleep(SECONDS)
stop.set()
for t in threads:
    t.join()
n = sum(o[0] for o in out)
print(f"{MODE}: the copy {sum(o[1] for o in out) / n * 1e6:.2f} us a packet on its thread's CPU clock ({n} packets)")
