import threading
import time

from jetpipe.pipelines.batcher import Batcher, Packet


def _packet(stream, n, released):
    return Packet(stream, n, time.time(), frame=None, release=lambda: released.append((stream, n)))


def test_drop_oldest_bounds_memory_and_counts():
    released = []
    b = Batcher(streams=2, max_batch=4, timeout_s=0.0, depth=3)
    for n in range(10):
        b.put(_packet(0, n, released))
    assert b.depths() == [3, 0]
    assert b.dropped == [7, 0]
    assert released == [(0, n) for n in range(7)]  # the oldest frames, slots freed
    assert [p.frame_no for p in b.next_batch()] == [7, 8, 9]


def test_round_robin_across_streams():
    b = Batcher(streams=3, max_batch=4, timeout_s=0.0, depth=10)
    for s in range(3):
        for n in range(3):
            b.put(_packet(s, n, []))
    batch = b.next_batch()
    assert [(p.stream, p.frame_no) for p in batch] == [(0, 0), (1, 0), (2, 0), (0, 1)]


def test_waits_for_a_full_batch_up_to_the_timeout():
    b = Batcher(streams=1, max_batch=4, timeout_s=0.2, depth=10)
    b.put(_packet(0, 0, []))
    threading.Timer(0.05, lambda: [b.put(_packet(0, n, [])) for n in (1, 2, 3)]).start()
    start = time.monotonic()
    assert len(b.next_batch()) == 4
    assert time.monotonic() - start < 0.2  # full before the timeout
    b.put(_packet(0, 9, []))
    start = time.monotonic()
    assert len(b.next_batch()) == 1 and time.monotonic() - start >= 0.19  # partial after it


def test_close_drains_then_signals_the_end():
    b = Batcher(streams=1, max_batch=2, timeout_s=1.0, depth=10)
    for n in range(3):
        b.put(_packet(0, n, []))
    b.close()
    assert len(b.next_batch()) == 2 and len(b.next_batch()) == 1
    assert b.next_batch() is None


def test_a_frame_that_queued_while_the_gpu_was_busy_does_not_wait_again():
    """The wait for a full batch counts from the oldest frame's capture: a frame that has waited longer than
    the timeout already goes at once (it waited a whole timeout more: 20 s here)."""
    b = Batcher(streams=1, max_batch=4, timeout_s=20.0, depth=10)
    old = _packet(0, 0, [])
    old.t_monotonic -= 25.0  # captured 25 s ago, while the GPU stage was busy
    b.put(old)
    batches, done = [], threading.Event()
    threading.Thread(target=lambda: (batches.append(b.next_batch()), done.set()), daemon=True).start()
    assert done.wait(10), "the batcher held a frame older than its timeout"
    assert [p.frame_no for p in batches[0]] == [0]
