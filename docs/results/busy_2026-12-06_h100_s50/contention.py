"""bench_post.py's replay beside N threads that wake 30 times a second and hold the GIL W us each (a source
thread's Python and a decode under the GIL): does the post stage's CPU per object grow with them?

  python contention.py N W_US -- BUNDLE [bench_post.py's arguments]
"""

import sys
import threading
import time

sys.path[:0] = ["scripts", "."]
N, HOLD_S = int(sys.argv[1]), float(sys.argv[2]) * 1e-6
sys.argv = ["bench_post.py", *sys.argv[4:]]
import bench_post  # noqa: E402

stop = threading.Event()


def source() -> None:
    next_t = time.monotonic()
    while not stop.is_set():
        next_t += 1 / 30
        delay = next_t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        started, x = time.thread_time(), 0
        while time.thread_time() - started < HOLD_S:
            for j in range(50):
                x += j


threads = [threading.Thread(target=source, daemon=True) for _ in range(N)]
for t in threads:
    t.start()
bench_post.main()
stop.set()
