"""The OCR chain on the GPU (marker gpu): crops cut from frames in device memory (NVDEC slots, or a batch's
staging copy), the recognizer's best class per step reduced on the device; the same text as the CPU
runtime reads, and no frame or crop uploaded for the secondary."""

import json
import shutil
import subprocess

import pytest

from jetpipe.cli import main
from jetpipe.tasks.detections import Detections

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


def test_det_then_rec_on_the_gpu_reads_what_the_cpu_runtime_reads(det_bundle_square, rec_bundle, h264_text, tmp_path,
                                                                   capsys):
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu (CUDA execution provider) is not installed")
    video, words = h264_text
    cpu, _ = _serve(det_bundle_square, rec_bundle, video, "onnxruntime-cpu", "ffmpeg", tmp_path / "cpu.jsonl", capsys)
    for decoder in ("ffmpeg", "nvdec"):
        gpu, summary = _serve(det_bundle_square, rec_bundle, video, "onnxruntime-cuda", decoder,
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


def test_long_lines_at_the_recognizers_widths_read_on_the_gpu_as_on_the_cpu(rec_bundle, long_lines):
    """Batches at 640 and 960 wide: the kernel writes each width's layout, the engine runs that shape and
    the best class per step comes back for that width's steps only."""
    import onnxruntime as ort

    from jetpipe.pipelines.core.secondary import SecondaryConfig, SecondaryStage

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu (CUDA execution provider) is not installed")
    images, frames, results = long_lines
    texts = {}
    for backend in ("onnxruntime-cpu", "onnxruntime-cuda"):
        stage = SecondaryStage(SecondaryConfig(rec_bundle), backend, "auto", (720, 1280), "auto")
        try:
            assert stage.runtime.widths == (320, 640, 960)
            said = []
            for frame, result in zip(frames, results):
                one = Detections.from_results(result)
                stage.run([one], [frame])
                said += [e["text"] if e else None for e in one.secondary[stage.name]]
            texts[backend] = said
            if backend == "onnxruntime-cuda":
                assert stage.summary()["postprocess"] == "gpu"
                assert stage.summary()["d2h_bytes_per_crop"] <= 120 * 24  # 960 / 8 steps at most
        finally:
            stage.close()
    pairs = list(zip(texts["onnxruntime-cpu"], texts["onnxruntime-cuda"]))
    assert sum(c == g for c, g in pairs) >= 0.9 * len(pairs), [p for p in pairs if p[0] != p[1]]


def test_upside_down_lines_are_turned_on_the_gpu_as_on_the_cpu(rec_bundle, detect, tmp_path):
    """The direction classifier on the GPU runtime (top-k on the device) turns the same crops, and the
    kernel cuts them turned: the same text as the CPU runtime reads."""
    import onnxruntime as ort

    from jetpipe.pipelines.core.secondary import SecondaryConfig, SecondaryStage
    from jetpipe.synth import render_tilted_words

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu (CUDA execution provider) is not installed")
    cls = tmp_path / "cls"
    assert main(["convert", "ppocr-cls", "-o", str(cls), "--max-batch", "8", "--quiet"]) == 0
    frames, results = detect([render_tilted_words(seed, (720, 1280), count=6, degrees=(180, 180))
                              for seed in range(3)])
    said = {}
    for backend in ("onnxruntime-cpu", "onnxruntime-cuda"):
        stage = SecondaryStage(SecondaryConfig(rec_bundle, direction=cls), backend, "auto", (720, 1280), "auto")
        try:
            copies = [Detections.from_results(r) for r in results]
            stage.run(copies, frames)
            said[backend] = [(e["text"], e.get("angle")) if e else None for r in copies
                             for e in r.secondary[stage.name]]
            turned = stage.summary()["crops_turned"]
        finally:
            stage.close()
        assert turned >= 0.7 * len(said[backend])
    pairs = list(zip(said["onnxruntime-cpu"], said["onnxruntime-cuda"]))
    assert sum(c == g for c, g in pairs) >= 0.9 * len(pairs), pairs


def test_a_stage_at_priority_high_runs_on_the_highest_priority_stream_and_reads_the_same(rec_bundle, long_lines):
    """priority = "high": the recognizer's graphs run on a stream of the GPU's highest priority, ordered with
    the crop kernel and the reduction by events; what it reads is what it reads at the default priority."""
    import onnxruntime as ort

    from jetpipe.pipelines.core.secondary import SecondaryConfig, SecondaryStage

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu (CUDA execution provider) is not installed")
    images, frames, results = long_lines
    texts = {}
    for priority in ("normal", "high"):
        stage = SecondaryStage(SecondaryConfig(rec_bundle, priority=priority), "onnxruntime-cuda", "auto",
                               (720, 1280), "auto")
        try:
            lane = stage.runtime.lane
            if priority == "normal":
                assert lane is None
            else:
                assert lane is not None and lane.stream_priority() == lane.priority < 0
            assert stage.summary()["priority"] == priority
            texts[priority] = []
            for _ in range(3):  # batches in flight on both buffer sets: each waits for its own crops
                for frame, result in zip(frames, results):
                    one = Detections.from_results(result)
                    stage.run([one], [frame])
                    texts[priority] += [e["text"] if e else None for e in one.secondary[stage.name]]
        finally:
            stage.close()
    assert texts["high"] == texts["normal"] and any(texts["high"])
