"""Recording on the NVDEC path (marker gpu): the packets NVDEC's demuxer gives (Annex B), in the serving process
and sent from a decode process, written as segments whose pictures are the input's own.

Needs PyCUDA, onnxruntime-gpu, PyNvVideoCodec and ffmpeg.
"""

import sqlite3

import pytest

from tests.pipelines.outputs.test_clips import _frame_md5s
from tests.pipelines.outputs.test_clips_gpu import serve_nvdec_door

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("processes", [0, 1], ids=["in-process", "decode-process"])
def test_an_nvdec_streams_recording_is_the_inputs_pictures_end_to_end(det_bundle_square, tmp_path, panning_video,
                                                                       panning_h264, processes):
    folder = tmp_path / "rec"
    records, summary = serve_nvdec_door(det_bundle_square, tmp_path, panning_video, panning_h264,
                                        ["--record", str(folder), "--decode-processes", str(processes)])
    assert summary["recording"]["failed"] == 0 and summary["recording"]["segments"] >= 2
    with sqlite3.connect(folder / "index.sqlite3") as db:
        rows = db.execute("SELECT path, t0, t1, packets, open FROM segments ORDER BY t0").fetchall()
        events = db.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    assert events == sum(r.get("schema") == "jetpipe.event/1" for r in records) > 0
    assert all(open_ == 0 for *_, open_ in rows)
    recorded = [md5 for path, *_ in rows for md5 in _frame_md5s(folder / path)]
    source = _frame_md5s(panning_h264)
    # every picture from the first recorded one on, in order (a decode process may ask for the packets after its
    # first frames: the recording then starts at the next keyframe)
    first = source.index(recorded[0])
    assert recorded == source[first:] and first <= 4
    for row, following in zip(rows, rows[1:]):
        assert following[1] == pytest.approx(row[2], abs=1e-3)
