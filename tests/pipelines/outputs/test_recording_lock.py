"""One recording writes a folder at a time: a second one (another serve given the same DIR, or the next serve
started while the last one's recording process is still finishing) waits for the first to end, and refuses in
one line where it does not, never repairing the first's open segment."""

import os
import threading

import pytest

from jetpipe.pipelines.config import ConfigError
from jetpipe.pipelines.outputs.recording import lock
from jetpipe.pipelines.outputs.recording.recorder import Recorder
from tests.pipelines.outputs.test_recording import (
    FPS,
    _config,
    _feed,
    _index,
    _packets,
    _Source,
    _video,
    _wait,
    needs_ffmpeg,
)

ROWS = "SELECT id, path, open, end, bytes FROM segments ORDER BY id"


@needs_ffmpeg
def test_a_second_recording_of_a_folder_waits_for_the_first_and_never_repairs_its_open_segment(tmp_path,
                                                                                                monkeypatch):
    video = _video(tmp_path / "in.mp4", seconds=6)
    packets, base = _packets(video)
    folder = tmp_path / "rec"
    first = Recorder(_config(folder), 5.0, 5.0, 64)
    try:
        source = _Source(str(video))
        first.attach(0, source, "all")
        _feed(source, packets[:4 * FPS], base)  # 4 s of the 6: a segment closed, the next one open
        _wait(lambda: _index(folder, "SELECT COUNT(*), SUM(open) FROM segments")[0] == (2, 1))
        rows = _index(folder, ROWS)
        monkeypatch.setattr(lock, "WAIT_S", 0.5)
        with pytest.raises(ConfigError, match="is being recorded by another jetpipe"):
            Recorder(_config(folder), 5.0, 5.0, 64)
        assert _index(folder, ROWS) == rows and all((folder / row[1]).exists() for row in rows)
        monkeypatch.setattr(lock, "WAIT_S", 60.0)
        stopping = threading.Timer(0.5, first.close)  # the last serve's recording, finishing
        stopping.start()
        second = Recorder(_config(folder), 5.0, 5.0, 64)
        stopping.join()
        assert not first.thread.is_alive()  # it had ended, its segments closed, before the second began
        second.close()
    finally:
        first.close()
    assert _index(folder, "SELECT COUNT(*), SUM(open) FROM segments") == [(2, 0)]
    assert second.repaired == {"finished": 0, "dropped": 0, "adopted": 0}


def test_a_lock_file_that_is_a_link_or_not_a_file_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "rec"
    folder.mkdir()
    target = tmp_path / "someone-elses"
    target.write_bytes(b"theirs")
    (folder / lock.LOCK_NAME).symlink_to(target)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        Recorder(_config(folder), 5.0, 5.0, 64)
    assert target.read_bytes() == b"theirs"
    (folder / lock.LOCK_NAME).unlink()
    os.mkfifo(folder / lock.LOCK_NAME)
    with pytest.raises(ConfigError, match="is not a plain file"):
        Recorder(_config(folder), 5.0, 5.0, 64)
