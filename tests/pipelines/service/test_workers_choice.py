"""`workers_per_gpu = "auto"`, the default: two serving processes on a GPU where CUDA MPS runs and enough live
streams share it, one otherwise, and the log says which and why."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
from jetpipe.pipelines.service.gpus.workers_choice import MIN_LIVE_STREAMS, choose, resolve
from tests.support import MpsControl

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("live, mps, refusal, cores, gpus, workers, said", [
    (16, "/tmp/mps", None, 16, 1, 1, "16 live stream(s) a GPU, fewer than 24: one serving process a GPU"),
    (32, None, None, 16, 1, 1, "CUDA MPS is not running, and without it two processes take turns on a GPU"),
    (32, "/tmp/mps", "an RTSP server serves one process's frames", 16, 1, 1,
     "32 live stream(s) a GPU, but an RTSP server serves one process's frames: one serving process a GPU"),
    (32, "/tmp/mps", None, 6, 2, 1, "6 CPU core(s), fewer than the 8 that 2 workers on each of 2 GPU(s) take"),
    (24, "/tmp/mps", None, 4, 1, 2, "24 live stream(s) a GPU and CUDA MPS running (its control socket in /tmp/mps): "
                                    "2 serving processes a GPU"),
])
def test_two_workers_where_mps_runs_and_enough_live_streams_share_a_gpu(live, mps, refusal, cores, gpus, workers,
                                                                         said):
    choice = choose(live, mps, refusal, cores, gpus)
    assert choice.per_gpu == workers and said in choice.why


def _config(sources, **extra) -> PipelineConfig:
    return validate(PipelineConfig(bundle=Path("b"), sources=sources, **extra), "flags")


@pytest.fixture
def mps():
    daemon = MpsControl()
    yield daemon
    daemon.close()


def test_auto_counts_the_live_streams_a_gpu_and_serves_two_on_gpu_0_behind_the_face(mps, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", mps.folder)
    cameras = [SourceConfig("rtsp://camera/stream")] * MIN_LIVE_STREAMS
    config = _config(cameras)
    assert config.workers_per_gpu == "auto" and config.gpus is None  # chosen when serving starts
    assert resolve(config, cores=16).per_gpu == 2 and (config.workers_per_gpu, config.gpus) == (2, [0])
    assert resolve(config, cores=16) is None  # a number now: nothing to choose
    files = _config([SourceConfig("clip.mp4", loop=True)] * MIN_LIVE_STREAMS)  # as fast as they decode
    assert resolve(files, cores=16).per_gpu == 1 and (files.workers_per_gpu, files.gpus) == (1, None)
    paced = _config([SourceConfig("clip.mp4", loop=True, realtime=True)] * MIN_LIVE_STREAMS)
    assert resolve(paced, cores=16).per_gpu == 2
    halves = _config(cameras, gpus="all")  # two GPUs: half the streams each
    assert "12 live stream(s) a GPU, fewer than 24" in resolve(halves, gpu_count=2, cores=16).why
    assert (halves.workers_per_gpu, halves.gpus) == (1, "all")
    drawn = _config(cameras, sinks=["rtsp://127.0.0.1:8554/out"])
    choice = resolve(drawn, cores=16)
    assert choice.per_gpu == 1 and "an RTSP server serves one process's frames" in choice.why
    assert drawn.gpus is None
    mps.stop()  # MPS quit (its socket stays)
    assert "CUDA MPS is not running" in resolve(_config(cameras), cores=16).why


def test_serve_says_what_auto_chose_and_serves_so(tiny_bundle, tmp_path, mps):
    """Through the CLI, CUDA MPS seen running: the choice is said in the log and served. The process is held to
    2 cores, so auto keeps one process (on an H100 with MPS, 32 cameras got two: docs/performance.md)."""
    argv = [arg for _ in range(MIN_LIVE_STREAMS) for arg in ("--source", "synthetic:64x48@10")]
    summary = tmp_path / "summary.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_MPS_PIPE_DIRECTORY": mps.folder}
    done = subprocess.run([sys.executable, "-m", "jetpipe", "serve", "--bundle", str(tiny_bundle), *argv,
                           "--frames", "3", "--metrics", "", "--summary", str(summary)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2]))
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "workers_per_gpu auto:" in line]
    cores = min(2, len(os.sched_getaffinity(0)))
    assert len(said) == 1 and (f"24 live stream(s) a GPU and CUDA MPS running, but {cores} CPU core(s), fewer than "
                               "the 4 that 2 workers on each of 1 GPU(s) take: one serving process a GPU") in said[0]
    result = json.loads(summary.read_text())["summary"]
    assert "gpus" not in result and result["captured"] == [3] * MIN_LIVE_STREAMS  # one process, no face
