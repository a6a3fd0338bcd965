"""`--backend triton://HOST:PORT/NAME` against a real Triton server (nvidia-pytriton's tritonserver, hosting the
bundle's ONNX through ONNX Runtime in its Python backend; tests/triton_server.py): the same results as the
local ONNX Runtime backend frame by frame, one line when the server or model is not there, and a server
lost mid-run counted, asked again and served on."""

import json
import subprocess
import threading
import time

import pytest

from jetpipe.cli import main
from tests.triton_server import HOSTS, TRITON_PYTHON, TritonServer, free_ports


def _needs_triton() -> None:
    usable = TRITON_PYTHON.exists() and subprocess.run(
        [str(TRITON_PYTHON), "-c", "import pytriton, onnxruntime"], capture_output=True).returncode == 0
    if not usable:
        pytest.skip(f"no Triton server venv (nvidia-pytriton + onnxruntime) at {TRITON_PYTHON}: .ci/run makes it "
                    "with /usr/bin/python3 -m venv .venv-triton && .venv-triton/bin/pip install nvidia-pytriton "
                    "onnxruntime")
    pytest.importorskip("tritonclient.grpc", reason="the Triton backend's client: pip install 'tritonclient[grpc]'")


def _cpu_server(det_bundle, folder, host: str):
    """The model on the server's CPU: its outputs bit-equal to the local onnxruntime-cpu backend's. Hosted
    through pytriton and as a model repository of Triton's Python backend (tests/triton_server.py)."""
    _needs_triton()
    triton = TritonServer(det_bundle, "det", folder / "triton.log", host=host)
    triton.start()
    yield triton
    triton.stop()


@pytest.fixture(scope="module", params=HOSTS)
def server(det_bundle, tmp_path_factory, request):
    """One server a host for the tests that only ask it (a start and a stop cost 6-8 s on two cores)."""
    yield from _cpu_server(det_bundle, tmp_path_factory.mktemp("triton"), request.param)


@pytest.fixture(params=HOSTS)
def server_to_lose(det_bundle, tmp_path, request):
    """A server of the test's own: it stops and starts it."""
    yield from _cpu_server(det_bundle, tmp_path, request.param)


@pytest.fixture(params=HOSTS)
def gpu_server(det_bundle_square, tmp_path, request):
    """The detector at its own 640x640 on the server's GPU (ONNX Runtime's CUDA provider in the Triton venv, where
    it has one), hosted through pytriton and in Triton's Python backend (GPU instances that read a batch in CUDA
    shared memory where it is). At 640x640, the size the GPU tests compare at: at 384x640 one box of the test
    video came out 8 pixels apart between the server's process and the local one (a word's region near the
    binarization threshold), every other box within 0.1 pixel."""
    _needs_triton()
    triton = TritonServer(det_bundle_square, "det", tmp_path / "triton.log", gpu=True, host=request.param)
    triton.start()
    yield triton
    triton.stop()


def _serve(bundle, backend, source, out, *extra) -> int:
    return main(["serve", "--bundle", str(bundle), "--backend", backend, "--source", str(source), "--sink",
                 f"jsonl:{out}", "--metrics", "", *extra])


def test_serving_through_triton_gives_the_local_backends_results_frame_by_frame(det_bundle, server, text_video,
                                                                                tmp_path, capsys):
    """Through shared memory (auto: the server is on this host) and plain gRPC (?shm=off), each frame's results
    equal the local backend's; the summary names the transport."""
    video, words = text_video
    runs = {}
    cpu = "preprocess=cpu"  # the CPU path on any machine: what the local onnxruntime-cpu backend runs
    for name, backend in (("shm", f"{server.uri}?{cpu}"), ("grpc", f"{server.uri}?shm=off&{cpu}"),
                          ("local", "onnxruntime-cpu")):
        out = tmp_path / f"{name}.jsonl"
        capsys.readouterr()
        assert _serve(det_bundle, backend, video, out) == 0
        summary = json.loads(capsys.readouterr().err.strip().splitlines()[-1])["summary"]
        transport = {"shm": ", shared memory)", "grpc": ", gRPC)", "local": "onnxruntime-cpu"}[name]
        assert summary["backend"].endswith(transport), summary["backend"]
        runs[name] = [json.loads(line)["results"] for line in out.read_text().splitlines()]
    assert len(runs["shm"]) == len(words)
    assert runs["shm"] == runs["local"] and runs["grpc"] == runs["local"]
    assert all(r["boxes"] for r in runs["shm"])


def test_a_server_that_is_not_there_or_a_missing_model_is_one_line(det_bundle, server, tmp_path, capsys):
    (closed,) = free_ports(1)
    for backend, message in ((f"triton://127.0.0.1:{closed}/det", f"Triton server 127.0.0.1:{closed} does not answer"),
                             (server.uri.replace("/det", "/rec"), "has no ready model 'rec'"),
                             (server.uri + "?shm=cuda&preprocess=cpu", "CUDA shared memory needs the GPU runtime")):
        capsys.readouterr()
        assert _serve(det_bundle, backend, "synthetic", tmp_path / "x.jsonl", "--frames", "2") == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


MALFORMED = [("triton://127.0.0.1/det", "a Triton backend is triton://HOST:PORT/NAME"),
             ("triton://127.0.0.1:8001/det?shm=nvlink", "the query takes shm=auto|system|cuda|off"),
             ("triton://127.0.0.1:8001/det?preprocess=npu", "preprocess=auto|gpu|cpu"),
             ("triton://127.0.0.1:8001/det?timeout=3", "the query takes shm=")]


def test_a_server_that_refuses_shared_memory_is_served_by_grpc_or_refused_when_it_was_asked_for(det_bundle, tmp_path,
                                                                                               capsys):
    """A server restricting shared-memory registration (an access-token header, as pytriton's default): auto
    falls back to plain gRPC and says so; ?shm=system is one line, exit 2."""
    _needs_triton()
    triton = TritonServer(det_bundle, "det", tmp_path / "triton.log", restrict_shm=True)
    triton.start()
    try:
        out = tmp_path / "out.jsonl"
        capsys.readouterr()
        assert _serve(det_bundle, triton.uri, "synthetic://320x240@0/nv12", out, "--frames", "3") == 0
        summary = json.loads(capsys.readouterr().err.strip().splitlines()[-1])["summary"]
        assert summary["backend"].endswith(", gRPC)") and summary["processed"] == [3]
        assert _serve(det_bundle, triton.uri + "?shm=system", "synthetic", out, "--frames", "1") == 2
        err = capsys.readouterr().err
        assert "shared memory failed" in err and "?shm=off" in err and len(err.strip().splitlines()) == 1, err
    finally:
        triton.stop()


@pytest.mark.parametrize("uri, message", MALFORMED)
def test_a_malformed_backend_uri_is_refused_before_anything_starts(det_bundle, tmp_path, capsys, uri, message):
    with pytest.raises(SystemExit) as exited:  # argparse's own exit for a bad flag value
        _serve(det_bundle, uri, "synthetic", tmp_path / "x.jsonl")
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_server_lost_mid_run_fails_its_batches_and_is_served_again_once_back(det_bundle, server_to_lose, tmp_path):
    """The server killed while a live stream runs: batches fail (counted) instead of the pipeline, the
    backend asks again after its backoff, and once the server is back frames are processed again (through
    shared memory: the restarted server is told of the regions again)."""
    from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
    from jetpipe.pipelines.service.daemon import Pipeline

    out = tmp_path / "out.jsonl"
    config = validate(PipelineConfig(bundle=det_bundle, sources=[SourceConfig("synthetic://320x240@10/nv12")],
                                     sinks=[f"jsonl:{out}"], backend=server_to_lose.uri, metrics_listen="", max_batch=1,
                                     fail_timeout_s=0.0))
    pipeline = Pipeline(config)
    assert pipeline.runtime.backend.transport.endswith("shared memory")  # CUDA's with the GPU runtime
    summaries = []
    serving = threading.Thread(target=lambda: summaries.append(pipeline.run()))
    serving.start()

    def wait_for(condition, what: str, seconds: float = 180) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            assert serving.is_alive() and time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.1)

    try:
        wait_for(lambda: sum(pipeline.metrics.processed) >= 3, "frames served")
        server_to_lose.stop()
        wait_for(lambda: sum(pipeline.metrics.failed) >= 2, "failed batches while the server is gone")
        server_to_lose.start()
        back_at = sum(pipeline.metrics.processed)
        wait_for(lambda: sum(pipeline.metrics.processed) >= back_at + 3, "frames served again")
    finally:
        pipeline.stop()
        serving.join(120)
    summary = summaries[0]
    assert summary["failed"][0] >= 2 and summary["processed"][0] >= 6
    assert not summary.get("failure")
    assert len(out.read_text().splitlines()) == summary["processed"][0]


def test_a_secondary_under_a_triton_primary_needs_its_own_backend(det_bundle, rec_bundle, tmp_path, capsys):
    code = main(["serve", "--bundle", str(det_bundle), "--backend", "triton://127.0.0.1:8001/det", "--secondary",
                 str(rec_bundle), "--source", "synthetic", "--frames", "1", "--metrics", ""])
    err = capsys.readouterr().err
    assert code == 2 and "give the secondary its own backend in its [[secondary]] table" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_secondaries_read_through_triton_what_they_read_here(det_bundle, rec_bundle, text_video, tmp_path):
    """PP-OCRv4 det then rec on the text video: the recognizer's model on a Triton server (crops cut here,
    each batch of crops through shared memory), then both models on servers of their own: every record is
    what the all-local run writes."""
    from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
    from jetpipe.pipelines.core.secondary import SecondaryConfig
    from jetpipe.pipelines.service.daemon import Pipeline

    _needs_triton()
    servers = [TritonServer(bundle, name, tmp_path / f"{name}.log") for bundle, name in ((det_bundle, "det"),
                                                                                       (rec_bundle, "rec"))]
    for server in servers:
        server.start()
    video, words = text_video
    cpu = "?preprocess=cpu"
    det_uri, rec_uri = (server.uri + cpu for server in servers)
    runs = {}
    try:
        for name, primary, secondary in (("local", "onnxruntime-cpu", "onnxruntime-cpu"),
                                         ("rec on triton", "onnxruntime-cpu", rec_uri),
                                         ("both on triton", det_uri, rec_uri)):
            out = tmp_path / f"{name}.jsonl"
            config = validate(PipelineConfig(
                bundle=det_bundle, sources=[SourceConfig(str(video))], sinks=[f"jsonl:{out}"], backend=primary,
                metrics_listen="", secondaries=[SecondaryConfig(rec_bundle, name="text", backend=secondary)]))
            summary = Pipeline(config).run()
            assert sum(summary["failed"]) == 0
            assert summary["secondary"]["text"]["backend"].startswith("triton" if "triton" in name else "onnxruntime")
            runs[name] = [json.loads(line)["results"] for line in out.read_text().splitlines()]
    finally:
        for server in servers:
            server.stop()
    assert len(runs["local"]) == len(words)
    assert any(e and e["text"].strip() for r in runs["local"] for e in r["secondary"]["text"])
    assert runs["rec on triton"] == runs["local"] and runs["both on triton"] == runs["local"]


def test_two_batches_in_flight_through_triton_each_get_their_own_answer(det_bundle, server):
    """The runtime API with two buffer sets: both batches are sent before either is collected (requests are
    asynchronous), and each comes back with its own frames' outputs, equal to the local backend's."""
    import numpy as np

    from jetpipe.runtime.cpu_runtime import CpuRuntime
    from jetpipe.synth import render_text_image

    frames = [[render_text_image(seed, (480, 640)).bgr] for seed in (11, 12)]
    with CpuRuntime(det_bundle, 1, buffer_sets=2, backend=server.uri) as remote, \
            CpuRuntime(det_bundle, 1, buffer_sets=2) as local:
        assert remote.backend.transport == "shared memory"
        tickets = [remote.submit(f) for f in frames]
        assert len(remote.backend.pending) == 2  # both out before either answer is read
        for ticket, f in zip(tickets, frames):
            got = remote.collect(ticket).outputs
            want = local.infer(f).outputs
            for name in want:
                np.testing.assert_allclose(got[name], want[name], atol=1e-5)


@pytest.mark.gpu
def test_the_gpu_runtimes_kernel_in_front_of_triton_reads_what_the_local_gpu_runtime_reads(det_bundle_square,
                                                                                         gpu_server, text_video,
                                                                                         tmp_path):
    """On the GPU machine: frames preprocessed by our kernel, the batch through CUDA shared memory (auto: the
    server reads our device buffer in place) and through system shared memory, the outputs reduced on the
    GPU (postprocess auto): the boxes of every frame are the local GPU runtime's (onnxruntime-cuda) within a
    pixel (the server's ONNX Runtime is another process)."""
    import numpy as np
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu (CUDA execution provider) is not installed")
    from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
    from jetpipe.pipelines.service.daemon import Pipeline

    video, words = text_video
    runs = {}
    for name, backend in (("cuda", gpu_server.uri), ("system", gpu_server.uri + "?shm=system"),
                          ("local", "onnxruntime-cuda")):
        out = tmp_path / f"{name}.jsonl"
        # the bundle the server hosts (gpu_server); another size is refused by the server ("Expected [-1,3,...]")
        config = validate(PipelineConfig(bundle=det_bundle_square, sources=[SourceConfig(str(video), decoder="ffmpeg")],
                                         sinks=[f"jsonl:{out}"], backend=backend, metrics_listen=""))
        pipeline = Pipeline(config)
        assert type(pipeline.runtime).__name__ == "GpuRuntime"
        summary = pipeline.run()
        assert summary["postprocess"] == "gpu" and sum(summary["failed"]) == 0
        runs[name] = [json.loads(line)["results"] for line in out.read_text().splitlines()]
        transport = {"cuda": ", CUDA shared memory)", "system": "(127.0.0.1", "local": "onnxruntime-cuda"}[name]
        assert transport in summary["backend"] and summary["backend"].endswith(
            {"cuda": "CUDA shared memory)", "system": ", shared memory)", "local": "cuda"}[name]), summary["backend"]
    assert len(runs["cuda"]) == len(runs["system"]) == len(runs["local"]) == len(words)
    for name in ("cuda", "system"):
        for got, want in zip(runs[name], runs["local"]):
            assert len(got["boxes"]) == len(want["boxes"]) > 0
            np.testing.assert_allclose(got["boxes"], want["boxes"], atol=1.0)


@pytest.mark.gpu
def test_on_the_gpu_both_models_through_triton_read_what_the_local_gpu_runtime_reads(det_bundle_square, rec_bundle,
                                                                                     text_video, tmp_path):
    """GPU runtimes in front of two servers (det, rec on ONNX Runtime's CUDA provider): the detector's frames
    and the recognizer's crops cut on this GPU, each batch through shared memory; the records match the
    local GPU runtime's (boxes within a pixel, at least 95 % of the lines read alike: another process's
    CUDA kernels may round differently)."""
    import numpy as np
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu (CUDA execution provider) is not installed")
    from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
    from jetpipe.pipelines.core.secondary import SecondaryConfig
    from jetpipe.pipelines.service.daemon import Pipeline

    _needs_triton()
    servers = [TritonServer(bundle, name, tmp_path / f"{name}.log", gpu=True)
               for bundle, name in ((det_bundle_square, "det"), (rec_bundle, "rec"))]
    for server in servers:
        server.start()
    video, words = text_video
    runs = {}
    try:
        for name, primary, secondary in (("local", "onnxruntime-cuda", "onnxruntime-cuda"),
                                         ("triton", servers[0].uri, servers[1].uri)):
            out = tmp_path / f"{name}.jsonl"
            config = validate(PipelineConfig(
                bundle=det_bundle_square, sources=[SourceConfig(str(video), decoder="ffmpeg")], sinks=[f"jsonl:{out}"],
                backend=primary, metrics_listen="",
                secondaries=[SecondaryConfig(rec_bundle, name="text", backend=secondary)]))
            pipeline = Pipeline(config)
            assert pipeline.runtime.device_frames and pipeline.secondaries[0].runtime.device_frames
            summary = pipeline.run()
            assert sum(summary["failed"]) == 0
            runs[name] = [json.loads(line)["results"] for line in out.read_text().splitlines()]
    finally:
        for server in servers:
            server.stop()
    assert len(runs["triton"]) == len(runs["local"]) == len(words)
    same = total = 0
    for got, want in zip(runs["triton"], runs["local"]):
        np.testing.assert_allclose(got["boxes"], want["boxes"], atol=1.0)
        for a, b in zip(got["secondary"]["text"], want["secondary"]["text"]):
            same, total = same + (a is not None and b is not None and a["text"] == b["text"]), total + 1
    assert total > 0 and same / total >= 0.95, (same, total)


@pytest.mark.parametrize("host", HOSTS)
def test_a_stopped_server_leaves_no_shared_memory_behind(det_bundle, tmp_path, host):
    """The test server's stop() is Ctrl-C, so that pytriton and tritonserver unlink their regions in /dev/shm.
    Killed outright, each start left one of ~40 MB there (RAM, until reboot): a day of test runs filled a 24 GB
    /dev/shm and the suite was killed for memory."""
    import os
    from pathlib import Path

    _needs_triton()
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm on this system")
    before = set(os.listdir(shm))
    triton = TritonServer(det_bundle, "det", tmp_path / "triton.log", host=host)
    triton.start()
    made = set(os.listdir(shm)) - before
    triton.stop()
    assert made, "the server made no region in /dev/shm: this test checks nothing"
    assert not made & set(os.listdir(shm))
