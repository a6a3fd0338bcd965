import threading
import time

import pytest

from jetpipe.pipelines.ingest.batcher import Batcher, QueuedFrame


def _packet(stream, n, released):
    return QueuedFrame(stream, n, time.time(), frame=None, release=lambda: released.append((stream, n)))


def test_drop_oldest_bounds_memory_and_counts():
    released = []
    b = Batcher(streams=2, max_batch=4, timeout_s=0.0, depth=3)
    for n in range(10):
        b.put(_packet(0, n, released))
    assert b.depths() == [3, 0]
    assert b.dropped == [7, 0]
    assert released == [(0, n) for n in range(7)]  # the oldest frames, slots freed
    assert [p.frame_no for p in b.next_batch()] == [7, 8, 9]


def _timed(stream, n, captured_at, pts):
    return QueuedFrame(stream, n, time.time(), frame=None, release=lambda: None, pts=pts, t_monotonic=captured_at,
                       live=True)


def test_the_drops_of_a_backlog_coming_at_once_are_told_from_an_overloads():
    """A camera's frames captured 1 ms apart though they are 33 ms apart in its own time (what it sent while it
    was being opened, coming at once): its queue's drops are counted as catching up. A camera delivering at its
    rate into a full queue (processing behind) drops as an overload; so does one without times, and one whose
    times went back (a looped file's next pass)."""
    b = Batcher(streams=4, max_batch=8, timeout_s=0.0, depth=4)
    for n in range(20):
        b.put(_timed(0, n, 100.0 + n * 0.001, n / 30))            # a backlog: 1 ms apart
        b.put(_timed(1, n, 100.0 + n / 30, n / 30))               # live pace, nothing taken
        b.put(_timed(2, n, 100.0 + n * 0.001, None))              # no times
        b.put(_timed(3, n, 100.0 + n * 0.001, (19 - n) / 30))     # times going back
    assert b.dropped == [16, 16, 16, 16]
    assert b.dropped_catching_up == [16, 0, 0, 0]
    assert b.drop_oldest(0) and b.dropped_catching_up[0] == 17  # a slot needed during the backlog: the same
    assert b.drop_oldest(1) and b.dropped_catching_up[1] == 0
    b.reset(0)
    assert b.dropped[0] == b.dropped_catching_up[0] == 0


def test_a_backlogs_tail_coming_nearer_real_time_is_still_the_backlogs_and_an_overload_after_it_is_not():
    """Within a second of a stream's last drop of frames that came at once, its drops at about real time are
    that backlog's tail; after it they are an overload's, and they do not extend the tail."""
    b = Batcher(streams=1, max_batch=8, timeout_s=0.0, depth=4)
    for n in range(8):  # a backlog: 1 ms apart
        b.put(_timed(0, n, 100.0 + n * 0.001, n / 30))
    assert b.dropped == b.dropped_catching_up == [4]
    for n in range(8, 40):  # then at its rate from 100.1 s, nothing taken: the tail, then an overload
        b.put(_timed(0, n, 100.1 + (n - 8) / 30, n / 30))
    assert b.dropped == [36]
    assert b.dropped_catching_up == [4 + 28]  # frames 8-35 (within 1 s of the last backlog drop), not 36-39


def test_frames_shed_for_the_budget_or_at_a_stop_are_not_a_backlogs_even_after_one():
    """Only a full queue's drops are classed: after a stream's backlog, the frames shed because they are past the
    latency budget, and those dropped at a stop (abort), count as dropped, not as catching up."""
    b = Batcher(streams=1, max_batch=8, timeout_s=0.0, depth=4, budget_s=0.5)
    for n in range(8):  # a backlog, long past: its last 4 queued frames are beyond the budget now
        b.put(_timed(0, n, 100.0 + n * 0.001, n / 30))
    assert b.dropped == b.dropped_catching_up == [4]
    assert b.next_batch(poll_s=0.0) == []  # the 4 queued are shed
    assert b.dropped == [8] and b.dropped_catching_up == [4]
    b.put(_timed(0, 8, 100.1, 8 / 30))
    assert b.abort() == 1 and b.dropped == [9] and b.dropped_catching_up == [4]


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


def test_a_partial_batch_is_held_while_the_device_has_a_batch_waiting_and_frames_join_it():
    """Past its timeout, a partial batch is not cut while the device has two batches it has not finished (one
    running, one waiting): it could not start sooner, and the frames that come meanwhile join it. Once one is
    done, it is cut at once with them."""
    running = [2]
    b = Batcher(streams=4, max_batch=4, timeout_s=0.01, depth=10, batches_running=lambda: running[0])
    b.put(_packet(0, 0, []))
    batches, done = [], threading.Event()
    threading.Thread(target=lambda: (batches.append(b.next_batch()), done.set()), daemon=True).start()
    time.sleep(0.1)  # ten timeouts
    assert not done.is_set()
    b.put(_packet(1, 0, []))
    b.put(_packet(2, 0, []))
    running[0] = 1  # the running batch ended: the waiting one runs, this one goes behind it
    assert done.wait(10), "the batch was held after the device could take it"
    assert [p.stream for p in batches[0]] == [0, 1, 2] and b.held == 1


def test_a_full_batch_goes_at_once_and_a_partial_one_at_its_timeout_where_the_device_keeps_up():
    running = [3]
    b = Batcher(streams=4, max_batch=2, timeout_s=0.05, depth=10, batches_running=lambda: running[0])
    b.put(_packet(0, 0, []))
    b.put(_packet(1, 0, []))
    assert len(b.next_batch()) == 2  # full: however busy the device
    running[0] = 1
    b.put(_packet(0, 1, []))
    start = time.monotonic()
    assert len(b.next_batch()) == 1 and time.monotonic() - start < 5 and b.held == 0


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


def test_the_cut_keeps_the_oldest_frame_within_its_budget_on_a_simulated_clock():
    from jetpipe.pipelines.ingest.batcher import cut_deadline

    engine = {1: 0.008, 2: 0.010, 3: 0.012, 4: 0.014}.__getitem__  # seconds per batch size
    # a full batch is never held
    assert cut_deadline(100.0, 4, 4, 0.5, 0.066, engine, 100.001) == float("-inf")
    # frames every 2 ms (16 cameras at 30 fps): wait while one more frame's batch still fits the budget
    assert cut_deadline(100.0, 2, 4, 0.5, 0.066, engine, 100.002) == 100.0 + 0.066 - 0.012
    # the next frame is not expected before that moment: cut now, waiting would only add latency
    assert cut_deadline(100.0, 1, 4, 0.5, 0.066, engine, 100.033) == 100.0 + 0.066 - 0.010  # 100.033 comes first
    assert cut_deadline(100.0, 1, 4, 0.5, 0.030, engine, 100.033) == float("-inf")
    # batch_timeout stays the upper bound; without a budget it alone decides (as before)
    assert cut_deadline(100.0, 1, 4, 0.005, 0.066, engine, 100.001) == 100.005
    assert cut_deadline(100.0, 1, 4, 0.005, None, engine, 1e9) == 100.005
    # an engine slower than the budget: cut at once
    assert cut_deadline(100.0, 1, 4, 0.5, 0.066, {2: 0.1}.__getitem__, 100.001) == float("-inf")


def test_a_batch_is_no_larger_than_the_budget_allows_by_the_engines_measured_times():
    """An engine that took 1.4 s for 8 frames (the CPU runtime) and a 1 s budget, half of it for a batch's run
    (a frame may wait for the batch ahead, then run in its own): 8 queued frames go in batches of 2 (0.35 s),
    each cut at once as a full one; once batches of 2 are measured at 0.2 s, of 5. Without a budget, or where
    the largest batch fits it (a GPU: 8 ms against 66), batches stay whole."""
    from jetpipe.pipelines.ingest.batcher import budget_batch

    b = Batcher(streams=1, max_batch=8, timeout_s=60.0, depth=16, budget_s=1.0)
    b.record_batch(8, 1.4)
    for n in range(8):
        b.put(QueuedFrame(0, n, time.time(), None, lambda: None))
    start = time.monotonic()
    assert [len(b.next_batch()) for _ in range(4)] == [2, 2, 2, 2] and time.monotonic() - start < 30
    b.record_batch(2, 0.2)
    assert b.batch_cap == 5
    engine = [0.0] * 9
    engine[8] = 0.008
    assert budget_batch(engine, 0.066) == 8 and budget_batch([0.0] * 9, 0.01) == 8  # nothing measured yet
    assert budget_batch(engine, 0.015) == 7 and budget_batch(engine, 0.001) == 1
    free = Batcher(streams=1, max_batch=8, timeout_s=60.0, depth=16)
    free.record_batch(8, 1.4)
    for n in range(8):
        free.put(QueuedFrame(0, n, time.time(), None, lambda: None))
    assert len(free.next_batch()) == 8 and free.batch_cap == 8


def test_a_budgeted_batcher_cuts_a_partial_batch_when_no_frame_would_come_in_time():
    released = []
    b = Batcher(streams=1, max_batch=4, timeout_s=60.0, depth=10, budget_s=1.0)
    b.record_batch(2, 0.1)
    now = time.monotonic()
    for age in (20.0, 10.0):  # frames 10 s apart: the arrival rate the batcher learns
        b.put(QueuedFrame(0, int(age), time.time(), None, lambda: None, t_monotonic=now - age))
        assert len(b.next_batch()) == 1
    b.put(QueuedFrame(0, 3, time.time(), None, lambda: released.append(3), t_monotonic=time.monotonic()))
    start = time.monotonic()
    batch = b.next_batch()
    # the next frame is 10 s away and the budget 1 s: cut now, not after the 60 s timeout
    assert [p.frame_no for p in batch] == [3] and time.monotonic() - start < 30


def test_a_budgeted_batcher_waits_for_frames_that_arrive_within_the_budget():
    b = Batcher(streams=2, max_batch=4, timeout_s=60.0, depth=10, budget_s=30.0)
    b.record_batch(4, 0.1)
    now = time.monotonic()
    for n in range(2):  # frames 10 ms apart: the rate it learns; the next is due long before the budget ends
        b.put(QueuedFrame(0, n, time.time(), None, lambda: None, t_monotonic=now - 0.01 + 0.01 * n))
    got = []
    taker = threading.Thread(target=lambda: got.append(b.next_batch()))
    taker.start()
    for n in range(2):
        b.put(QueuedFrame(1, n, time.time(), None, lambda: None))
    taker.join(60)
    assert sorted((p.stream, p.frame_no) for p in got[0]) == [(0, 0), (0, 1), (1, 0), (1, 1)]  # full, not 2


def _bursts(b: Batcher, streams: int, period: float, bursts: int, end: float) -> None:
    """Cameras started together: every `period`, one frame from each stream within a millisecond; the last
    burst ends at `end` (monotonic). Each burst is taken as one batch."""
    for k in range(bursts):
        start = end - (bursts - 1 - k) * period - 0.001
        for s in range(streams):
            b.put(QueuedFrame(s, k, time.time(), None, lambda: None, t_monotonic=start + s * 0.001 / streams))
        if k < bursts - 1:
            assert len(b.next_batch()) == streams


def test_after_a_burst_from_every_stream_the_budget_does_not_wait_for_the_next_one():
    """Four cameras in step, a frame each every 10 s (simulated): once a burst is in, no frame is due for 10 s,
    so the partial batch is cut at once, not held until the budget's deadline (before: the arrival rate was
    one average gap over all streams, short inside bursts, and the batcher waited out its 5 s)."""
    b = Batcher(streams=4, max_batch=8, timeout_s=60.0, depth=10, budget_s=5.0)
    b.record_batch(5, 0.1)
    _bursts(b, streams=4, period=10.0, bursts=3, end=time.monotonic())
    got, done = [], threading.Event()
    threading.Thread(target=lambda: (got.append(b.next_batch()), done.set()), daemon=True).start()
    assert done.wait(2.5), "the batcher held a burst waiting for a frame not due for 10 s"
    assert len(got[0]) == 4


def test_in_the_middle_of_a_burst_the_budget_waits_for_the_streams_that_are_due():
    b = Batcher(streams=4, max_batch=4, timeout_s=60.0, depth=10, budget_s=30.0)
    b.record_batch(4, 0.1)
    now = time.monotonic()
    _bursts(b, streams=4, period=1.0, bursts=3, end=now - 1.0)  # the third burst taken, 1 s ago
    for s in range(2):  # the next burst has begun: streams 2 and 3 are due now
        b.put(QueuedFrame(s, 9, time.time(), None, lambda: None))
    got = []
    taker = threading.Thread(target=lambda: got.append(b.next_batch()))
    taker.start()
    for s in (2, 3):
        b.put(QueuedFrame(s, 9, time.time(), None, lambda: None))
    taker.join(60)
    assert sorted(p.stream for p in got[0]) == [0, 1, 2, 3]


def test_a_stream_that_stopped_is_not_waited_for():
    """A stream overdue by more than its interval (ended, stalled, removed) does not hold batches open."""
    b = Batcher(streams=2, max_batch=4, timeout_s=60.0, depth=10, budget_s=5.0)
    b.record_batch(2, 0.1)
    now = time.monotonic()
    for n in range(3):  # stream 0: every 100 ms, then nothing for 20 s
        b.put(QueuedFrame(0, n, time.time(), None, lambda: None, t_monotonic=now - 20.2 + 0.1 * n))
    assert len(b.next_batch()) == 3
    b.put(QueuedFrame(1, 0, time.time(), None, lambda: None))
    got, done = [], threading.Event()
    threading.Thread(target=lambda: (got.append(b.next_batch()), done.set()), daemon=True).start()
    assert done.wait(2.5), "the batcher waited for a stream silent for 20 s"


def test_a_full_batch_is_taken_at_once_while_capture_threads_wait_for_room():
    """Files at saturation (issue 27): every capture thread waits for room in its full queue while the taker
    waits for a full batch. The frame that fills the batch must wake the taker, not a capture thread: with
    one condition for both, its notify() woke the longest waiting, a capture thread, and the full batch
    waited out the taker's deadline (here 30 s; batch_timeout_ms in a pipeline, every batch)."""
    b = Batcher(streams=3, max_batch=3, timeout_s=30.0, depth=1)
    for s in range(2):
        b.put(QueuedFrame(s, 0, time.time(), None, lambda: None))
    blocked = [threading.Thread(target=b.put, args=(QueuedFrame(s, 1, time.time(), None, lambda: None), True),
                                daemon=True) for s in range(2)]
    for t in blocked:
        t.start()  # both queues are full: these wait for room
    got, done = [], threading.Event()
    threading.Thread(target=lambda: (got.append(b.next_batch()), done.set()), daemon=True).start()
    time.sleep(0.02)  # the taker waits for its third frame (not a window the test depends on: it only orders)
    b.put(QueuedFrame(2, 0, time.time(), None, lambda: None))
    assert done.wait(10), "the frame that filled the batch woke a capture thread instead of the taker"
    assert sorted(p.stream for p in got[0]) == [0, 1, 2]
    for t in blocked:  # room made: each capture thread queued its frame
        t.join(10)
        assert not t.is_alive()


def test_under_a_budget_a_live_frame_already_too_old_is_shed_and_a_files_is_kept():
    """Overload (issue 27): a camera's frame that waited longer than the budget is dropped when its batch is
    taken (counted, its slot freed), so the frames behind it are not late too; a file's (no --realtime) is run."""
    released = []
    b = Batcher(streams=3, max_batch=4, timeout_s=0.0, depth=4, budget_s=0.05)
    old = time.monotonic() - 1.0
    b.put(QueuedFrame(0, 0, time.time(), None, lambda: released.append("camera old"), t_monotonic=old, live=True))
    b.put(QueuedFrame(1, 0, time.time(), None, lambda: released.append("file old"), t_monotonic=old, live=False))
    b.put(QueuedFrame(2, 0, time.time(), None, lambda: released.append("camera new"), live=True))
    batch = b.next_batch()
    assert sorted((p.stream, p.frame_no) for p in batch) == [(1, 0), (2, 0)]
    assert released == ["camera old"] and b.dropped == [1, 0, 0]


def test_without_a_budget_nothing_is_shed_for_its_age():
    b = Batcher(streams=1, max_batch=4, timeout_s=0.0, depth=4)
    b.put(QueuedFrame(0, 0, time.time(), None, lambda: None, t_monotonic=time.monotonic() - 100.0, live=True))
    assert len(b.next_batch()) == 1 and b.dropped == [0]


def test_the_daemon_learns_its_engine_times_under_a_budget(det_bundle):
    from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
    from jetpipe.pipelines.service.daemon import Pipeline

    config = validate(PipelineConfig(bundle=det_bundle, sources=[SourceConfig("synthetic://320x240@10/nv12")],
                                     frames=12, metrics_listen="", backend="onnxruntime-cpu", latency_budget_ms=500))
    pipeline = Pipeline(config)
    summary = pipeline.run()
    assert summary["latency_budget_ms"] == 500 and sum(summary["processed"]) + sum(summary["dropped"]) == 12
    assert any(t > 0 for t in pipeline.batcher.engine_s)  # measured from the batches it ran


def test_a_budget_the_models_own_run_breaks_is_said_and_the_freshest_frames_still_run():
    b = Batcher(streams=1, max_batch=4, timeout_s=0.0, depth=4, budget_s=0.1)
    why = b.plan({1: 0.104, 2: 0.2})
    assert why is not None and "one frame takes the model 104 ms" in why and "at least 208 ms" in why
    assert b.engine_s[1] == pytest.approx(0.104) and b.batch_cap == 1
    b.put(QueuedFrame(0, 0, time.time(), None, lambda: None, t_monotonic=time.monotonic() - 0.01, live=True))
    assert len(b.next_batch()) == 1  # the model is warned about, its freshest frames still run
    assert Batcher(streams=1, max_batch=4, timeout_s=0.0, depth=4, budget_s=0.5).plan({1: 0.1}) is None
    assert Batcher(streams=1, max_batch=4, timeout_s=0.0, depth=4).plan({1: 0.1}) is None  # no budget


def test_the_cpu_runtime_times_its_batches_before_serving(det_bundle, caplog):
    """The daemon plans a budget from the model's time measured at start-up, and says at once when one frame's
    run takes more than half of it."""
    from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
    from jetpipe.pipelines.service.daemon import Pipeline
    from jetpipe.runtime.cpu_runtime import CpuRuntime

    with CpuRuntime(det_bundle, max_batch=4) as runtime:
        times = runtime.engine_times((1, 2, 9))
    assert sorted(times) == [1, 2, 4] and all(t > 0 for t in times.values())
    config = validate(PipelineConfig(bundle=det_bundle, sources=[SourceConfig("synthetic://320x240@10/nv12")],
                                     frames=2, metrics_listen="", backend="onnxruntime-cpu", latency_budget_ms=1))
    pipeline = Pipeline(config)
    try:
        assert pipeline.batcher.engine_s[1] > 0 and pipeline.batcher.engine_s[2] > 0  # before any frame
        assert any("the latency budget of 1 ms cannot be held" in r.getMessage() for r in caplog.records)
    finally:
        pipeline.close()


def test_a_stream_whose_old_frame_is_shed_keeps_its_turn_with_its_next():
    """Fairness under overload (issue 49 item 3): the stream whose turn it is loses its frames that cannot make
    the budget, and its next frame runs in that turn, ahead of other streams' fresh frames; shedding used to
    end the turn, so a stream whose frames came just after another's lost every turn."""
    released = []
    b = Batcher(streams=2, max_batch=1, timeout_s=0.0, depth=4, budget_s=0.1)
    b.plan({1: 0.01})
    now = time.monotonic()
    b.put(QueuedFrame(0, 0, time.time(), None, lambda: released.append((0, 0)), t_monotonic=now - 0.3, live=True))
    b.put(QueuedFrame(0, 1, time.time(), None, lambda: released.append((0, 1)), t_monotonic=now, live=True))
    b.put(QueuedFrame(1, 0, time.time(), None, lambda: released.append((1, 0)), t_monotonic=now, live=True))
    assert [(p.stream, p.frame_no) for p in b.next_batch()] == [(0, 1)]
    assert released == [(0, 0)] and [(p.stream, p.frame_no) for p in b.next_batch()] == [(1, 0)]
