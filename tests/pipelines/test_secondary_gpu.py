"""The OCR chain on the GPU (marker gpu): crops cut from frames in device memory (NVDEC slots, or a batch's
staging copy), the recognizer's best class per step reduced on the device; the same text as the CPU
runtime reads, and no frame or crop uploaded for the secondary."""

import json
import shutil
import subprocess

import pytest

from jetpipe.cli import main

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def h264_text(text_video, tmp_path_factory):
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg not installed (it encodes the test video)")
    out = tmp_path_factory.mktemp("h264text") / "text.mp4"
    subprocess.run(["ffmpeg", "-v", "error", "-i", str(text_video[0]), "-c:v", "libx264", "-qp", "8",
                    "-pix_fmt", "yuv420p", str(out)], check=True)
    return out, text_video[1]


def _serve(det, rec, video, backend, decoder, out, capsys) -> tuple[list, dict]:
    capsys.readouterr()
    assert main(["serve", "--bundle", str(det), "--secondary", str(rec), "--source", str(video), "--decoder", decoder,
                 "--sink", f"jsonl:{out}", "--metrics", "", "--backend", backend]) == 0
    summary = json.loads(capsys.readouterr().err.strip().splitlines()[-1])["summary"]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return [[e["text"] if e else None for e in r["results"]["secondary"][rec.name]] for r in records], summary


def test_det_then_rec_on_the_gpu_reads_what_the_cpu_runtime_reads(det_bundle, rec_bundle, h264_text, tmp_path,
                                                                   capsys):
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu (CUDA execution provider) is not installed")
    video, words = h264_text
    cpu, _ = _serve(det_bundle, rec_bundle, video, "onnxruntime-cpu", "ffmpeg", tmp_path / "cpu.jsonl", capsys)
    for decoder in ("ffmpeg", "nvdec"):
        gpu, summary = _serve(det_bundle, rec_bundle, video, "onnxruntime-cuda", decoder,
                              tmp_path / f"{decoder}.jsonl", capsys)
        stage = summary["secondary"][rec_bundle.name]
        assert stage["postprocess"] == "gpu" and stage["crops"] >= 40
        assert stage["frame_bytes_uploaded"] == 0  # crops cut where the frames already were
        assert stage["d2h_bytes_per_crop"] <= 40 * 24  # best class per step, not the scores
        lines = [(c, g) for cf, gf in zip(cpu, gpu) for c, g in zip(cf, gf)]
        same = sum(c == g for c, g in lines)
        assert len(gpu) == len(cpu) and same >= 0.95 * len(lines), (decoder, [p for p in lines if p[0] != p[1]])
        read = sum(len(set(w) & {x for t in frame if t for x in t.split()}) for frame, w in zip(gpu, words))
        assert read >= 0.9 * sum(map(len, words)), decoder
