"""Clips on the NVDEC path (marker gpu): the packets NVDEC's demuxer gives (Annex B) kept in the ring and remuxed
into MP4 around each event, checked by decoding the clips against the input's own pictures.

Needs PyCUDA, onnxruntime-gpu, PyNvVideoCodec and ffmpeg.
"""

import shutil
from pathlib import Path

import pytest

from tests.pipelines.outputs.test_clips import _frame_md5s, _packets, _serve

pytestmark = pytest.mark.gpu


def serve_nvdec_door(det_bundle_square, tmp_path, panning_video, panning_h264, extra: list[str]):
    """The panning video decoded by NVDEC into the GPU runtime, a door line across it: its records and summary
    (skipped with the reason where onnxruntime-gpu, PyNvVideoCodec or ffmpeg is missing)."""
    import onnxruntime as ort

    pytest.importorskip("PyNvVideoCodec", reason="PyNvVideoCodec (pip install pynvvideocodec) not installed")
    if "CUDAExecutionProvider" not in ort.get_available_providers() or not shutil.which("ffmpeg"):
        pytest.skip("onnxruntime-gpu or ffmpeg is not installed")
    x = panning_video.x_line
    return _serve(det_bundle_square, tmp_path, panning_h264, ["--decoder", "nvdec", "--backend", "onnxruntime-cuda",
                                                       "--line", f"door:{x},0,{x},1", *extra])


@pytest.mark.parametrize("processes", [0, 1], ids=["in-process", "decode-process"])
def test_events_on_nvdec_streams_get_clips_of_the_inputs_pictures(det_bundle_square, tmp_path, panning_video,
                                                                  panning_h264, processes):
    """Decoded in the serving process, and in a decode process, which sends the packets its demuxer read to the
    serving process's ring (before, such a stream had no clips)."""
    clips = tmp_path / "clips"
    records, summary = serve_nvdec_door(det_bundle_square, tmp_path, panning_video, panning_h264,
                                        ["--clips", str(clips), "--clip-before", "4", "--clip-after", "2",
                                         "--decode-processes", str(processes)])
    events = {r["event_id"]: r for r in records if r.get("schema") == "jetpipe.event/1"}
    ready = [r for r in records if r.get("schema") == "jetpipe.clip/1"]
    assert len(events) == panning_video.crossings and ready
    assert sorted(e for r in ready for e in r["events"]) == sorted(events)
    assert summary["clips"]["failed"] == 0
    source = _frame_md5s(panning_h264)
    for record in ready:
        path = Path(record["path"])
        assert _packets(path)[0]["key"]
        cut = _frame_md5s(path)
        first = source.index(cut[0])
        assert cut == source[first:first + len(cut)] and len(cut) == record["packets"]
        # from the last keyframe at or before the asked start (GOP: 4 frames, 2 s; a frame 0.5 s): a stream whose
        # first packets were not kept (a decode process asked for them after its first frames) starts later
        asked = max(0.0, min(events[e]["pts"] for e in record["events"]) - 4)
        assert asked - 2.0 - 0.51 <= record["start"] <= asked + 0.51, (record, asked)
