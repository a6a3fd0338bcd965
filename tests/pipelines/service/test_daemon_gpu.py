"""The daemon end to end on the GPU (marker gpu): PyCUDA + onnxruntime-gpu, both frame memory modes."""

import json

import numpy as np
import pytest

from jetpipe.pipelines.ingest.sources import SyntheticCamera
from jetpipe.pipelines.service.daemon import Pipeline
from tests.pipelines.service.test_daemon import _config, _iou, _lines

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _cuda_ep():
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu (CUDA execution provider) is not installed")


@pytest.mark.parametrize("memory", ["staged", "mapped"])
def test_gpu_pipeline_accounts_for_every_frame_and_finds_text(det_bundle_square, tmp_path, memory):
    out = tmp_path / "r.jsonl"
    uri = "synthetic:1280x720@0:nv12"
    config = _config(det_bundle_square, [uri, "synthetic:640x480@0:yuyv"], sinks=[f"jsonl:{out}"], frames=40,
                     backend="onnxruntime-cuda", memory=memory, queue_depth=4)
    pipeline = Pipeline(config)
    assert pipeline.runtime.backend_name == "onnxruntime-cuda" and pipeline.runtime.memory == memory
    summary = pipeline.run()
    for s in range(2):
        assert summary["processed"][s] + summary["dropped"][s] + summary["failed"][s] == 40
    assert 0 < summary["gpu_busy_share"] <= 1  # the GPU's time on the batches, a share of the run
    records = _lines(out)
    assert len(records) == sum(summary["processed"])
    camera = SyntheticCamera.from_uri(uri, seed=0)
    hits = []
    for record in (r for r in records if r["stream"] == 0):
        found = np.array(record["results"]["boxes"]).reshape(-1, 4)
        hits += [max((_iou(t, f) for f in found), default=0) >= 0.5 for t in camera.visible_boxes(record["frame"])]
    assert np.mean(hits) >= 0.75
    print(json.dumps({"memory": memory, **{k: summary[k] for k in ("processed", "dropped", "throughput_fps")}}))


def test_gpu_and_cpu_postprocessing_agree_in_the_daemon(det_bundle_square, tmp_path):
    runs = {}
    for where in ("gpu", "cpu"):
        out = tmp_path / f"{where}.jsonl"
        config = _config(det_bundle_square, ["synthetic:1280x720@30:nv12"], sinks=[f"jsonl:{out}"], frames=30,
                         backend="onnxruntime-cuda", postprocess=where)
        summary = Pipeline(config, profile=True).run()
        assert summary["postprocess"] == where and summary["gpu_stage_ms"]["infer"] > 0
        runs[where] = ({r["frame"]: r["results"] for r in _lines(out)}, summary)
    (gpu, gpu_summary), (cpu, cpu_summary) = runs["gpu"], runs["cpu"]
    common = sorted(set(gpu) & set(cpu))
    assert len(common) >= 8
    for frame in common:
        assert len(gpu[frame]["boxes"]) == len(cpu[frame]["boxes"]) > 0
        np.testing.assert_allclose(gpu[frame]["boxes"], cpu[frame]["boxes"], atol=1.0)
        np.testing.assert_allclose(gpu[frame]["scores"], cpu[frame]["scores"], atol=1e-3)
    assert gpu_summary["d2h_bytes_per_frame"] * 10 < cpu_summary["d2h_bytes_per_frame"]
    print(json.dumps({w: {k: s[k] for k in ("d2h_bytes_per_frame", "cpu_seconds", "gpu_stage_ms")}
                      for w, (_, s) in runs.items()}))
