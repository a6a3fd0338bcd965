"""Capture threads shared by several streams (issue 27: fewer threads taking the GIL per frame)."""

import threading
import time
from types import SimpleNamespace

import numpy as np

from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
from jetpipe.pipelines.ingest.batcher import Batcher, QueuedFrame
from jetpipe.pipelines.ingest.capture import ROOM, CaptureGroup
from jetpipe.pipelines.ingest.sources import SyntheticCamera
from jetpipe.pipelines.service.daemon import Pipeline

WAIT_S = 60  # a loaded 2-core machine: conditions are waited for, never a fixed window


def _group(batcher, stop=None):
    def start(target, name):
        threading.Thread(target=target, name=name, daemon=True).start()

    return CaptureGroup("capture-test", batcher.room_condition(), batcher.has_room, stop or threading.Event(), start)


def _handle(slot):
    return SimpleNamespace(slot=slot, stop=threading.Event())


def _file(batcher, slot, frames, readers):
    """A file's capture as the daemon steps it: every frame kept, waiting for room instead of dropping."""
    for n in range(frames):
        while not batcher.has_room(slot):
            yield ROOM
        readers.add(threading.get_ident())
        batcher.put(QueuedFrame(slot, n, time.time(), frame=None, release=lambda: None), wait=True)
        yield 0.0


def _take_all(batcher, expected):
    taken = []
    deadline = time.monotonic() + WAIT_S
    while len(taken) < expected and time.monotonic() < deadline:
        taken += batcher.next_batch() or []
    return taken


def test_one_thread_reads_several_files_in_turn_and_keeps_every_frame():
    batcher = Batcher(3, max_batch=2, timeout_s=0.001, depth=1)
    group, readers = _group(batcher), set()
    for slot in range(3):
        batcher.room_waiter(slot, group.room)
        group.add(_handle(slot), _file(batcher, slot, 40, readers))
    taken = _take_all(batcher, 120)
    assert len(taken) == 120
    for slot in range(3):  # each stream's frames in order, none dropped: files wait for room
        assert [p.frame_no for p in taken if p.stream == slot] == list(range(40))
    assert batcher.dropped == [0, 0, 0]
    assert len(readers) == 1  # one thread read the three streams


def test_a_stream_waiting_for_its_turn_holds_no_other_and_a_stop_ends_it_at_once():
    batcher, stop = Batcher(2, max_batch=4, timeout_s=0.001, depth=2), threading.Event()
    group, readers, resumed = _group(batcher, stop), set(), []

    def slow(handle):
        yield 3600.0  # a reconnect's backoff, say
        resumed.append(stop.is_set())

    batcher.room_waiter(1, group.room)
    group.add(_handle(0), slow(_handle(0)))
    group.add(_handle(1), _file(batcher, 1, 30, readers))
    assert len(_take_all(batcher, 30)) == 30  # the waiting stream held nothing up
    assert resumed == []
    stop.set()
    group.wake()
    deadline = time.monotonic() + WAIT_S
    while len(group) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert resumed == [True] and len(group) == 0  # stepped at the stop, not after its hour


def test_a_synthetic_camera_paced_by_its_capture_thread_does_not_sleep_in_its_read():
    camera = SyntheticCamera(64, 48, fps=1.0, fmt="nv12")
    camera.paced_by_caller = True
    camera.open()
    assert camera.due_in() > 0.5  # its first frame is a frame period away
    slot = np.empty((72, 64), np.uint8)
    started = time.monotonic()
    camera.read_into(slot)
    assert time.monotonic() - started < 0.5  # the thread waited for due_in(), the read does not wait again
    assert camera.due_in() > 0.5


def test_the_daemon_reads_synthetic_cameras_in_shared_threads(det_bundle):
    sources = [SourceConfig("synthetic:320x240@30:nv12") for _ in range(3)]  # paced: a second of capture
    config = validate(PipelineConfig(bundle=det_bundle, sources=sources, frames=30, capture_threads=1,
                                     metrics_listen=""))
    pipeline, seen, done = Pipeline(config), set(), threading.Event()

    def watch():
        while not done.is_set():
            seen.update(t.name for t in threading.enumerate())
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        summary = pipeline.run()
    finally:
        done.set()
        watcher.join()
    assert summary["captured"] == [30, 30, 30]
    assert all(p + d == 30 for p, d in zip(summary["processed"], summary["dropped"]))
    assert "capture-0" in seen and not any(name.startswith("sources-") for name in seen)


def test_capture_threads_out_of_bounds_is_one_line(tmp_path, capsys):
    from jetpipe.cli import main

    config = tmp_path / "c.toml"
    config.write_text(f'[pipeline]\nbundle = "{tmp_path}"\ncapture_threads = -2\n[[source]]\nuri = "synthetic"\n')
    assert main(["serve", str(config)]) == 2
    err = capsys.readouterr().err
    assert "capture_threads = -2: allowed an integer from 0 (auto: half the cores) to 256" in err
    assert "Traceback" not in err


def test_decode_processes_without_nvdec_decode_in_the_serving_process_and_say_so(det_bundle, caplog):
    import logging

    caplog.set_level(logging.INFO)
    sources = [SourceConfig("synthetic:320x240@0:nv12") for _ in range(2)]
    config = validate(PipelineConfig(bundle=det_bundle, sources=sources, frames=5, decode_processes=2,
                                     backend="onnxruntime-cpu", metrics_listen=""))
    pipeline = Pipeline(config)
    assert pipeline.decoders is None
    assert "decode_processes = 2: no NVDEC here" in caplog.text
    summary = pipeline.run()
    assert summary["processed"] == [5, 5] and "decode_processes" not in summary["cpu_seconds"]


def test_a_source_still_in_a_read_is_not_closed_under_it():
    """At close, a source whose capture thread was left behind in a read stays open (FFmpeg aborted the process
    when its decoder was closed under a decode); the others close."""
    from jetpipe.pipelines.config import SourceConfig
    from jetpipe.pipelines.ingest.intake import Ingest
    from jetpipe.pipelines.ingest.streams import Streams

    class Source:
        def __init__(self, uri):
            self.uri, self.closed = uri, 0

        def close(self):
            self.closed += 1

    streams = Streams(2)
    reading, ended = Source("reading"), Source("ended")
    for slot, source in enumerate((reading, ended)):
        stream = streams.take(slot, None, SourceConfig(source.uri), source)
        stream.started = True
    streams.find(1).done.set()
    ingest = Ingest.__new__(Ingest)  # close() reads only these
    ingest.streams, ingest.opened, ingest.decoders = streams, [], None
    ingest.close()
    assert (reading.closed, ended.closed) == (0, 1)



class _QueuingCamera(SyntheticCamera):
    """Stands for NVDEC's source: its copy into the slot left queued, an event (here a marker) to wait for."""

    def read_queued(self, slot):
        return self.read_into(slot), f"copy of frame {self.frames_read}"

    def read_into(self, slot):
        self.frames_read = getattr(self, "frames_read", 0) + 1
        return super().read_into(slot)


def test_a_frame_whose_copy_its_source_left_queued_carries_the_event_to_the_batch():
    """The capture does not wait for such a copy: the frame it queues carries the event its readers on the GPU
    wait for (tests/pipelines/ingest/test_video_gpu.py: the kernel does). A source that reads whole gives none."""
    from jetpipe.pipelines.ingest.capture import Capture
    from jetpipe.runtime.ring import host_ring

    taken = {}
    for name, camera in (("queuing", _QueuingCamera(64, 48, fmt="nv12")), ("whole", SyntheticCamera(64, 48))):
        batcher = Batcher(1, max_batch=3, timeout_s=0.001, depth=8)
        streams = SimpleNamespace(capacity=1, rings=[host_ring(4, 64 * 72)], frame_number=lambda handle, n: n)
        config = SimpleNamespace(frames=3, reconnect_max_s=1.0)
        capture = Capture(config, streams, batcher, SimpleNamespace(count=lambda *a: None), threading.Event())
        handle = SimpleNamespace(slot=0, id=0, source=camera, stop=threading.Event(), done=threading.Event(),
                                 state="running")
        for _ in capture.steps(handle, shared=True):
            pass
        taken[name] = [queued.frame.ready for queued in _take_all(batcher, 3)]
    assert taken == {"queuing": ["copy of frame 1", "copy of frame 2", "copy of frame 3"], "whole": [None] * 3}
