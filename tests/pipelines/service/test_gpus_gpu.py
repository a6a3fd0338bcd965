"""Serving on real GPUs (marker gpu): one worker on GPU 0, two workers on GPU 0, and a worker on each of two GPUs
where there are two."""

import json
import subprocess
import sys

import pytest

from tests.pipelines.service.test_daemon_gpu import _cuda_ep  # noqa: F401 (autouse: skips without ONNX Runtime's CUDA EP)
from tests.pipelines.service.test_gpus import ROOT

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("gpus, per_gpu", [("0", 1), ("0", 2), ("0,1", 1)])
def test_every_stream_served_on_its_gpu(det_bundle_square, tmp_path, gpus, per_gpu):
    from jetpipe.runtime.probe import probe_gpu

    asked, present = gpus.split(","), probe_gpu().devices
    if present < len(asked):
        pytest.skip(f"needs {len(asked)} GPUs; this machine has {present}")
    out, summary_path = tmp_path / "records.jsonl", tmp_path / "summary.json"
    argv = [sys.executable, "-m", "jetpipe", "serve", "--bundle", str(det_bundle_square), "--gpus", gpus,
            "--frames", "30", "--backend", "onnxruntime-cuda", "--sink", f"jsonl:{out}", "--summary", str(summary_path),
            "--metrics", "", "--workers-per-gpu", str(per_gpu)]
    for _ in range(4):
        argv += ["--source", "synthetic:1280x720@15:nv12"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(summary_path.read_text())["summary"]
    expected = [[0, 1, 2, 3]] if len(asked) * per_gpu == 1 else [[0, 2], [1, 3]]
    assert [g["streams"] for g in summary["gpus"]] == expected
    assert [g["gpu"] for g in summary["gpus"]] == ([0, 0] if per_gpu == 2 else list(map(int, asked)))
    assert all(g["backend"] == "onnxruntime-cuda" and g["ended"] == "ran to the end" for g in summary["gpus"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for stream in range(4):
        frames = [r["frame"] for r in records if r["stream"] == stream]
        assert frames == sorted(frames) and len(frames) == summary["processed"][stream] > 0
        assert summary["captured"][stream] == 30
    assert any(r["results"]["boxes"] for r in records)
    print(json.dumps({"gpus": gpus, "workers_per_gpu": per_gpu, "throughput_fps": summary["throughput_fps"],
                      "latency_ms": summary["latency_ms"]}))


@pytest.mark.parametrize("gpus", ["0", "0,1"])
def test_each_workers_nvdec_files_are_decoded_in_its_own_decode_process(det_bundle_square, tmp_path, gpus):
    """--decode-processes with --gpus: each worker decodes its files in a process of its own on its GPU (CUDA
    IPC into its ring slots); every frame of every file comes through, in order."""
    import shutil

    from jetpipe.runtime.probe import probe_gpu
    from tests.pipelines.ingest.test_sources import encode

    pytest.importorskip("PyNvVideoCodec", reason="PyNvVideoCodec (pip install pynvvideocodec) not installed")
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg not installed: the clip is encoded at test time")
    asked = gpus.split(",")
    if probe_gpu().devices < len(asked):
        pytest.skip(f"needs {len(asked)} GPUs; this machine has {probe_gpu().devices}")
    clip = encode(tmp_path / "clip.mp4", "1280x720", 20)
    out, summary_path = tmp_path / "records.jsonl", tmp_path / "summary.json"
    argv = [sys.executable, "-m", "jetpipe", "serve", "--bundle", str(det_bundle_square), "--gpus", gpus,
            "--decode-processes", "1", "--backend", "onnxruntime-cuda", "--sink", f"jsonl:{out}",
            "--summary", str(summary_path), "--metrics", "", *(["--source", str(clip)] * 4)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(summary_path.read_text())["summary"]
    assert len(summary["gpus"]) == len(asked)
    assert all("decode_processes" in g["cpu_seconds"] for g in summary["gpus"]), summary["gpus"]
    assert summary["processed"] == [20] * 4 and summary["dropped"] == [0] * 4
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for stream in range(4):
        assert [r["frame"] for r in records if r["stream"] == stream] == list(range(20))
