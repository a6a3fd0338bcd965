"""Recording on the NVDEC path (marker gpu): the packets NVDEC's demuxer gives (Annex B), in the serving process
and sent from a decode process, written as segments whose pictures are the input's own.

Needs PyCUDA, onnxruntime-gpu, PyNvVideoCodec and ffmpeg (PyAV for a network stream's teed packets).
"""

import sqlite3
import subprocess

import pytest

from tests.pipelines.outputs.test_clips import _frame_md5s
from tests.pipelines.outputs.test_clips_gpu import serve_nvdec_door
from tests.stream_server import StreamServer, remux_or_stand_in

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


def test_a_network_nvdec_streams_recording_is_teed_past_the_serving_process(det_bundle_square, tmp_path, monkeypatch,
                                                                           panning_video, panning_h264):
    """A camera NVDEC decodes (its packets through a remux ffmpeg): the recording process reads them from the
    ffmpeg's second copy; the serving process keeps none (no arena), and the segments are the camera's pictures
    on the clock of the frames NVDEC decoded."""
    pytest.importorskip("av", reason="PyAV (pip install av) reads the teed packets in the recording process")
    ts = tmp_path / "panning.ts"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(panning_h264), "-c", "copy", "-f", "mpegts",
                    str(ts)], check=True)
    remuxer = remux_or_stand_in(monkeypatch, ts.read_bytes())
    server = StreamServer(ts.read_bytes(), once=True)  # one pass a connection, then the camera hangs up
    folder = tmp_path / "rec"
    try:
        records, summary = serve_nvdec_door(det_bundle_square, tmp_path, panning_video, server.url,
                                            ["--record", str(folder), "--frames", str(panning_video.frames)])
    finally:
        server.unplug()
    recording = summary["recording"]
    assert recording["teed_streams"] == 1 and recording["rings_s"] == 0, (remuxer, recording)
    assert recording["failed"] == 0 and recording["segments"] >= 1
    with sqlite3.connect(folder / "index.sqlite3") as db:
        rows = db.execute("SELECT path, t0, open FROM segments ORDER BY start, path").fetchall()
    assert all(open_ == 0 for *_, open_ in rows)
    recorded = [md5 for path, *_ in rows for md5 in _frame_md5s(folder / path)]
    source = _frame_md5s(panning_h264)
    assert recorded[:len(source)] == source  # the first connection whole, from its first picture
    # the segments start at keyframes on the frames' clock (no B-frames: a keyframe's decode time is its frame's)
    frames = sorted({r["pts"] for r in records if "schema" not in r})
    assert rows[0][1] == pytest.approx(frames[0], abs=1e-3)
    assert all(any(abs(t0 - pts) < 1e-3 for pts in frames) for _, t0, _ in rows)
