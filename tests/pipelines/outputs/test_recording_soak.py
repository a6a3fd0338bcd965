"""The recording's soak (issue 67), shorter than the benchmark's 10 minutes (scripts/bench_recording.py): 8 live-
paced streams recorded into a budget a few times too small for the run, the folder's size (as du counts it) sampled
every second; then what was kept: every stream's window recorded whole, no gap longer than a frame, every segment
playing, and an export across 5 segments as long as its range within a GOP."""

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).parents[3] / "scripts" / "bench_recording.py"
SECONDS, BUDGET = 120, 12_000_000


def _bench():
    spec = importlib.util.spec_from_file_location("bench_recording", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_recording", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not (shutil.which("ffmpeg") and shutil.which("ffprobe")),
                    reason="ffmpeg and ffprobe are not on PATH (apt-get install ffmpeg)")
def test_eight_streams_recorded_within_a_budget_keep_whole_windows_that_play(tiny_bundle, tmp_path):
    bench = _bench()
    video = bench.make_video(tmp_path / "in.mp4")
    seen = bench.soak(str(tiny_bundle), video, tmp_path / "rec", 8, SECONDS, str(BUDGET), segment_s=2.0)
    assert seen["samples"] >= SECONDS // 2 and seen["max_bytes_seen"] <= BUDGET
    recording = seen["summary"]["recording"]
    assert recording["removed_for_room"] > 0 and recording["refused_gops"] == 0 and recording["lost_gops"] == 0
    found = bench.kept(tmp_path / "rec")
    assert found["unplayable"] == [] and len(found["streams"]) == 8
    for stream in found["streams"].values():
        assert stream["open"] == 0 and stream["segments"] >= 6
        assert stream["recorded_share"] >= 0.999 and stream["longest_gap_s"] <= 1 / bench.FPS
    export = bench.export_five(tmp_path / "rec", tmp_path / "export.mp4")
    assert export["segments"] == 5 and export["within_a_gop"], export
