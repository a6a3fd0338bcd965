"""The recording in a process of its own: the serving process hands whole GOPs and index entries over, the
recording process writes the segments and the index; its refusals, its death and its stop."""

import os
import signal
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from jetpipe.pipelines.config import ConfigError
from jetpipe.pipelines.core.events.record import EventRecord
from jetpipe.pipelines.outputs.recording.child import ForwardedRing
from jetpipe.pipelines.outputs.recording.process import RecordingProcess
from jetpipe.pipelines.outputs.recording.recorder import Recorder
from tests.pipelines.outputs.test_clips import _frame_md5s
from tests.pipelines.outputs.test_recording import (
    FPS,
    _config,
    _decodes,
    _feed,
    _index,
    _packets,
    _rows,
    _Source,
    _video,
    _wait,
    linked_index,
    needs_ffmpeg,
)

WALL = 1_800_000_000.0  # the frames' capture time at the stream's time 0


def _segments_open_in(pid: int, folder: Path) -> set[str]:
    """The segment files the process has open (its /proc/PID/fd links into the folder)."""
    found = set()
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir() if fds.exists() else ():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith(str(folder)) and target.endswith(".mp4"):
            found.add(target)
    return found


@contextmanager
def _one_stream_recorded(tmp_path: Path, folder: Path):
    """A recording process with a 6-s test video's stream attached as stream 0 (closed at the end): it, the
    stream's source, the video's packets (one pass) and their time base."""
    video = _video(tmp_path / "in.mp4", seconds=6)
    packets, base = _packets(video, passes=1)
    recorder = RecordingProcess(_config(folder), 5.0, 5.0, 64)
    try:
        source = _Source(str(video))
        recorder.attach(0, source, "all")
        yield recorder, source, packets, base
    finally:
        recorder.close()


@needs_ffmpeg
@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs Linux's /proc to see a process's open files")
def test_the_recording_process_writes_the_segments_and_the_serving_process_only_hands_packets_over(tmp_path):
    video = _video(tmp_path / "in.mp4", seconds=6)
    packets, base = _packets(video, passes=2)
    folder = tmp_path / "rec"
    recorder = RecordingProcess(_config(folder), 5.0, 5.0, 64)
    mine, theirs = set(), set()

    def look():
        mine.update(_segments_open_in(os.getpid(), folder))
        theirs.update(_segments_open_in(recorder.process.pid, folder))

    try:
        source = _Source(str(video))
        recorder.attach(3, source, "all")
        recorder.on_frame(SimpleNamespace(stream=3, pts=0.0, t_capture=WALL))
        recorder.on_record(EventRecord("line_cross", "door", 3, 90, 3.0, WALL + 3.0, 7, "person", 0, 0.9,
                                       [0, 0, 1, 1], {}, {}))
        arena = source.packet_ring
        _feed(source, packets, base, sample=look, pace_gops=0.02)
        # the last segment stays open in the recording process until the stop
        _wait(lambda: look() or theirs, timeout=60)
        _wait(lambda: arena.read_to() > 0)  # the recording process gives the arena's room back
    finally:
        recorder.close()
    assert not mine and theirs
    rows = _rows(folder)
    assert len(rows) == 6 and all(r[5] == 0 for r in rows)  # 12 s in 2-s segments, all closed
    for (path, _, end, size, count, _, _), following in zip(rows, rows[1:] + [None]):
        assert count == 2 * FPS == _decodes(folder / path) and (folder / path).stat().st_size == size
        if following is not None:
            assert following[1] == pytest.approx(end, abs=1e-6)
    assert WALL - 1 < rows[0][1] < WALL  # on the frames' wall clock (from the first decode time, before 0)
    assert rows[0][6] == rows[1][6] == 1 and rows[-1][6] == 0  # within 5 s of the event at 3 s: held
    assert _index(folder, "SELECT stream, rule, label FROM events") == [(3, "door", "person")]
    summary = recorder.summary()
    assert summary["segments"] == 6 and summary["lost_gops"] == 0 and summary["unkept_packets"] == 0
    assert summary["recording_process_s"] > 0 and summary["serving_process_s"] >= summary["forwarding_s"] > 0


def test_a_refusal_at_the_start_is_the_recording_processs_one_line(tmp_path):
    folder, target = linked_index(tmp_path)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        RecordingProcess(_config(folder), 5.0, 5.0, 64)
    assert target.read_bytes() == b"theirs"


def test_a_recording_process_that_died_is_said_by_health_and_the_stop_still_ends(tmp_path):
    recorder = RecordingProcess(_config(tmp_path / "rec"), 5.0, 5.0, 64)
    try:
        assert recorder.health() is None
        recorder.process.kill()
        recorder.process.join(30)
        assert recorder.health() == "recording: its process stopped"
    finally:
        recorder.close()
    assert recorder.summary()["process_exited"] is True and not recorder.thread.is_alive()


@needs_ffmpeg
def test_a_recording_process_whose_serving_process_went_leaves_its_open_segment_to_the_repair(tmp_path):
    """The serving process's end without a stop (its pipe ends: here the test closes it and lives on, so no
    kill follows): the recording process leaves its open segment as a kill would, every time, and the next
    start finishes it. It closed the segment itself at the pipe's end before, racing the kill that prctl sends
    right after a dead parent's pipe ends: a worker's successor found nothing to repair in one CI run in ~20."""
    folder = tmp_path / "rec"
    with _one_stream_recorded(tmp_path, folder) as (recorder, source, packets, base):
        _feed(source, packets, base)
        _wait(lambda: _index(folder, "SELECT COUNT(*), SUM(open) FROM segments") == [(3, 1)])
        recorder.conn.close()  # the serving process's end of the pipe, gone as it goes in a kill
        recorder.process.join(30)
        assert recorder.process.exitcode == -signal.SIGKILL  # as prctl's kill would have ended it
        assert _index(folder, "SELECT COUNT(*), SUM(open) FROM segments") == [(3, 1)]
    repaired = Recorder(_config(folder), 5.0, 5.0, 64)
    repaired.close()
    assert repaired.repaired["finished"] == 1
    rows = _rows(folder)
    assert len(rows) == 3 and all(r[5] == 0 for r in rows)
    assert [count for _, _, _, _, count, _, _ in rows] == [_decodes(folder / path) for path, *_ in rows]


@needs_ffmpeg
def test_a_removed_streams_ring_is_handed_over_to_its_end_and_its_last_segment_closed(tmp_path):
    """POST /streams/ID's removal while recording: the rest of its ring goes over, the recording process writes
    it and closes the stream's last segment without waiting for the stop; the other stream records on."""
    video = _video(tmp_path / "in.mp4", seconds=6)
    packets, base = _packets(video, passes=1)
    folder = tmp_path / "rec"
    recorder = RecordingProcess(_config(folder), 5.0, 5.0, 64)
    try:
        gone, stays = _Source(str(video)), _Source(str(video))
        recorder.attach(0, gone, "all")
        recorder.attach(1, stays, "all")
        stays.packet_ring.time_base = base
        for p in packets[:2 * FPS]:  # its first two seconds, not ended
            stays.packet_ring.add(p)
        _feed(gone, packets, base)
        recorder.removed(0)
        _wait(lambda: _index(folder, "SELECT COUNT(*), SUM(open) FROM segments WHERE stream = 0") == [(3, 0)])
        assert 0 not in recorder.forwarded and gone.packet_ring.stopped
        # open, recording on: stream 1's first segment is opened by the recording process in its own time
        _wait(lambda: _index(folder, "SELECT COUNT(*) FROM segments WHERE stream = 1") == [(1,)])
    finally:
        recorder.close()
    assert _index(folder, "SELECT COUNT(*), SUM(open) FROM segments WHERE stream = 1") == [(1, 0)]


@needs_ffmpeg
def test_a_looped_files_passes_are_each_recorded_to_their_end(tmp_path):
    """NVDEC's looped file: the packets' clock starts again at each pass. The recording process makes the GOPs
    from the packets it reads (the serving process only copies them): each pass's last GOP is whole when the
    next pass starts, and each pass is written in segments of its own."""
    folder = tmp_path / "rec"
    with _one_stream_recorded(tmp_path, folder) as (_, source, packets, base):
        _feed(source, packets + packets, base)
        # the second pass's last segment stays open until the stop (the stream may go on)
        _wait(lambda: _index(folder, "SELECT COUNT(*), SUM(open) FROM segments") == [(6, 1)])
    rows = _index(folder, "SELECT t0, t1, packets, path FROM segments ORDER BY id")
    assert [t for t0, t1, _, _ in rows for t in (t0, t1)] == pytest.approx([0, 2, 2, 4, 4, 6] * 2, abs=0.1)
    assert all(count == 2 * FPS == _decodes(folder / path) for _, _, count, path in rows)


@needs_ffmpeg
def test_the_stop_writes_every_pass_the_recording_processs_ring_holds(tmp_path):
    """A camera that reconnected just before the stop (its clock started again): the recording process's ring
    keeps each connection's packets apart (passes), and the stop writes all of them, the oldest first. It wrote
    the oldest alone: the new connections' packets that came within a poll of the stop were lost (found by a GPU
    test: an NVDEC camera's FFmpeg fallback was recorded only where a poll fell between the two)."""
    video = _video(tmp_path / "in.mp4", seconds=2)
    packets, base = _packets(video)
    folder = tmp_path / "rec"
    recorder = Recorder(_config(folder), 5.0, 5.0, 64)
    ring = ForwardedRing(str(video), 1 << 30)
    recorder.follow(0, "tcp://camera", ring, "all")
    ring.time_base = base
    for _ in range(3):  # three connections, each on a clock from 0
        for packet in packets:
            ring.add(packet)
    ring.close_gop()
    recorder.close()
    rows = _rows(folder)
    assert ring.passes == 2 and sum(r[4] for r in rows) == 3 * len(packets)
    recorded = [md5 for path, *_ in rows for md5 in _frame_md5s(folder / path)]
    assert recorded == 3 * _frame_md5s(video)
