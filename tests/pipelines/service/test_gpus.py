"""Serving on several GPUs (pipelines/service/gpus): the placement, the checks, and the face over real worker processes.

On this machine the workers run the CPU runtime and stand for GPUs (JETPIPE_SIMULATED_GPUS); the GPU
machine runs the same face over real GPUs in test_gpus_gpu.py.
"""

import contextlib
import copy
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from jetpipe.pipelines.config import (
    ClipsConfig,
    ConfigError,
    PipelineConfig,
    RecordConfig,
    SnapshotsConfig,
    SourceConfig,
    media_reserve,
    validate,
)
from jetpipe.pipelines.service.gpus import evidence, plan, scrape
from jetpipe.pipelines.service.gpus.plan import SIMULATED_ENV, GpuError
from jetpipe.pipelines.service.summary import PER_STREAM
from tests.support import MpsControl, free_port, serve_with_stdout_blocked, wait_for

ROOT = Path(__file__).resolve().parents[3]


# --- placement --------------------------------------------------------------------------------------------
def test_equal_streams_spread_evenly_and_pins_hold():
    assert plan.place([30.0] * 5, [0, 1], [None] * 5) == [0, 1, 0, 1, 0]
    assert plan.place([30.0] * 4, [0, 1], [1, 1, None, None]) == [1, 1, 0, 0]


def test_a_mix_of_rates_is_placed_by_load_from_the_highest():
    placed = plan.place([60.0, 15.0, 15.0, 30.0], [0, 1], [None] * 4)
    load = {g: sum(r for r, p in zip([60.0, 15.0, 15.0, 30.0], placed) if p == g) for g in (0, 1)}
    assert load == {0: 60.0, 1: 60.0}


def test_a_faster_gpu_takes_more_and_streams_already_served_count():
    assert plan.place([30.0] * 3, [0, 1], [None] * 3, capacities={0: 200.0, 1: 100.0}).count(0) == 2
    assert plan.place([30.0] * 2, [0, 1], [None] * 2, loads={0: 90.0}) == [1, 1]


def test_an_added_stream_goes_by_each_gpus_measured_rate_where_every_one_was_measured():
    placed = plan.Placed([0, 1], [0, 1, 0], [30.0] * 3)  # GPU 0 serves 60 frames/s, GPU 1 30
    assert placed.order(30.0, None, [0, 1]) == [1, 0]
    assert placed.order(30.0, None, [0, 1], {0: 1000.0, 1: 300.0}) == [0, 1]  # 90/1000 < 60/300
    assert placed.order(30.0, None, [0, 1], {0: 1000.0, 1: None}) == [1, 0]  # one unmeasured: alike
    assert placed.order(30.0, 1, [0, 1], {0: 1000.0, 1: 300.0}) == [1]


def test_several_workers_a_gpu_share_its_streams_and_a_pin_goes_to_a_worker_of_its_gpu():
    gpu_of = plan.workers_of([0, 1], 2)
    assert gpu_of == [0, 0, 1, 1]
    # the two pins on GPU 1 go first, one on each of its workers; the rest by each worker's load, then its GPU's
    placed = plan.place([30.0] * 6, [0, 1, 2, 3], [None, 1, None, None, 1, None], gpu_of=gpu_of)
    assert placed == [0, 2, 1, 0, 3, 2]  # each GPU 90 frames/s
    table = plan.Placed(gpu_of, placed, [30.0] * 6)
    assert table.order(30.0, None, [0, 1, 2, 3]) == [1, 3, 0, 2]  # the workers with one stream first
    assert table.order(30.0, 0, [0, 1, 2, 3]) == [1, 0]           # a pin on GPU 0: its workers alone
    assert table.next_added(3) == 9 and table.stride == 4          # worker k of 4: 6 + k, then every 4th
    # two GPUs of two workers: the streams alternate between the GPUs before a GPU's second worker takes one
    assert plan.place([30.0] * 4, [0, 1, 2, 3], [None] * 4, gpu_of=gpu_of) == [0, 2, 1, 3]
    assert plan.Placed(gpu_of, [0], [30.0]).order(30.0, None, [0, 1, 2, 3]) == [2, 3, 1, 0]


def test_cuda_mps_is_seen_running_while_its_control_socket_is_listened_on(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert plan.mps_running() is None
    (tmp_path / "control").touch()  # not a socket
    assert plan.mps_running() is None
    daemon = MpsControl()
    try:
        monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", daemon.folder)
        assert plan.mps_running() == daemon.folder
        daemon.stop()  # the daemon quit: its socket is left behind, and refuses
        assert os.path.exists(os.path.join(daemon.folder, "control")) and plan.mps_running() is None
    finally:
        daemon.close()


def test_a_synthetic_camera_offers_its_rate():
    assert plan.offered_rate(SourceConfig("synthetic:64x64@12")) == 12.0
    assert plan.offered_rate(SourceConfig("rtsp://camera/stream")) == plan.CAMERA_FPS


# --- the configuration's checks ---------------------------------------------------------------------------
@pytest.mark.parametrize("gpus, sources, extra, said", [
    ("0,x", [SourceConfig("synthetic")], {}, "gpus = '0,x': all, or GPU numbers"),
    ([0, 0], [SourceConfig("synthetic")], {}, "each from 0 to 63 and once"),
    (None, [SourceConfig("synthetic", gpu=1)], {}, "gpu = 1 places it on one of the GPUs serve runs on: add --gpus"),
    ("all", [SourceConfig("synthetic")], {"backend": "onnxruntime-cpu"}, "backend onnxruntime-cpu runs on the CPU"),
    ("all", [SourceConfig("synthetic")], {"sinks": ["rtsp://127.0.0.1:8554/cam"]}, "drop the rtsp sink or --gpus"),
    ("all", [SourceConfig("synthetic", gpu=99)], {}, "gpu = 99: a GPU number from 0 to 63"),
])
def test_what_gpus_cannot_go_with_is_one_line(gpus, sources, extra, said):
    with pytest.raises(ConfigError, match="^flags: .*") as caught:
        validate(PipelineConfig(bundle=Path("b"), sources=sources, gpus=gpus, **extra), "flags")
    assert said in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("workers, extra, said", [
    (0, {}, "workers_per_gpu = 0: allowed auto (two where CUDA MPS runs and 24 or more cameras share a GPU) or an "
            "integer from 1 to 16"),
    (17, {}, "workers_per_gpu = 17: allowed auto"),
    (True, {}, "workers_per_gpu = True: allowed auto"),
    ("two", {}, "workers_per_gpu = 'two': allowed auto"),
    (2, {"sinks": ["rtsp://127.0.0.1:8554/cam"]}, "drop the rtsp sink or --workers-per-gpu"),
    (2, {"backend": "onnxruntime-cpu"}, "--workers-per-gpu runs a pipeline on each GPU"),
])
def test_what_workers_per_gpu_cannot_be_is_one_line(workers, extra, said):
    with pytest.raises(ConfigError, match="^flags: .*") as caught:
        validate(PipelineConfig(bundle=Path("b"), sources=[SourceConfig("synthetic")], workers_per_gpu=workers,
                                **extra), "flags")
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_each_worker_records_into_a_part_of_its_own_with_its_share_of_the_budgets(tmp_path):
    """--record, --clips and --snapshots with several workers: each worker's part (DIR/workerN, made here, never
    a link) and 1/N of each budget, which together are the whole; a share too small for a segment is one line."""
    config = PipelineConfig(bundle=Path("b"), sources=[SourceConfig("synthetic")], gpus="all",
                            record=RecordConfig(folder=str(tmp_path / "rec"), max_size="900MB"),
                            clips=ClipsConfig(folder=str(tmp_path / "clips")),
                            snapshots=SnapshotsConfig(folder=str(tmp_path / "shots")))
    validate(config, "flags")
    evidence.check(config, 3)
    for name in ("rec", "clips", "shots"):
        assert sorted(p.name for p in (tmp_path / name).iterdir()) == ["worker0", "worker1", "worker2"]
    parts = [copy.deepcopy(config) for _ in range(3)]
    for worker, part in enumerate(parts):
        evidence.share(part, worker, 3)
    assert [p.record.folder for p in parts] == [str(tmp_path / "rec" / f"worker{n}") for n in range(3)]
    assert [p.clips.folder for p in parts] == [str(tmp_path / "clips" / f"worker{n}") for n in range(3)]
    assert sum(p.record.max_size for p in parts) <= config.record.max_size == 900_000_000
    assert sum(p.clips.max_total_mb for p in parts) == pytest.approx(config.clips.max_total_mb) == 90.0
    assert sum(media_reserve(p) for p in parts) <= media_reserve(config)
    (tmp_path / "rec" / "worker3").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(GpuError, match="^--record: .*worker3 is a link or a file: .* never written through a link"):
        evidence.check(config, 4)
    assert not (tmp_path / "elsewhere").exists()
    small = PipelineConfig(bundle=Path("b"), sources=[SourceConfig("synthetic")], gpus="all",
                           record=RecordConfig(folder=str(tmp_path / "rec2"), max_size="10MB"))
    validate(small, "flags")
    with pytest.raises(GpuError, match="each of the 4 workers records its streams within 1/4 of --record-max-size "
                                       "10 MB, which leaves 2.5 MB .*: raise --record-max-size"):
        evidence.check(small, 4)


def test_workers_per_gpu_without_gpus_serves_on_gpu_0_and_one_worker_stays_one_process():
    config = validate(PipelineConfig(bundle=Path("b"), sources=[SourceConfig("synthetic")], workers_per_gpu=2))
    assert config.gpus == [0]
    assert validate(PipelineConfig(bundle=Path("b"), sources=[SourceConfig("synthetic")])).gpus is None


@pytest.mark.parametrize("argv, said", [
    (["--gpus", "7"], "--gpus 7: this machine has 2 GPU(s) (0 to 1): GPU 7 is not one"),
    (["--gpus", "0,1", "--backend", "onnxruntime-cpu"], "backend onnxruntime-cpu runs on the CPU"),
])
def test_bad_gpus_at_the_command_line_exit_2(tiny_bundle, tmp_path, argv, said):
    done = _serve(tiny_bundle, ["--source", "synthetic:64x64@5", "--frames", "2", *argv], tmp_path, wait=True)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and said in errors[0] and "Traceback" not in done.stderr


def test_a_pin_on_a_gpu_not_served_is_one_line(tiny_bundle, tmp_path):
    config = tmp_path / "serve.toml"
    config.write_text(f'[pipeline]\nbundle = "{tiny_bundle}"\ngpus = [0]\n[[source]]\nuri = "synthetic:64x64@5"\n'
                      'gpu = 1\n')
    done = subprocess.run([sys.executable, "-m", "jetpipe", "serve", str(config), "--frames", "2"], cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "gpu = 1 is not among the GPUs served (0)" in done.stderr and "Traceback" not in done.stderr


# --- the face over two workers ----------------------------------------------------------------------------
def test_two_workers_one_face_every_record_in_order_and_one_summary(tiny_bundle, tmp_path):
    out = tmp_path / "records.jsonl"
    argv = ["--gpus", "all", "--frames", "8", "--sink", f"jsonl:{out}", "--summary", str(tmp_path / "summary.json"),
            "--metrics", "", "--sink", f"video:{tmp_path / 'drawn.mp4'}?fps=4"]
    uris = ["synthetic:96x64@4/nv12", "synthetic:96x64@4/yuyv", "synthetic:96x64@4/uyvy"]
    for uri in uris:
        argv += ["--source", uri]
    done = _serve(tiny_bundle, argv, tmp_path, wait=True)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())["summary"]
    assert [(g["gpu"], g["streams"], g["ended"]) for g in summary["gpus"]] == [(0, [0, 2], "ran to the end"),
                                                                                (1, [1], "ran to the end")]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for stream in range(3):
        frames = [r["frame"] for r in records if r["stream"] == stream]
        assert frames == sorted(frames) and len(frames) == summary["processed"][stream]
        assert summary["captured"][stream] == 8 == summary["processed"][stream] + summary["dropped"][stream]
        assert {r["source"] for r in records if r["stream"] == stream} == {uris[stream]}
    assert summary["latency_ms"]["total"]["0.99"] > 0 and summary["throughput_fps"] > 0
    # over the time the GPUs served, as one process counts it: not the workers' start-up, drain and exit too
    assert summary["seconds"] == max(g["seconds"] for g in summary["gpus"]) and summary["face_seconds"] > 0
    assert summary["throughput_fps"] == round(sum(summary["processed"]) / summary["seconds"], 2)
    assert summary["sink_failures"] == [0, 0] and "failure" not in summary
    for stream in range(3):  # each drawn by the worker that has the stream's frames, named as one process names it
        assert _frames_in(tmp_path / f"drawn-s{stream}.mp4") == summary["processed"][stream]


def test_the_face_answers_for_every_gpu_and_a_killed_worker_is_started_again(tiny_bundle, tmp_path):
    """GPU 1's worker killed mid-run: said, started again, its stream resumes; GPU 0's stream runs to its end,
    whole; the summary counts the death and both workers' frames."""
    out = tmp_path / "records.jsonl"
    argv = ["--gpus", "0,1", "--frames", "40", "--sink", f"jsonl:{out}", "--summary", str(tmp_path / "summary.json"),
            "--metrics", f"127.0.0.1:{free_port()}", "--source", "synthetic:96x64@8", "--source", "synthetic:96x64@8",
            "--sink", f"video:{tmp_path / 'drawn.mp4'}?fps=8"]
    face = _serve(tiny_bundle, argv, tmp_path)
    with _killed_at_the_end(face):
        address = _wait_for_line(face, "metrics of 2 GPU(s) on http://").split("http://", 1)[1].split("/", 1)[0]
        streams = json.loads(_get(address, "/streams"))
        assert [(s["id"], s["gpu"], s["worker"]) for s in streams["streams"]] == [(0, 0, "serving"), (1, 1, "serving")]
        metrics = _get(address, "/metrics")
        assert 'jetpipe_frames_processed_total{gpu="0",stream="0"' in metrics
        assert 'jetpipe_frames_processed_total{gpu="1",stream="1"' in metrics
        if shutil.which("promtool"):  # the merged exposition is as valid as each worker's (Prometheus' own lint)
            checked = subprocess.run(["promtool", "check", "metrics"], input=metrics, capture_output=True, text=True)
            assert checked.returncode == 0, checked.stdout + checked.stderr
        assert _health(address) == "ok\n"  # every worker's own /healthz answered 200
        assert [s["id"] for s in json.loads(_get(address, "/stats.json"))["streams"]] == [0, 1]  # the preview's
        assert 'alt="stream 0"' in _get(address, "/") and 'alt="stream 1"' in _get(address, "/")
        assert wait_for(lambda: _picture(address, 1).startswith(b"\xff\xd8"))  # from GPU 1's worker
        assert wait_for(lambda: _records_of(out, 0) >= 2 and _records_of(out, 1) >= 2)
        # its encoder has a frame (FFmpeg writes the file's header once the first frame is in): the records reach
        # the face before the worker's video sink draws, and a worker killed before that leaves an empty file
        assert wait_for(lambda: _size(tmp_path / "drawn-s1.mp4") > 0)
        os.kill(_worker_pid(face.pid, gpu=1), signal.SIGKILL)
        _wait_for_line(face, "GPU 1's worker was killed by signal 9: stream(s) 1 are not served until it is started")
        _wait_for_line(face, "GPU 1's worker started again (restart 1 of 3): stream(s) 1 resume")
        before = _records_of(out, 1)
        assert wait_for(lambda: _records_of(out, 1) > before)
        assert json.loads(_get(address, "/streams"))["streams"][1]["worker"] == "serving"
        stdout, stderr = face.communicate(timeout=180)
    assert face.returncode == 0, stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())["summary"]
    assert "failure" not in summary and [g["restarts"] for g in summary["gpus"]] == [0, 1]
    (death,) = summary["worker_exits"]
    assert death["gpu"] == 1 and death["ended"] == "was killed by signal 9" and death["frames_delivered"] >= 2
    assert summary["captured"][0] == 40 and _records_of(out, 0) == summary["processed"][0]
    assert summary["processed"][0] + summary["dropped"][0] == 40
    assert summary["processed"][1] == _records_of(out, 1)  # both workers' frames of stream 1
    # the dead worker's file stays (its encoder finished it), the new worker's goes on in a file of its own
    assert wait_for(lambda: _frames_in(tmp_path / "drawn-s1.mp4") > 0)
    assert _frames_in(tmp_path / "drawn-restart1-s1.mp4") > 0 and _frames_in(tmp_path / "drawn-s0.mp4") > 0


def test_a_restarted_worker_goes_on_with_its_streams_frame_numbers_track_ids_and_counts(det_bundle, tmp_path):
    """GPU 1's worker killed mid-run on a tracked stream with rules: the new worker's frames are numbered on from
    the dead one's last record (they started at 0 again: frames twice in the JSONL), its tracks take IDs above
    every ID the dead one delivered (IDs 1 and 2 were given to other objects), the summary's counts of the stream
    add up and the top-level summary counts every event, the dead worker's too (it had no `events`)."""
    out, summary_path = tmp_path / "records.jsonl", tmp_path / "summary.json"
    argv = ["--gpus", "0,1", "--source", "synthetic:640x360@4", "--source", "synthetic:640x360@4",
            "--line", "door:0.5,0,0.5,1", "--zone", "left:0,0,0.5,0,0.5,1,0,1", "--tracker", "bytetrack",
            "--sink", f"jsonl:{out}", "--summary", str(summary_path), "--metrics", ""]
    face = _serve(det_bundle, argv, tmp_path)
    with _killed_at_the_end(face):
        assert wait_for(lambda: len(_tracked(out, 1)) >= 6, timeout=240), "no tracked frames of stream 1"
        os.kill(_worker_pid(face.pid, gpu=1), signal.SIGKILL)
        _wait_for_line(face, "GPU 1's worker started again (restart 1 of 3)")
        before, tracked = _records_of(out, 1), len(_tracked(out, 1))
        assert wait_for(lambda: _records_of(out, 1) >= before + 8 and len(_tracked(out, 1)) >= tracked + 4,
                           timeout=240), "stream 1 did not resume with tracks"
        face.send_signal(signal.SIGTERM)
        _, stderr = face.communicate(timeout=120)
    assert face.returncode == 0, stderr[-3000:]
    summary = json.loads(summary_path.read_text())["summary"]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    frames = [r for r in records if r.get("schema") is None and r["stream"] == 1]
    (death,) = summary["worker_exits"]
    dead, new = frames[:death["frames_delivered"]], frames[death["frames_delivered"]:]
    numbers = [r["frame"] for r in frames]
    assert numbers == sorted(set(numbers)), "a frame number of stream 1 came twice"
    assert new[0]["frame"] == dead[-1]["frame"] + 1  # a camera: numbered on from the dead worker's last record
    old_ids = {i for r in dead for i in r["results"]["track_ids"] if i is not None}
    new_ids = {i for r in new for i in r["results"]["track_ids"] if i is not None}
    assert old_ids and new_ids and min(new_ids) > max(old_ids), (sorted(old_ids), sorted(new_ids))
    assert summary["processed"][1] == len(frames)
    for stream in (0, 1):
        assert summary["captured"][stream] == (summary["processed"][stream] + summary["dropped"][stream] +
                                               summary["failed"][stream])
    tally: dict = {}
    for event in (r for r in records if r.get("schema") == "jetpipe.event/1"):
        what = event.get("direction") or event.get("state") or event["type"].removeprefix("zone_")
        tally.setdefault(event["rule"], {}).setdefault(what, 0)
        tally[event["rule"]][what] += 1
    assert tally and {rule: c for rule, c in summary["events"]["counts"].items() if c} == tally


def _tracked(path: Path, stream: int) -> list[dict]:
    """The frames' records of a stream that hold a track."""
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return [r for r in records if r.get("schema") is None and r["stream"] == stream and
            any(i is not None for i in r["results"].get("track_ids", []))]


def test_a_worker_that_does_not_stop_is_killed_after_the_drain_bound(tiny_bundle, tmp_path):
    """GPU 1's worker frozen (SIGSTOP), then SIGTERM: the face ends anyway, stop_timeout_s + LEFT_BEHIND_S
    after the stop (it waited for ever before), says the kill, and GPU 0's stream is whole."""
    out, port = tmp_path / "records.jsonl", free_port()
    config = tmp_path / "serve.toml"
    config.write_text(f'[pipeline]\nbundle = "{tiny_bundle}"\ngpus = [0, 1]\nstop_timeout_s = 1\n'
                      f'[metrics]\nlisten = "127.0.0.1:{port}"\n[[sink]]\nuri = "jsonl:{out}"\n'
                      '[[source]]\nuri = "synthetic:96x64@5"\n[[source]]\nuri = "synthetic:96x64@5"\n')
    face = subprocess.Popen([sys.executable, "-m", "jetpipe", "serve", str(config), "--summary",
                             str(tmp_path / "summary.json")], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    with _killed_at_the_end(face):
        _wait_for_line(face, "metrics of 2 GPU(s) on http://")
        assert wait_for(lambda: _records_of(out, 0) >= 2)
        frozen = _worker_pid(face.pid, gpu=1)
        os.kill(frozen, signal.SIGSTOP)
        face.send_signal(signal.SIGTERM)
        stdout, stderr = face.communicate(timeout=120)
    assert face.returncode == 1 and "GPU 1's worker did not stop: killed" in stderr, stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())["summary"]
    assert summary["failure"] == "gpu 1: its worker was killed by signal 9"
    assert summary["processed"][0] == _records_of(out, 0) > 0


def test_the_faces_stop_ends_when_its_sink_is_blocked_in_a_write(tiny_bundle, tmp_path):
    """`serve --gpus 0,1 --sink stdout | reader` where the reader stopped reading: the face's writer blocks, its
    readers of the workers' pipes wait on the full queue, and the face's end joined its writer without a bound
    (two SIGTERMs did not end it). Now the writer is given up on at the stop: the workers' last records are
    dropped, they end with their summaries, and the face fails naming the sink."""
    code, summary, text = serve_with_stdout_blocked(tiny_bundle, tmp_path, ["--gpus", "0,1"], env=_env())
    assert code == 1, text[-3000:]
    assert summary["left_behind"] == ["sinks"], summary.get("left_behind")
    assert "sink stdout blocked in a write" in summary["failure"], summary["failure"]
    assert [g["ended"] for g in summary["gpus"]] == ["ran to the end"] * 2  # none killed: each drained


def test_streams_added_through_the_face_go_where_there_is_headroom_and_come_back_whole(tiny_bundle, tmp_path):
    token = "t" * 32
    out, port = tmp_path / "records.jsonl", free_port()
    argv = ["--gpus", "0,1", "--control", "--max-streams", "2", "--sink", f"jsonl:{out}", "--summary",
            str(tmp_path / "summary.json"), "--metrics", f"127.0.0.1:{port}", "--source", "synthetic:96x64@5"]
    face = _serve(tiny_bundle, argv, tmp_path, env={"JETPIPE_CONTROL_TOKEN": token})
    address = f"127.0.0.1:{port}"
    with _killed_at_the_end(face):
        _wait_for_line(face, "metrics of 2 GPU(s) on http://")
        assert _call(address, "GET", "/streams")[0] == 401  # the face checks the caller's token
        status, added = _call(address, "POST", "/streams", {"uri": "synthetic:96x64@5"}, token)
        assert (status, added["gpu"], added["id"]) == (201, 1, 2)  # GPU 1 had nothing; its IDs: 2, 4, ...
        status, pinned = _call(address, "POST", "/streams", {"uri": "synthetic:96x64@5", "gpu": 0}, token)
        assert (status, pinned["gpu"], pinned["id"]) == (201, 0, 1)
        status, refused = _call(address, "POST", "/streams", {"uri": "gst:videotestsrc ! appsink"}, token)
        assert status == 403 and "not allowed" in refused["error"]
        assert _call(address, "POST", "/streams", {"uri": "synthetic", "gpu": 5}, token)[0] == 400
        status, listed = _call(address, "GET", "/streams", token=token)
        assert [(s["id"], s["gpu"]) for s in listed["streams"]] == [(0, 0), (1, 0), (2, 1)]
        assert _call(address, "GET", "/streams/2", token=token)[1]["gpu"] == 1
        assert _call(address, "GET", "/streams/9", token=token)[0] == 404
        assert _call(address, "PUT", "/rules/door", {"kind": "line"}, token)[0] == 501
        assert wait_for(lambda: _records_of(out, 2) >= 3 and _records_of(out, 1) >= 3)
        status, removed = _call(address, "DELETE", "/streams/2", token=token)
        assert status == 200 and removed["state"] == "removed" and removed["gpu"] == 1
        face.send_signal(signal.SIGTERM)
        stdout, stderr = face.communicate(timeout=120)
    assert face.returncode == 0, stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())["summary"]
    assert len(summary["processed"]) == 3  # streams 0, 1, 2 by ID, the removed one too
    for stream in range(3):
        assert summary["processed"][stream] == _records_of(out, stream) > 0


def _call(address: str, method: str, path: str, body=None, token: str | None = None):
    request = urllib.request.Request(f"http://{address}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_each_sinks_counts_are_its_own_when_a_restarted_worker_draws_fewer_sinks():
    """A restarted worker has no jpeg: sink: its video sink's count is still the video sink's."""
    from jetpipe.pipelines.quantiles import RunHistogram
    from jetpipe.pipelines.service.gpus.totals import Outcome, merge

    class FaceSinks:
        def failures(self):
            return [5]

        def dropped(self):
            return [0]

        def deliveries(self):
            return []

    def summary(failures):
        return {"stream_ids": [0], **{name: [1] for name in PER_STREAM}, "backend": "b", "cpu_cores": 0.5,
                "seconds": 1.0, "sink_failures": failures, "sink_frames_dropped": [0] * len(failures)}

    uris = ["jpeg:pictures", "video:out.mp4", "jsonl:out.jsonl"]
    first = Outcome(0, summary([1, 2, 0]), [0], "ran to the end", {}, 0, [0, 1])  # jpeg, video, the face's link
    again = Outcome(1, summary([7, 0]), [1], "ran to the end", {}, 1, [1])  # restarted: video, the face's link
    merged = merge([first, again], 1.0, RunHistogram(), uris, FaceSinks(), 0.0)
    assert merged["sink_failures"] == [1, 9, 5]


@pytest.mark.skipif(not shutil.which("ffmpeg"), reason="ffmpeg is not on PATH (apt-get install ffmpeg)")
def test_every_worker_records_its_streams_into_its_part_and_the_faces_review_api_reads_every_part(
        det_bundle, panning_video, panning_h264, tmp_path):
    """Two workers, --record, --clips and a line: each worker records its own stream, its events and its clips
    into its part of the folders (DIR/worker0, DIR/worker1); the face's review API lists both streams while they
    run, and after the run the events of both, each with its clip and the segment that holds it, served from
    their part; an export reads the part its stream was recorded in."""
    from jetpipe.pipelines.outputs.recording.export import export_range
    from jetpipe.pipelines.outputs.recording.index import INDEX_NAME
    from jetpipe.pipelines.service.http.review import Review

    rec, clips, port = tmp_path / "rec", tmp_path / "clips", free_port()
    config = tmp_path / "serve.toml"
    config.write_text(f"[pipeline]\nbundle = '{det_bundle}'\n[[source]]\nuri = '{panning_h264}'\nrealtime = true\n"
                      f"[[source]]\nuri = '{panning_h264}'\nrealtime = true\n[record]\nfolder = '{rec}'\n"
                      "segment_s = 2\n")
    x = panning_video.x_line
    command = [sys.executable, "-m", "jetpipe", "serve", str(config), "--gpus", "all", "--line", f"door:{x},0,{x},1",
               "--clips", str(clips), "--clip-before", "2", "--clip-after", "2", "--metrics", f"127.0.0.1:{port}",
               "--summary", str(tmp_path / "summary.json")]
    face = subprocess.Popen(command, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    with _killed_at_the_end(face):
        listed = []

        def both_listed() -> bool:
            try:
                listed[:] = json.loads(_get(f"127.0.0.1:{port}", "/review/api/streams"))["streams"]
            except (urllib.error.URLError, ConnectionError):
                return face.poll() is not None  # not serving yet (or done: the assert below says)
            return len(listed) == 2

        wait_for(both_listed, timeout=240)
        assert [s["stream"] for s in listed] == [0, 1] and face.poll() is None
        _, stderr = face.communicate(timeout=240)
    assert face.returncode == 0, stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())["summary"]
    assert [(g["streams"], g["recording"]["segments"] > 0) for g in summary["gpus"]] == [([0], True), ([1], True)]
    # as one process says them: the parts' counts summed, their budgets too, the folder they are in
    assert summary["recording"]["folder"] == str(rec) and summary["recording"]["segments"] == sum(
        g["recording"]["segments"] for g in summary["gpus"])
    assert summary["recording"]["max_bytes"] == sum(g["recording"]["max_bytes"] for g in summary["gpus"])
    assert summary["clips"]["written"] == sum(g["clips"]["written"] for g in summary["gpus"]) > 0
    for worker in (0, 1):  # each part its own recording: its index, its stream's segments, its clips
        db = sqlite3.connect(rec / f"worker{worker}" / INDEX_NAME)
        assert db.execute("SELECT DISTINCT stream FROM segments").fetchall() == [(worker,)]
        assert db.execute("SELECT COUNT(*) FROM events WHERE stream = ?", (worker,)).fetchone()[0] > 0
        db.close()
        assert any((clips / f"worker{worker}").iterdir())
    assert not (rec / INDEX_NAME).exists() and not list(clips.glob("*.mp4"))
    review = Review(rec, "", clips, None)
    events = json.loads(review.answer("/review/api/events?limit=500", {}).body)["events"]
    assert {e["stream"] for e in events} == {0, 1}
    assert [e["time"] for e in events] == sorted((e["time"] for e in events), reverse=True)  # merged, newest first
    second = next(e for e in events if e["stream"] == 1 and e["clip"] and e["recording"])
    assert second["clip"].startswith("/review/media/clip/1.") and "/segment/1." in second["recording"]["url"]
    for url, kind in ((second["clip"], b"ftyp"), (second["recording"]["url"], b"ftyp")):
        reply = review.answer(url, {})
        assert reply.status == 200 and kind in reply.file.read_bytes()[:64]
    assert review.answer("/review/media/segment/7.1", {}).status == 404  # no such part
    recorded = json.loads(review.answer("/review/api/recordings?stream=1", {}).body)["segments"]
    assert recorded and all("/segment/1." in s["url"] for s in recorded)
    done = export_range(rec, 1, recorded[0]["start"], recorded[-1]["end"], tmp_path / "stream1.mp4")
    assert done.segments == len(recorded) and done.bytes > 0


def test_two_workers_on_one_gpu_serve_its_streams_between_them_each_labelled(tiny_bundle, tmp_path):
    """--workers-per-gpu 2 without --gpus: two processes on GPU 0 behind the face, the streams split; the
    metrics, /streams and the summary say which worker serves what; every stream's frames reach the sink."""
    out = tmp_path / "records.jsonl"
    argv = ["--workers-per-gpu", "2", "--frames", "40", "--sink", f"jsonl:{out}",
            "--summary", str(tmp_path / "summary.json"), "--metrics", f"127.0.0.1:{free_port()}"]
    for _ in range(3):
        argv += ["--source", "synthetic:96x64@8"]
    face = _serve(tiny_bundle, argv, tmp_path, env={SIMULATED_ENV: "1"})
    with _killed_at_the_end(face):
        line = _wait_for_line(face, "metrics of 1 GPU(s) (2 workers) on http://")
        address = line.split("http://", 1)[1].split("/", 1)[0]
        workers = Path(f"/proc/{face.pid}/task/{face.pid}/children").read_text().split()
        assert len(workers) == 2  # a process each
        streams = json.loads(_get(address, "/streams"))
        assert streams["gpus"] == [0] and [s["gpu"] for s in streams["streams"]] == [0, 0, 0]
        metrics = _get(address, "/metrics")
        assert 'jetpipe_frames_processed_total{gpu="0",worker="1",stream="0"' in metrics
        assert 'jetpipe_frames_processed_total{gpu="0",worker="2",stream="1"' in metrics
        assert 'jetpipe_frames_processed_total{gpu="0",worker="1",stream="2"' in metrics
        stdout, stderr = face.communicate(timeout=180)
    assert face.returncode == 0, stderr[-3000:]
    assert "failed while closing" not in stderr  # the worker's link to the face closes as a sink (it did not)
    summary = json.loads((tmp_path / "summary.json").read_text())["summary"]
    assert [(g["gpu"], g["worker"], g["streams"]) for g in summary["gpus"]] == [(0, "GPU 0 worker 1", [0, 2]),
                                                                               (0, "GPU 0 worker 2", [1])]
    assert summary["captured"] == [40, 40, 40] and "failure" not in summary
    for stream in range(3):
        assert _records_of(out, stream) == summary["processed"][stream] > 0


def test_a_workers_labels_name_it_where_its_gpu_has_several():
    assert scrape.labels(1, 0) == 'gpu="1"'
    assert scrape.labels(0, 2) == 'gpu="0",worker="2"'
    texts = {scrape.labels(0, 1): 'x{stream="0"} 1\n', scrape.labels(0, 2): 'x 2\n'}
    assert scrape.merge(texts).splitlines() == ['x{gpu="0",worker="1",stream="0"} 1', 'x{gpu="0",worker="2"} 2']


def test_the_workers_metrics_are_merged_a_family_once_each_sample_labelled():
    texts = {0: '# HELP x_total X.\n# TYPE x_total counter\nx_total{stream="0"} 3.0\ny 1\n',
             1: '# HELP x_total X.\n# TYPE x_total counter\nx_total{stream="1"} 4.0\n'}
    assert scrape.merge(texts).splitlines() == ['# HELP x_total X.', '# TYPE x_total counter',
                                                'x_total{gpu="0",stream="0"} 3.0', 'y{gpu="0"} 1',
                                                'x_total{gpu="1",stream="1"} 4.0']


# --- helpers ---------------------------------------------------------------------------------------------
def _frames_in(path: Path) -> int:
    probe = subprocess.run(["ffprobe", "-v", "error", "-count_packets", "-select_streams", "v:0", "-show_entries",
                            "stream=nb_read_packets", "-of", "csv=p=0", str(path)], capture_output=True, text=True)
    return int(probe.stdout.strip() or 0)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _env() -> dict:
    return {**os.environ, SIMULATED_ENV: "2", "PYTHONPATH": str(ROOT)}


def _serve(bundle, argv, cwd, wait: bool = False, env: dict | None = None):
    command = [sys.executable, "-m", "jetpipe", "serve", "--bundle", str(bundle), *argv]
    env = {**_env(), **(env or {})}
    if wait:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def _killed_at_the_end(process):
    """The process, killed (with its output read) where the test left it running."""
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _wait_for_line(process, text: str, timeout: float = 180.0) -> str:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        seen.append(line)
        if text in line:
            return line
        if not line and process.poll() is not None:
            break
    raise AssertionError(f"{text!r} not said; stderr: {''.join(seen)[-3000:]}")


def _get(address: str, path: str) -> str:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as reply:
        return reply.read().decode()


def _picture(address: str, stream: int) -> bytes:
    try:
        with urllib.request.urlopen(f"http://{address}/preview/{stream}.jpg", timeout=10) as reply:
            return reply.read()
    except urllib.error.HTTPError:
        return b""


def _health(address: str) -> str:
    try:
        return _get(address, "/healthz")
    except urllib.error.HTTPError as exc:
        return exc.read().decode()


def _records_of(path: Path, stream: int) -> int:
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    return sum(1 for line in lines if line.endswith("}") and json.loads(line)["stream"] == stream)


def _worker_pid(face_pid: int, gpu: int) -> int:
    """The face's child that runs GPU `gpu` (its environment says CUDA_VISIBLE_DEVICES)."""
    children = Path(f"/proc/{face_pid}/task/{face_pid}/children").read_text().split()
    for pid in map(int, children):
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"CUDA_VISIBLE_DEVICES={gpu}".encode() in environ:
            return pid
    raise AssertionError(f"no worker of GPU {gpu} among {children}")


def test_a_frames_record_goes_alone_as_its_latency_where_the_face_has_no_sink_for_it(tmp_path):
    from jetpipe.pipelines.core.events.record import EventRecord
    from jetpipe.pipelines.core.record import FrameRecord
    from jetpipe.pipelines.service.gpus import channel

    frame = FrameRecord(3, "synthetic", 7, 0.25, 1.0, 1.1, {"total": 12.5}, "text-detection",
                        {"boxes": [[0, 0, 1, 1]] * 3, "track_ids": [4, None, 9]})
    event = EventRecord("line_cross", "door", 3, 7, 0.25, 1.0, 1, None, None, 0.9, [0, 0, 1, 1], {}, {})
    for records in (True, False):
        read, write = os.pipe()
        sink = channel.ForwardSink(channel.Outbox(write), records=records)
        sink.write(frame)
        sink.write(event)
        sink.outbox.close()
        with os.fdopen(read, "rb") as lines:
            (_, first), (_, second) = [channel.parse(line) for line in lines]
        assert first.latency_ms == 12.5 and second.latency_ms is None and second.stream == 3
        assert (first.record is not None) == records and (first.record is None or
                                                          first.record.json() == frame.json())
        assert (second.record.stream, second.record.type, second.record.json()) == (3, "line_cross", event.json())
        assert (first.frame, first.track, second.frame, second.track) == (7, 9, 7, 1)  # where a restart goes on


def test_a_restarted_workers_camera_numbers_on_and_its_file_skips_what_was_delivered():
    from jetpipe.pipelines.config import SourceConfig
    from jetpipe.pipelines.ingest.streams import Resume, Stream, Streams

    streams = Streams(2, [4, 5], resume=Resume(frames={4: 20, 5: 3}))
    camera, file = Stream(4, SourceConfig("synthetic:64x64@5"), None, 0), Stream(5, SourceConfig("clip.mp4"), None, 1)
    assert [streams.frame_number(camera, n) for n in (0, 1)] == [20, 21]
    assert [streams.frame_number(file, n) for n in range(5)] == [None, None, None, 3, 4]  # read again from its start
    assert Streams(1).frame_number(camera, 0) == 0  # not restarted


def test_a_dead_workers_frames_and_events_are_counted_as_its_records_tell():
    from jetpipe.pipelines.ingest.streams import Resume
    from jetpipe.pipelines.service.gpus import totals

    dead = totals.Outcome(1, None, [1], "was killed by signal 9", {1: 15}, 0, [], Resume(),
                          Resume({1: 20}, {1: 7}, {"door": {"in": 2}}))
    assert dead.died_with(1) == {"captured": 20, "processed": 15, "dropped": 5, "dropped_catching_up": 0, "failed": 0,
                                 "reconnects": 0, "stalls": 0, "decode_errors": 0}
    newer = totals.Outcome(1, {"events": {"counts": {"door": {"in": 3}}, "occupancy": {}, "cpu_s": 0.5}}, [1], "ran",
                           {1: 9}, 1, [], Resume({1: 20}), Resume())
    other = totals.Outcome(0, {"events": {"counts": {"door": {"out": 1}}, "occupancy": {}, "cpu_s": 0.25}}, [0],
                           "ran", {0: 9}, 0, [], Resume(), Resume())
    # GPU 1's newest worker counts on from the dead one's 2 (its 3 hold them); GPU 0's add
    assert totals.merged_events([dead, newer, other]) == {"counts": {"door": {"in": 3, "out": 1}}, "occupancy": {},
                                                          "cpu_s": 0.75}
    assert totals.merged_events([other, dead])["counts"] == {"door": {"out": 1, "in": 2}}


@pytest.mark.skipif(not (shutil.which("ffmpeg") and shutil.which("ffprobe")),
                    reason="ffmpeg and ffprobe are not on PATH (apt-get install ffmpeg)")
def test_a_worker_killed_while_recording_loses_at_most_its_open_segment_and_its_successor_records_on(
        tiny_bundle, panning_h264, tmp_path):
    """GPU 1's worker killed with SIGKILL while writing a segment: the worker started in its place takes its part
    back, finishes the open row from its file (cut after its last whole fragment) and records on; GPU 0's part
    is not touched; every segment of the part plays, each as many frames as its row says."""
    from jetpipe.pipelines.outputs.recording.index import INDEX_NAME

    rec, config = tmp_path / "rec", tmp_path / "serve.toml"
    source = f"[[source]]\nuri = '{panning_h264}'\nloop = true\nrealtime = true\n"
    config.write_text(f"[pipeline]\nbundle = '{tiny_bundle}'\n{source}{source}[record]\nfolder = '{rec}'\n"
                      "segment_s = 2\n")

    def rows(worker: int, sql: str) -> list:
        index = rec / f"worker{worker}" / INDEX_NAME
        if not index.exists():
            return []
        db = sqlite3.connect(f"file:{index}?mode=ro", uri=True, timeout=5)
        try:
            return db.execute(sql).fetchall()
        except sqlite3.OperationalError:  # not made yet
            return []
        finally:
            db.close()

    face = subprocess.Popen([sys.executable, "-m", "jetpipe", "serve", str(config), "--gpus", "0,1", "--metrics", "",
                             "--summary", str(tmp_path / "summary.json")], cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with _killed_at_the_end(face):
        wait_for(lambda: len(rows(1, "SELECT 1 FROM segments WHERE open = 0")) >= 2, timeout=240)
        wait_for(lambda: any((rec / "worker1" / p).exists() and (rec / "worker1" / p).stat().st_size > 0
                             for p, in rows(1, "SELECT path FROM segments WHERE open = 1")), timeout=60)
        os.kill(_worker_pid(face.pid, gpu=1), signal.SIGKILL)
        left = rows(1, "SELECT path FROM segments WHERE open = 1")
        _wait_for_line(face, "GPU 1's worker started again (restart 1 of 3)")
        closed = len(rows(1, "SELECT 1 FROM segments WHERE open = 0"))
        wait_for(lambda: len(rows(1, "SELECT 1 FROM segments WHERE open = 0")) >= closed + 2, timeout=120)
        face.send_signal(signal.SIGTERM)
        _, stderr = face.communicate(timeout=120)
    assert face.returncode == 0, stderr[-3000:]
    assert len(left) == 1  # it died writing one
    summary = json.loads((tmp_path / "summary.json").read_text())["summary"]
    repaired = summary["gpus"][1]["recording"]["repaired"]
    assert repaired["finished"] + repaired["dropped"] == 1 and repaired["adopted"] == 0
    assert summary["gpus"][0]["recording"]["repaired"] == {"finished": 0, "dropped": 0, "adopted": 0}
    for worker in (0, 1):
        segments = rows(worker, "SELECT path, packets, open FROM segments ORDER BY start")
        assert segments and all(not open_ for _, _, open_ in segments)
        assert {p.split("/")[0] for p, _, _ in segments} == {f"stream{worker}"}
        for path, packets, _ in segments:
            probed = subprocess.run(["ffprobe", "-v", "error", "-count_packets", "-select_streams", "v:0",
                                     "-show_entries", "stream=nb_read_packets", "-of", "csv=p=0",
                                     str(rec / f"worker{worker}" / path)], capture_output=True, text=True)
            assert probed.returncode == 0 and int(probed.stdout) == packets, (path, probed.stderr)
