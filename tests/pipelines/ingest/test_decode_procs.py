"""Decode processes' serving side on the CPU: the batcher's wake through a pipe, credits, a reopened stream's
frame limit. The processes themselves (NVDEC, CUDA IPC) are tested on the GPU (test_video_gpu.py)."""

import pickle
import time
from multiprocessing.connection import wait as wait_for_any
from pathlib import Path
from types import SimpleNamespace

from jetpipe.pipelines.config import SourceConfig
from jetpipe.pipelines.ingest.batcher import Batcher, QueuedFrame
from jetpipe.pipelines.ingest.decode_procs import LIVE_CREDITS, RemoteNvdecSource, _Remote, _Waker
from jetpipe.pipelines.ingest.decoded_elsewhere import DecodedElsewhere
from jetpipe.pipelines.ingest.streams import Stream
from jetpipe.uri import parse
from jetpipe.video import FrameInfo

INFO = FrameInfo("nv12", 1080, 1920, "bt709", "limited", 30.0)


def _stream(slot: int, realtime: bool) -> Stream:
    source = RemoteNvdecSource(parse("/videos/a.mp4"), loop=True, realtime=realtime, info=INFO, remote_id=slot,
                               process=0)
    return Stream(slot, SourceConfig("/videos/a.mp4"), source, slot)


def _packet(stream: int, n: int) -> QueuedFrame:
    return QueuedFrame(stream, n, time.time(), frame=None, release=lambda: None)


def test_the_batcher_taking_a_frame_wakes_the_link_through_its_pipe_once():
    batcher, waker = Batcher(streams=2, max_batch=4, timeout_s=0.0, depth=4), _Waker()
    try:
        batcher.room_waiter(0, waker)
        assert wait_for_any([waker.read_fd], 0.05) == []
        for n in range(3):
            batcher.put(_packet(0, n))
        assert len(batcher.next_batch()) == 3  # three frames taken: three notifies, one wake
        assert wait_for_any([waker.read_fd], 1.0) == [waker.read_fd]
        waker.clear()
        assert wait_for_any([waker.read_fd], 0.05) == []
        batcher.put(_packet(0, 3))
        batcher.next_batch()
        assert wait_for_any([waker.read_fd], 1.0) == [waker.read_fd]  # woken again after the clear
    finally:
        waker.close()


def test_a_file_is_granted_its_queue_room_and_a_live_stream_two_slots():
    batcher = Batcher(streams=2, max_batch=8, timeout_s=0.0, depth=4)
    host = DecodedElsewhere(SimpleNamespace(batcher=batcher))
    file, live = _stream(0, realtime=False), _stream(1, realtime=True)
    assert host.credits_wanted(file, held=0) == 4
    assert host.credits_wanted(file, held=1) == 3
    for n in range(3):
        batcher.put(_packet(0, n))
    assert host.credits_wanted(file, held=1) == 0  # 3 queued + 1 being decoded: the queue's depth
    for n in range(4):  # a live stream's queue full: its oldest is dropped for a slot, not waited for
        batcher.put(_packet(1, n))
    assert host.credits_wanted(live, held=0) == LIVE_CREDITS
    assert host.credits_wanted(live, held=LIVE_CREDITS) == 0


def test_a_stream_opened_again_in_a_new_process_decodes_what_is_left_of_its_frame_limit():
    source = _stream(0, realtime=False).source
    remote = _Remote(source, limit=30, frames=12)
    assert pickle.loads(remote.open_message()[1:]) == ("open", 0, "/videos/a.mp4", True, False, 18)
    assert pickle.loads(_Remote(source, limit=0, frames=12).open_message()[1:])[-1] == 0  # no limit


def test_a_link_threads_cpu_time_is_read_from_another_thread():
    import sys
    import threading

    import pytest

    from jetpipe.pipelines.ingest.decode_procs import thread_cpu_seconds

    if not sys.platform.startswith("linux"):
        pytest.skip("a thread's CPU time is read from /proc")
    ready, done, spent = threading.Event(), threading.Event(), []

    def spin():
        spent.append(threading.get_native_id())
        while time.thread_time() < 0.3:  # a CPU-bound thread, as a busy link
            pass
        ready.set()
        done.wait(30)

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    assert ready.wait(60)
    measured = thread_cpu_seconds(spent[0])
    done.set()
    thread.join()
    assert 0.25 <= measured <= 2.0  # clock ticks of 10 ms; this thread spent 0.3 s
    # join() returns when Python's thread is done; the kernel's task may linger a moment (a loaded machine)
    task, deadline = Path(f"/proc/self/task/{spent[0]}"), time.monotonic() + 30
    while task.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert thread_cpu_seconds(None) == 0.0 and thread_cpu_seconds(spent[0]) == 0.0  # it ended
