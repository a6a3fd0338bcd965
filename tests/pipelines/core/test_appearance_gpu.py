"""botsort's looks on the GPU (marker gpu): the colour cue's crops cut where the frames are in device memory
(NVDEC's frames, or the batch's staging copy of host-decoded ones: no frame uploaded again), run by ONNX
Runtime's CUDA provider; what it learns of the scene's looks is what the CPU runtime learns from the same
video."""

import json
import shutil

import pytest

from jetpipe.cli import main

pytestmark = pytest.mark.gpu


def _serve(det, video, backend, decoder, out, capsys) -> tuple[dict, int]:
    capsys.readouterr()
    assert main(["serve", "--bundle", str(det), "--source", str(video), "--reid", "colour", "--decoder", decoder,
                 "--backend", backend, "--sink", f"jsonl:{out}", "--metrics", ""]) == 0
    summary = json.loads(capsys.readouterr().err.strip().splitlines()[-1])["summary"]
    tracked = sum(sum(1 for t in json.loads(line)["results"]["track_ids"] if t is not None and t >= 0)
                  for line in out.read_text().splitlines())
    return summary, tracked


def test_the_colour_cue_on_nvdec_frames_learns_what_the_cpu_runtime_learns(det_bundle_square, tmp_path, capsys):
    import onnxruntime as ort

    from jetpipe.calibration.tracking_scenes import render_scene

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu (CUDA execution provider) is not installed")
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg renders the scene (apt-get install ffmpeg)")
    video = tmp_path / "scene.mp4"
    render_scene("stop_and_go", video, fps=10, seconds=8, seed=3)
    cpu, cpu_tracked = _serve(det_bundle_square, video, "onnxruntime-cpu", "ffmpeg", tmp_path / "cpu.jsonl", capsys)
    for decoder in ("nvdec", "ffmpeg"):  # NVDEC's frames; host frames, cut from the batch's staging copy
        gpu, gpu_tracked = _serve(det_bundle_square, video, "onnxruntime-cuda", decoder, tmp_path / f"{decoder}.jsonl",
                                  capsys)
        print(decoder, cpu["reid"], gpu["reid"], cpu_tracked, gpu_tracked)
        assert gpu["reid"]["backend"] == "onnxruntime-cuda" and gpu["reid"]["crops"] > 0 and gpu["reid"]["used"]
        for key in ("one_object_cosine", "two_objects_cosine"):
            assert abs(gpu["reid"][key] - cpu["reid"][key]) < 0.05, (decoder, key)
        assert abs(gpu_tracked - cpu_tracked) <= 0.05 * cpu_tracked, decoder
        assert gpu["reid"]["frame_bytes_uploaded"] == 0  # cut where the frames already were
