"""The CPU runtime: the fallback and the reference, run in CI."""

import numpy as np
import pytest

from jetpipe.cli import main
from jetpipe.errors import JetpipeError
from jetpipe.frames import FORMATS, ColourMatrix, from_bgr, to_rgb_float
from jetpipe.preprocess import preprocess_frame, preprocess_frame_fast
from jetpipe.runtime.api import Frame
from jetpipe.runtime.cpu_runtime import CpuRuntime
from jetpipe.runtime.open import open_runtime
from jetpipe.spec import PRESETS
from jetpipe.synth import render_text_image
from tests.helpers import residual_cnn, save


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rt")
    model = save(residual_cnn(batch=1), folder / "tiny.onnx")
    out = folder / "bundle"
    assert main(["convert", model, "-o", str(out), "--max-batch", "4", "--quiet"]) == 0
    return out


def test_infer_matches_direct_onnxruntime(tiny_bundle):
    from jetpipe.runtime.sessions import cpu_session

    images = [render_text_image(i, (48, 64)).bgr for i in range(3)]
    with open_runtime(tiny_bundle, backend="onnxruntime-cpu") as rt:
        assert rt.backend_name == "onnxruntime-cpu"
        result = rt.infer([Frame(img, "bgr") for img in images])
        got = result.outputs["y"].copy()
    inputs = np.stack([preprocess_frame_fast(img, "bgr", (16, 16), rt.spec)[0] for img in images])
    expected = cpu_session(str(tiny_bundle / "model.onnx")).run(None, {"x": inputs})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert result.frame_indices == [0, 1, 2] and len(result.letterboxes) == 3


def test_bad_frames_are_rejected_and_counted_not_fatal(tiny_bundle):
    good = Frame(render_text_image(0, (48, 64)).bgr, "bgr")
    odd = Frame(np.zeros((7, 10), np.uint8), "nv12")      # odd height: not NV12
    wrong_dtype = Frame(np.zeros((4, 4, 3), np.float32), "bgr")
    with CpuRuntime(tiny_bundle) as rt:
        result = rt.infer([good, odd, wrong_dtype, good])
        assert result.frame_indices == [0, 3] and result.outputs["y"].shape[0] == 2
        assert [i for i, _ in result.rejected] == [1, 2] and rt.rejected_frames == 2
        with pytest.raises(JetpipeError, match="exceeds the runtime's max batch 4"):
            rt.infer([good] * 5)


def test_every_format_decodes_close_to_the_source_image():
    bgr = render_text_image(4, (96, 128)).bgr
    spec = PRESETS["imagenet"]
    reference = preprocess_frame(bgr, "bgr", (64, 64), spec)[0]
    for fmt in FORMATS:
        for standard, value_range in (("bt601", "limited"), ("bt709", "full")):
            matrix = ColourMatrix.of(standard, value_range)
            x, _ = preprocess_frame(from_bgr(bgr, fmt, matrix), fmt, (64, 64), spec, matrix)
            # chroma subsampling loses detail: compare means, not pixels
            assert np.abs(x - reference).mean() < 0.1, (fmt, standard, value_range)


def test_bt601_limited_matches_opencv():
    import cv2

    bgr = render_text_image(2, (48, 64)).bgr
    nv12 = from_bgr(bgr, "nv12")
    ours = to_rgb_float(nv12, "nv12", 48, 64)
    opencv = cv2.cvtColor(nv12, cv2.COLOR_YUV2RGB_NV12).astype(np.float32)
    assert np.abs(ours - opencv).max() <= 1.0  # OpenCV rounds to uint8


def test_bundle_tampering_is_refused(tiny_bundle, tmp_path):
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(tiny_bundle, copy)
    with open(copy / "model.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(JetpipeError, match="fails verification"):
        CpuRuntime(copy)


def test_auto_falls_back_to_cpu_without_gpu(tiny_bundle, caplog):
    import importlib.util
    import logging

    caplog.set_level(logging.INFO, logger="jetpipe")
    with open_runtime(tiny_bundle) as rt:
        if importlib.util.find_spec("pycuda") is None:
            assert rt.backend_name == "onnxruntime-cpu"
            assert "PyCUDA is not installed: pip install 'jetpipe[gpu]'" in caplog.text
        elif rt.backend_name == "onnxruntime-cpu":  # PyCUDA, but no usable GPU: the reason is given
            assert "no GPU runtime" in caplog.text
        else:  # a GPU machine: auto took the GPU
            assert rt.backend_name in ("onnxruntime-cuda", "tensorrt") and rt.device is not None


def test_manifest_naming_other_tensors_is_refused(tiny_bundle, tmp_path):
    import json
    import shutil

    from jetpipe import bundle

    copy = tmp_path / "b"
    shutil.copytree(tiny_bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["io"]["outputs"][0]["name"] = "scores"
    bundle.finish_manifest(copy, manifest)  # a consistent digest: the tensors themselves are checked
    with pytest.raises(JetpipeError, match="the manifest names input 'x' and outputs \\['scores'\\]"):
        CpuRuntime(copy)


def test_missing_nvcc_names_the_fix(monkeypatch):
    from jetpipe.runtime import kernels

    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(kernels.KernelError, match="nvcc not found.*add it to PATH"):
        kernels.compile_module()


def test_kernel_params_layout_matches_the_cuda_struct():
    """FrameParams in preprocess.cu: 8-byte src, 20 four-byte fields, the warp's 9 floats and its flag = 128 bytes."""
    import re

    from jetpipe.runtime.kernels import PARAMS, SOURCE

    struct = re.search(r"struct FrameParams \{(.*?)\};", SOURCE.read_text(), re.S).group(1)
    fields = re.findall(r"(\w+)(?:\[(\d+)\])?(?:,|;)", re.sub(r"//.*", "", struct))
    assert [name for name, _ in fields] == list(PARAMS.names)
    assert [int(n) for name, n in fields if n] == [PARAMS.fields["hom"][0].shape[0]]
    assert PARAMS.itemsize == 128


def test_two_batches_in_flight_keep_their_own_outputs(tiny_bundle):
    a = [Frame(render_text_image(i, (48, 64)).bgr) for i in range(2)]
    b = [Frame(render_text_image(10 + i, (48, 64)).bgr) for i in range(3)]
    with CpuRuntime(tiny_bundle) as rt:
        expect_a, expect_b = rt.infer(a).outputs["y"].copy(), rt.infer(b).outputs["y"].copy()
        ta, tb = rt.submit(a), rt.submit(b)
        with pytest.raises(JetpipeError, match="all 2 buffer sets are busy"):
            rt.submit(a)
        np.testing.assert_array_equal(rt.collect(ta).outputs["y"], expect_a)
        np.testing.assert_array_equal(rt.collect(tb).outputs["y"], expect_b)


def test_held_batches_keep_their_buffers_until_released(tiny_bundle):
    frames = [Frame(render_text_image(i, (48, 64)).bgr) for i in range(2)]
    other = [Frame(render_text_image(20 + i, (48, 64)).bgr) for i in range(2)]
    with CpuRuntime(tiny_bundle, buffer_sets=2) as rt:
        expected = rt.infer(frames).outputs["y"].copy()
        held_ticket = rt.submit(frames)
        held = rt.collect(held_ticket, hold=True)
        rt.infer(other)        # runs in the other set
        rt.infer(other)        # and again: never in the held one
        np.testing.assert_array_equal(held.outputs["y"], expected)
        rt.collect(rt.submit(other), hold=True)
        with pytest.raises(JetpipeError, match="all 2 buffer sets are busy"):
            rt.submit(frames)
        rt.release(held_ticket)
        rt.infer(frames)       # a set is free again


def test_exact_preprocess_option_uses_the_float_reference(tiny_bundle):
    from jetpipe.runtime.sessions import cpu_session

    frames = [Frame(from_bgr(render_text_image(i, (48, 64)).bgr, "nv12"), "nv12") for i in range(2)]
    with CpuRuntime(tiny_bundle, exact_preprocess=True) as rt:
        got = rt.infer(frames).outputs["y"].copy()
        spec = rt.spec
    inputs = np.stack([preprocess_frame(f.data, "nv12", (16, 16), spec)[0] for f in frames])
    expected = cpu_session(str(tiny_bundle / "model.onnx")).run(None, {"x": inputs})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_the_cpu_runtimes_session_waits_asleep_not_spinning(tiny_bundle):
    """Its intra-op threads sleep between parallel sections: a pipeline's other threads (sources, postprocessing,
    a secondary model's session) share the cores (jetpipe demo on 2 cores: 3.9-4.0 -> 4.7-5.3 frames/s)."""
    with CpuRuntime(tiny_bundle) as rt:
        options = rt.backend.session.get_session_options()
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_the_models_rate_at_its_largest_batch_is_measured_once(tiny_bundle, monkeypatch):
    """A worker's hello and the decode-process choice both ask for it: one measurement serves both."""
    with open_runtime(tiny_bundle, backend="onnxruntime-cpu") as rt:
        calls = []
        measure = rt.engine_times
        monkeypatch.setattr(rt, "engine_times", lambda sizes: calls.append(sizes) or measure(sizes))
        first = rt.max_batch_fps()
        assert first > 0 and rt.max_batch_fps() == first and calls == [(rt.max_batch,)]


@pytest.mark.parametrize("instances", [0, 5, 1.5, True, "two"])
def test_gpu_options_hold_model_instances_to_auto_or_1_to_4(instances):
    """Checked before any CUDA call, so the bound is tested without a GPU."""
    from jetpipe.errors import JetpipeError
    from jetpipe.runtime.gpu_runtime import GpuOptions

    with pytest.raises(JetpipeError, match=r"model instances .*: auto or an integer 1\.\.4"):
        GpuOptions(instances=instances)
    assert GpuOptions(instances=4).instances == 4 and GpuOptions(instances="auto").instances == "auto"
    with pytest.raises(JetpipeError, match="offered_fps nan"):
        GpuOptions(offered_fps=float("nan"))


@pytest.mark.parametrize("running, last, chosen", [
    ([0, 0], 0, 1), ([0, 0], 1, 0),            # both idle: in turn
    ([1, 0], 1, 1), ([0, 1], 0, 0),            # the idle one, even where it took the batch before
    ([1, 1], 0, 1), ([2, 1], 1, 1),            # both busy: in turn among the fewest
    ([0, 0, 0, 0], 3, 0), ([1, 0, 1, 0], 1, 3),
])
def test_a_batch_goes_to_the_model_instance_with_the_fewest_running(running, last, chosen):
    from jetpipe.runtime.instances import least_busy

    assert least_busy(running, last) == chosen


GB = 2**30


@pytest.mark.parametrize("offered, model, free, chosen, said", [
    (960.0, 1037.0, 70 * GB, 2, "960 frames/s offered, near the model's 1,037"),   # 32 cameras, PP-OCRv4 det
    (480.0, 1037.0, 70 * GB, 1, "(46%), below 80%: one"),                          # 16 cameras
    (float("inf"), 1037.0, 70 * GB, 2, "files read as fast as they decode"),
    (0.0, 1037.0, 70 * GB, 1, "below 80%: one"),                                    # streams added later
    (960.0, 1037.0, 3 * GB, 1, "less than 2 x the 2,048 MB one instance took"),     # no room for the copy
    (960.0, None, 70 * GB, 1, "not measured"),
])
def test_auto_takes_a_second_model_instance_near_the_models_rate_where_the_gpu_has_room(offered, model, free,
                                                                                        chosen, said):
    from jetpipe.runtime.instances import auto_instances

    count, why = auto_instances(offered, model, free, 2 * GB)
    assert count == chosen and said in why, why


def test_one_model_instance_where_only_one_can_run_and_why():
    from jetpipe.runtime.instances import why_one

    assert why_one(False, "normal", "onnxruntime-cuda") is None
    assert "Triton server" in why_one(True, "normal", "triton://h:1/m")
    assert "priority high" in why_one(False, "high", "onnxruntime-cuda")
    assert why_one(False, "normal", "tensorrt").startswith("tensorrt (instances are built for ONNX Runtime")
