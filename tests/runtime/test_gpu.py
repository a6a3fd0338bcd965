"""GPU runtime tests (marker gpu): run on an H100/H200 with PyCUDA and onnxruntime-gpu.

Skipped with the reason where no GPU (or PyCUDA) exists; the CPU reference they
compare against is tested in test_cpu_runtime.py everywhere.
"""

import os
import resource
import time
from pathlib import Path

import numpy as np
import pytest

from jetpipe.frames import FORMATS, ColourMatrix, frame_size, from_bgr
from jetpipe.geometry import affine
from jetpipe.preprocess import preprocess_frame
from jetpipe.runtime.api import Frame
from jetpipe.spec import PRESETS, PreprocessSpec
from jetpipe.synth import render_text_image

pytestmark = pytest.mark.gpu

SIZES = [(1080, 1920), (480, 640), (720, 1280), (240, 320)]  # mixed sizes in one batch


def _needs_cuda_ep():
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu (CUDA execution provider) is not installed")


@pytest.fixture(scope="module")
def module(device):
    from jetpipe.runtime.kernels import compile_module

    with device.active():
        return compile_module()


def _images():
    return [render_text_image(10 + i, hw).bgr for i, hw in enumerate(SIZES)]


def _preprocessor_with_frames(device, module, frames, fmt, matrix, spec, size_hw, out_dtype, crops, quads):
    """A GpuPreprocessor with `frames` uploaded and set (in an active context), and the frames' device buffers
    (keep them while the kernel may read them)."""
    from jetpipe.runtime.kernels import GpuPreprocessor

    pre = GpuPreprocessor(device, module, len(frames), size_hw, spec, out_dtype)
    buffers = [device.alloc(f.nbytes) for f in frames]
    for i, (frame, buf) in enumerate(zip(frames, buffers)):
        device.cuda.memcpy_htod(buf, frame)
        h, w = frame_size(frame, fmt)
        pre.set_frame(i, fmt, h, w, int(buf), matrix, crop=crops[i] if crops else None,
                      quad=quads[i] if quads else None)
    return pre, buffers


def _run_kernel(device, module, frames, fmt, matrix, spec, size_hw, out_dtype, crops=None, quads=None):
    """Frames -> device memory -> one kernel launch -> host array (crops: one rectangle per frame; quads:
    one quadrilateral per frame inside its crop)."""
    with device.active():
        pre, _frames_held = _preprocessor_with_frames(device, module, frames, fmt, matrix, spec, size_hw, out_dtype,
                                                      crops, quads)
        stream = device.stream()
        out = device.alloc(len(frames) * spec.channels * size_hw[0] * size_hw[1] * np.dtype(out_dtype).itemsize)
        pre.launch(len(frames), int(out), stream)
        stream.synchronize()
        host = np.empty((len(frames), spec.channels, *size_hw), out_dtype)
        device.cuda.memcpy_dtoh(host, out)
    return host


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("standard", ["bt601", "bt709"])
@pytest.mark.parametrize("value_range", ["limited", "full"])
@pytest.mark.parametrize("out_dtype", [np.float32, np.float16])
def test_kernel_matches_cpu_reference(device, module, fmt, standard, value_range, out_dtype):
    matrix = ColourMatrix.of(standard, value_range)
    spec = PRESETS["ppocr-det"] if fmt in ("nv12", "yuyv") else PreprocessSpec(
        mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3), resize="letterbox", pad_value=114)
    frames = [from_bgr(img, fmt, matrix) for img in _images()]
    size_hw = (640, 640)
    gpu = _run_kernel(device, module, frames, fmt, matrix, spec, size_hw, out_dtype).astype(np.float32)
    cpu = np.stack([preprocess_frame(f, fmt, size_hw, spec, matrix)[0] for f in frames])
    one_step = float(np.max(affine(spec)[0]))  # one 8-bit level after normalization
    diff = np.abs(gpu - cpu)
    assert np.isfinite(gpu).all()
    assert diff.max() <= one_step, (fmt, standard, value_range, diff.max(), one_step)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("standard, value_range", [("bt601", "limited"), ("bt709", "full")])
def test_gray_kernel_matches_the_luma_reference(device, module, fmt, standard, value_range):
    """1-channel networks: the kernel writes one plane, the frame's luma (Y plane of YUV frames)."""
    matrix = ColourMatrix.of(standard, value_range)
    spec = PreprocessSpec(channel_order="gray", mean=(0.5,), std=(0.25,), pad_value=0)
    frames = [from_bgr(img, fmt, matrix) for img in _images()]
    gpu = _run_kernel(device, module, frames, fmt, matrix, spec, (48, 320), np.float32)
    cpu = np.stack([preprocess_frame(f, fmt, (48, 320), spec, matrix)[0] for f in frames])
    assert gpu.shape == cpu.shape == (len(frames), 1, 48, 320)
    assert np.abs(gpu - cpu).max() <= float(affine(spec)[0][0])  # one 8-bit level


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channel_order", ["bgr", "gray"])
def test_crops_match_the_cpu_reference(device, module, fmt, channel_order):
    """A secondary's crops, cut by the kernel from the frame where it is: odd corners, one pixel, the whole
    frame, a crop at the bottom right (chroma planes located by the frame's height, not the crop's)."""
    matrix = ColourMatrix.of("bt709", "limited")
    spec = PRESETS["ppocr-rec"] if channel_order == "bgr" else PreprocessSpec(
        channel_order="gray", mean=(0.5,), std=(0.5,), resize="topleft", pad_value=127.5)
    image = render_text_image(3, (720, 1280)).bgr
    crops = [(101, 37, 331, 85), (0, 0, 1280, 720), (1201, 641, 1280, 720), (7, 9, 8, 10), (640, 11, 1279, 59)]
    frames = [from_bgr(image, fmt, matrix)] * len(crops)
    gpu = _run_kernel(device, module, frames, fmt, matrix, spec, (48, 320), np.float32, crops)
    cpu = np.stack([preprocess_frame(f, fmt, (48, 320), spec, matrix, crop=c)[0] for f, c in zip(frames, crops)])
    assert np.abs(gpu - cpu).max() <= float(np.max(affine(spec)[0])), fmt


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channel_order", ["bgr", "gray"])
def test_quadrilateral_crops_match_the_cpu_reference(device, module, fmt, channel_order):
    """Tilted and perspective text lines warped upright by the kernel, one reaching out of the frame."""
    from jetpipe.geometry import quad_region

    matrix = ColourMatrix.of("bt709", "limited")
    spec = PRESETS["ppocr-rec"] if channel_order == "bgr" else PreprocessSpec(
        channel_order="gray", mean=(0.5,), std=(0.5,), resize="topleft", pad_value=127.5)
    image = render_text_image(3, (720, 1280)).bgr
    quads = [((120.0, 60.5), (330.2, 98.9), (322.4, 141.6), (112.3, 103.3)),
             ((400.0, 300.0), (900.0, 280.0), (910.0, 330.0), (395.0, 345.0)),
             ((1200.0, 650.0), (1300.0, 660.0), (1290.0, 730.0), (1190.0, 725.0)),
             ((7.2, 9.1), (8.0, 9.3), (8.1, 10.0), (7.1, 10.2))]
    crops = [quad_region(q, 720, 1280) for q in quads]
    frames = [from_bgr(image, fmt, matrix)] * len(quads)
    gpu = _run_kernel(device, module, frames, fmt, matrix, spec, (48, 320), np.float32, crops, quads)
    cpu = np.stack([preprocess_frame(f, fmt, (48, 320), spec, matrix, crop=c, quad=q)[0]
                    for f, c, q in zip(frames, crops, quads)])
    assert np.abs(gpu - cpu).max() <= float(np.max(affine(spec)[0])), fmt


def test_stretch_resize_and_rgb_order(device, module):
    spec = PreprocessSpec(resize="stretch", channel_order="rgb")
    frames = [from_bgr(img, "nv12") for img in _images()]
    gpu = _run_kernel(device, module, frames, "nv12", ColourMatrix.of(), spec, (320, 480), np.float32)
    cpu = np.stack([preprocess_frame(f, "nv12", (320, 480), spec)[0] for f in frames])
    assert np.abs(gpu - cpu).max() <= 1 / 255


REFERENCE_KERNEL = Path(__file__).with_name("preprocess_reference.cu")


def _kernel_and_reference(device, module, frames, fmt, spec, size_hw, out_dtype, crops=None, quads=None,
                          out_offset=0):
    """The kernel's output and the one-pixel-a-thread reference kernel's, both from the same uploaded
    parameters, each into a buffer `out_offset` bytes past an allocation's start (not 16-byte aligned: the
    kernel's scalar stores)."""
    from jetpipe.runtime.kernels import BLOCK, compile_module

    matrix = ColourMatrix.of("bt709", "limited")
    with device.active():
        reference = compile_module(REFERENCE_KERNEL).get_function(
            "preprocess_f16" if out_dtype == np.float16 else "preprocess_f32")
        reference.prepare("PPiiifffffffi")
        pre, _frames_held = _preprocessor_with_frames(device, module, frames, fmt, matrix, spec, size_hw, out_dtype,
                                                      crops, quads)
        stream = device.stream()
        shape = (len(frames), spec.channels, *size_hw)
        nbytes = int(np.prod(shape)) * np.dtype(out_dtype).itemsize
        outs = [device.alloc(nbytes + out_offset) for _ in range(2)]
        pre.launch(len(frames), int(outs[0]) + out_offset, stream)
        h, w = size_hw
        grid = ((w + BLOCK[0] - 1) // BLOCK[0], (h + BLOCK[1] - 1) // BLOCK[1], len(frames))
        reference.prepared_async_call(grid, BLOCK, stream, pre.device_params, int(outs[1]) + out_offset,
                                      np.int32(w), np.int32(h), np.int32(len(frames)), *pre.constants)
        stream.synchronize()
        hosts = [np.empty(shape, out_dtype) for _ in range(2)]
        for host, out in zip(hosts, outs):
            device.cuda.memcpy_dtoh(host, int(out) + out_offset)
    return hosts


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out_dtype", [np.float32, np.float16])
def test_the_kernel_equals_the_one_pixel_a_thread_reference_bit_for_bit(device, module, fmt, out_dtype):
    """Issue 27's faster kernel (four pixels a thread, vector stores, zero-weight taps skipped) writes exactly
    what the kernel before it wrote: letterbox at an integer ratio (1080p -> 640) and at others, mixed sizes,
    stretch, gray, crops, quadrilaterals, output widths that are no multiple of 4, misaligned output."""
    from jetpipe.geometry import quad_region

    matrix = ColourMatrix.of("bt709", "limited")
    frames = [from_bgr(img, fmt, matrix) for img in _images()]
    image = render_text_image(3, (720, 1280)).bgr
    quads = [((120.0, 60.5), (330.2, 98.9), (322.4, 141.6), (112.3, 103.3)),
             ((1200.0, 650.0), (1300.0, 660.0), (1290.0, 730.0), (1190.0, 725.0))]
    gray = PreprocessSpec(channel_order="gray", mean=(0.5,), std=(0.5,), resize="topleft", pad_value=127.5)
    cases = [
        (frames, PRESETS["ppocr-det"], (640, 640), {}),
        (frames, PreprocessSpec(resize="stretch", channel_order="rgb"), (317, 483), {}),
        (frames, gray, (48, 322), {"out_offset": 4}),
        ([from_bgr(image, fmt, matrix)] * 3, PRESETS["ppocr-rec"], (48, 320),
         {"crops": [(101, 37, 331, 85), (1201, 641, 1280, 720), (7, 9, 8, 10)]}),
        ([from_bgr(image, fmt, matrix)] * 2, PRESETS["ppocr-rec"], (48, 321),
         {"crops": [quad_region(q, 720, 1280) for q in quads], "quads": quads, "out_offset": 8}),
    ]
    for case_frames, spec, size_hw, extra in cases:
        new, before = _kernel_and_reference(device, module, case_frames, fmt, spec, size_hw, out_dtype, **extra)
        bits = np.uint16 if out_dtype == np.float16 else np.uint32
        mismatched = int(np.count_nonzero(new.view(bits) != before.view(bits)))
        assert mismatched == 0, (fmt, spec.resize, size_hw, extra.keys(), mismatched)


def test_cuda_graph_replays_the_kernel(device, module):
    from jetpipe.runtime.cuda_graph import CudaGraph
    from jetpipe.runtime.kernels import GpuPreprocessor

    spec = PRESETS["imagenet"]
    img = from_bgr(_images()[1], "nv12")
    with device.active():
        pre = GpuPreprocessor(device, module, 1, (224, 224), spec)
        stream = device.stream()
        src = device.alloc(img.nbytes)
        device.cuda.memcpy_htod(src, img)
        pre.set_frame(0, "nv12", 480, 640, int(src), ColourMatrix.of())
        out = device.alloc(3 * 224 * 224 * 4)
        with CudaGraph.capture(stream) as graph:
            pre.launch(1, int(out), stream)
        device.cuda.memset_d8(out, 0, 3 * 224 * 224 * 4)
        graph.launch(stream)
        stream.synchronize()
        host = np.empty((1, 3, 224, 224), np.float32)
        device.cuda.memcpy_dtoh(host, out)
        graph.close()
    expected = preprocess_frame(img, "nv12", (224, 224), spec)[0]
    assert np.abs(host[0] - expected).max() <= float(np.max(affine(spec)[0]))


@pytest.fixture(scope="module")
def det_bundle(tmp_path_factory, det_model_path):
    from jetpipe.convert import ConvertOptions, convert
    from jetpipe.spec import preset

    out = tmp_path_factory.mktemp("gpu") / "det"
    convert(ConvertOptions(model=det_model_path, output=out, input_size=(640, 640), max_batch=8,
                           spec=preset("ppocr-det"), engine="never", progress=False))
    return out


def test_a_gray_bundle_on_the_gpu_matches_the_cpu_runtime(tmp_path):
    """A 1-channel network: the kernel's luma plane -> ONNX Runtime CUDA, against the CPU reference path."""
    _needs_cuda_ep()
    from jetpipe.convert import ConvertOptions, convert
    from jetpipe.runtime.cpu_runtime import CpuRuntime
    from jetpipe.runtime.gpu_runtime import GpuRuntime
    from tests.helpers import gray_recognizer, save

    model = save(gray_recognizer(), tmp_path / "rec.onnx")
    convert(ConvertOptions(model=model, output=tmp_path / "b", max_batch=4, engine="never", progress=False,
                           spec=PreprocessSpec(channel_order="gray", mean=(0.5,), std=(0.5,))))
    frames = [Frame(from_bgr(render_text_image(i, (64 + 16 * i, 320)).bgr, "nv12"), "nv12") for i in range(4)]
    with GpuRuntime(tmp_path / "b", max_batch=4) as gpu, CpuRuntime(tmp_path / "b", exact_preprocess=True) as cpu:
        assert gpu.preprocess_only(frames).shape == (4, 1, 32, 128)
        np.testing.assert_allclose(gpu.infer(frames).outputs["y"], cpu.infer(frames).outputs["y"],
                                   rtol=1e-3, atol=1e-3)


def _frames(count=4, fmt="nv12"):
    return [Frame(from_bgr(render_text_image(i, SIZES[i % len(SIZES)]).bgr, fmt), fmt) for i in range(count)]


@pytest.mark.parametrize("memory", ["mapped", "staged", "device"])
def test_memory_modes_give_identical_results(det_bundle, memory):
    _needs_cuda_ep()
    from jetpipe.runtime.gpu_runtime import GpuRuntime

    frames = _frames()
    with GpuRuntime(det_bundle, max_batch=4, memory="staged") as ref_rt:
        reference = ref_rt.preprocess_only(frames)
        ref_out = ref_rt.infer(frames).outputs["sigmoid_0.tmp_0"].copy()
    with GpuRuntime(det_bundle, max_batch=4, memory=memory) as rt:
        assert rt.memory == memory
        np.testing.assert_array_equal(rt.preprocess_only(frames), reference)
        np.testing.assert_array_equal(rt.infer(frames).outputs["sigmoid_0.tmp_0"], ref_out)


def test_det_cuda_ep_matches_cpu_path(det_bundle):
    _needs_cuda_ep()
    from jetpipe.runtime.cpu_runtime import CpuRuntime
    from jetpipe.runtime.gpu_runtime import GpuRuntime
    from jetpipe.tasks.agreement_metrics import per_sample_f1

    frames = _frames(8)
    with GpuRuntime(det_bundle, max_batch=8) as gpu_rt, \
            CpuRuntime(det_bundle, max_batch=8, exact_preprocess=True) as cpu_rt:
        assert gpu_rt.backend_name == "onnxruntime-cuda"
        gpu = gpu_rt.infer(frames).outputs["sigmoid_0.tmp_0"].copy()
        cpu = cpu_rt.infer(frames).outputs["sigmoid_0.tmp_0"].copy()
    assert np.abs(gpu - cpu).max() < 2e-3
    assert per_sample_f1(cpu, gpu).min() > 0.999


def test_async_submit_collect_matches_infer(det_bundle):
    _needs_cuda_ep()
    from jetpipe.errors import JetpipeError
    from jetpipe.runtime.gpu_runtime import GpuRuntime

    a, b = _frames(4), _frames(4, "yuyv")
    with GpuRuntime(det_bundle, max_batch=4) as rt:
        expect_a = rt.infer(a).outputs["sigmoid_0.tmp_0"].copy()
        expect_b = rt.infer(b).outputs["sigmoid_0.tmp_0"].copy()
        ta, tb = rt.submit(a), rt.submit(b)
        with pytest.raises(JetpipeError, match="all 2 buffer sets are busy"):
            rt.submit(a)
        np.testing.assert_array_equal(rt.collect(ta).outputs["sigmoid_0.tmp_0"], expect_a)
        # ready(): the post stage groups only batches whose GPU work is done (issue 66); it turns True by itself
        deadline = time.monotonic() + 30
        while not rt.ready(tb) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert rt.ready(tb)
        np.testing.assert_array_equal(rt.collect(tb).outputs["sigmoid_0.tmp_0"], expect_b)


def test_the_batches_the_gpu_has_not_finished_are_counted_as_its_events_say(det_bundle):
    """batches_running(): the batcher holds a partial batch while two are unfinished (issue 66). Two batches
    submitted together count 2 until the first is done; a collected batch is not counted, held or not."""
    _needs_cuda_ep()
    from jetpipe.runtime.gpu_runtime import GpuRuntime

    with GpuRuntime(det_bundle, max_batch=4, buffer_sets=3) as rt:
        rt.infer(_frames(4))
        assert rt.batches_running() == 0
        first, second = rt.submit(_frames(4)), rt.submit(_frames(4, "yuyv"))
        assert 1 <= rt.batches_running() <= 2  # the second queued behind the first: milliseconds of work
        rt.collect(first, hold=True)
        assert rt.batches_running() <= 1  # the first, done and held, is not counted
        rt.collect(second)
        assert rt.batches_running() == 0
        rt.release(first)


def test_a_batch_reports_the_gpu_time_it_took_without_the_wait_behind_the_batch_before(det_bundle):
    """The latency budget's engine time (issue 27): the second of two batches submitted together queued behind
    the first, and its engine_ms leaves that wait out (a sub-interval of the first's end to its own end)."""
    _needs_cuda_ep()
    from jetpipe.runtime.gpu_runtime import GpuRuntime

    with GpuRuntime(det_bundle, max_batch=4) as rt:
        rt.infer(_frames(4))
        start = time.perf_counter()
        first, second = rt.submit(_frames(4)), rt.submit(_frames(4, "yuyv"))
        first_ms = rt.collect(first).engine_ms
        second_ms = rt.collect(second).engine_ms
        both_ms = (time.perf_counter() - start) * 1e3
        assert 0 < first_ms and 0 < second_ms
        assert first_ms + second_ms <= both_ms  # each counts its own work only, not the other's


@pytest.mark.parametrize("memory,cuda_graph", [("staged", True), ("device", True), ("staged", False)])
def test_two_model_instances_run_batches_at_once_and_match_one(det_bundle, memory, cuda_graph):
    """instances=2 (issue 66): batches submitted together go to the idle instance first, each instance on a
    stream and sessions of its own, and give one instance's outputs; an instance with a batch running takes
    the next only when both have one."""
    _needs_cuda_ep()
    from jetpipe.runtime.gpu_runtime import GpuRuntime

    batches = [_frames(4), _frames(3, "yuyv"), _frames(4, "yuyv"), _frames(2)]
    with GpuRuntime(det_bundle, max_batch=4, buffer_sets=4, memory=memory, cuda_graph=cuda_graph) as rt:
        assert len(rt.instances) == 1
        expected = [rt.infer(f).outputs["sigmoid_0.tmp_0"].copy() for f in batches]
    with GpuRuntime(det_bundle, max_batch=4, buffer_sets=4, memory=memory, cuda_graph=cuda_graph,
                    instances=2) as rt:
        first, second = rt.instances
        assert first.streams.compute is not second.streams.compute and first.backend is not second.backend
        assert first.streams.copy is second.streams.copy
        if cuda_graph:
            assert len(second.backend.graphs) == rt.buffer_sets * len(second.backend.buckets)
        for _ in range(2):
            tickets = [rt.submit(f) for f in batches]
            assert [t.instance for t in tickets[:2]] == [1, 0] or [t.instance for t in tickets[:2]] == [0, 1]
            assert {t.instance for t in tickets} == {0, 1}
            for ticket, want in zip(tickets, expected):
                np.testing.assert_allclose(rt.collect(ticket).outputs["sigmoid_0.tmp_0"], want, atol=1e-5)
        rt.infer(batches[0])
        idle = rt.submit(batches[1]).instance  # nothing running: the next in turn
        assert rt.submit(batches[2]).instance != idle  # the other is idle while the first runs


def test_auto_takes_two_model_instances_where_the_streams_come_near_the_models_rate(det_bundle, caplog):
    """instances="auto": the model's rate measured after the first instance's warm-up, against offered_fps."""
    _needs_cuda_ep()
    import logging

    from jetpipe.runtime.gpu_runtime import GpuRuntime

    caplog.set_level(logging.INFO, logger="jetpipe")
    with GpuRuntime(det_bundle, max_batch=4, instances="auto", offered_fps=float("inf")) as rt:
        assert len(rt.instances) == 2 and rt.max_batch_fps() > 0
        frames = _frames(4)
        expected = rt.infer(frames).outputs["sigmoid_0.tmp_0"].copy()
        np.testing.assert_allclose(rt.infer(frames).outputs["sigmoid_0.tmp_0"], expected, atol=1e-5)
    assert "model_instances auto: files read as fast as they decode, near the model's" in caplog.text
    with GpuRuntime(det_bundle, max_batch=4, instances="auto", offered_fps=30.0) as rt:
        assert len(rt.instances) == 1
    assert "30 frames/s offered against the model's" in caplog.text


def test_model_instances_are_one_at_priority_high_and_say_why(det_bundle, caplog):
    _needs_cuda_ep()
    import logging

    caplog.set_level(logging.INFO, logger="jetpipe")
    from jetpipe.runtime.gpu_runtime import GpuRuntime

    with GpuRuntime(det_bundle, max_batch=4, instances=2, priority="high") as rt:
        assert len(rt.instances) == 1
    assert "one model instance, not 2: priority high" in caplog.text


def test_ort_runs_replayed_from_cuda_graphs_match(det_bundle):
    _needs_cuda_ep()
    from jetpipe.runtime.gpu_runtime import GpuRuntime

    frames = [_frames(4), _frames(3, "yuyv")]
    with GpuRuntime(det_bundle, max_batch=4, cuda_graph=False) as rt:
        assert rt.backend.graphs == {}
        expected = [rt.infer(f).outputs["sigmoid_0.tmp_0"].copy() for f in frames]
    with GpuRuntime(det_bundle, max_batch=4) as rt:  # graphs by default
        assert len(rt.backend.graphs) == rt.buffer_sets * len(rt.backend.buckets)
        for _ in range(3):  # replays, alternating batch sizes and buffer sets
            got = [rt.infer(f).outputs["sigmoid_0.tmp_0"].copy() for f in frames]
            for g, e in zip(got, expected):
                np.testing.assert_allclose(g, e, atol=1e-5)


def test_every_batch_size_runs_in_a_session_of_its_own(det_bundle):
    """A batch of 3 runs at 3 (before session 64 it ran in the bucket of 4, its last row's work wasted), and gives
    what the same frames give in a full batch."""
    _needs_cuda_ep()
    from jetpipe.runtime.gpu_runtime import GpuRuntime

    frames = _frames(4)
    with GpuRuntime(det_bundle, max_batch=4) as rt:
        assert rt.backend.buckets == [1, 2, 3, 4]
        assert len(rt.backend.graphs) == rt.buffer_sets * 4
        whole = rt.infer(frames).outputs["sigmoid_0.tmp_0"].copy()
        three = rt.infer(frames[:3]).outputs["sigmoid_0.tmp_0"]
        assert three.shape[0] == 3
        np.testing.assert_allclose(three, whole[:3], atol=1e-4)


def _rss_bytes():
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


@pytest.mark.parametrize("memory", ["staged", "mapped"])
def test_steady_state_allocates_nothing(det_bundle, memory):
    """P4: 1,000 batches after warm-up: no new allocation, same free GPU memory, RSS drift < 1 %."""
    _needs_cuda_ep()
    from jetpipe.runtime.gpu_runtime import GpuRuntime

    frames = _frames(4)
    with GpuRuntime(det_bundle, max_batch=4, memory=memory) as rt:
        for _ in range(50):
            rt.collect(rt.submit(frames))
        allocations, rss = rt.device.allocations, _rss_bytes()
        with rt.device.active():
            free = rt.device.free_memory()
        pending = []
        for _ in range(1000):
            pending.append(rt.submit(frames))
            if len(pending) == 2:
                rt.collect(pending.pop(0))
        rt.collect(pending.pop(0))
        with rt.device.active():
            free_after = rt.device.free_memory()
        drift = (_rss_bytes() - rss) / rss
        print(f"P4 {memory}: allocations {allocations} -> {rt.device.allocations}, free GPU memory "
              f"{free} -> {free_after}, RSS {rss / 1e6:.1f} MB drift {drift * 100:.3f} %")
        assert rt.device.allocations == allocations
        assert free_after == free
        assert abs(drift) < 0.01


def test_stage_times_with_profiling(det_bundle):
    _needs_cuda_ep()
    from jetpipe.runtime.gpu_runtime import GpuRuntime
    from jetpipe.tasks.text_detection import TextDetection

    reduction = TextDetection().reduction(required=True)
    with GpuRuntime(det_bundle, max_batch=4, profile=True, reduction=reduction) as rt:
        ticket = rt.submit(_frames(4))
        rt.collect(ticket)
        times = rt.stage_times(ticket)
    assert set(times) == {"h2d", "preprocess", "infer", "postprocess", "d2h"}
    assert all(t > 0 for t in times.values()), times


HUNG_SERVE = """
import sys
from pycuda.compiler import SourceModule
from jetpipe.cli import main
from jetpipe.pipelines.core import drain
from jetpipe.runtime.gpu_runtime import GpuRuntime

drain.STAGE_STUCK_S = 3.0
collect, calls = GpuRuntime.collect, []

def collect_or_hang(self, ticket, hold=False):
    calls.append(ticket)
    if len(calls) < 3:
        return collect(self, ticket, hold=hold)
    with self.device.active():  # a kernel that never ends, and a real wait for it
        spin = SourceModule("__global__ void spin(volatile int *flag) { while (flag[0] == 0) { } }")
        import pycuda.driver as cuda
        flag = cuda.mem_alloc(4)
        cuda.memset_d32(flag, 0, 1)
        stream, done = cuda.Stream(), cuda.Event()
        spin.get_function("spin")(flag, block=(1, 1, 1), grid=(1, 1), stream=stream)
        done.record(stream)
        print("hung", flush=True)
        done.synchronize()

GpuRuntime.collect = collect_or_hang
sys.exit(main(["serve", "--bundle", sys.argv[1], "--source", "synthetic:640x480@30:nv12", "--max-batch", "1",
               "--metrics", "", "--duration", "600"]))
"""


def test_a_serve_whose_batch_the_gpu_never_finishes_still_stops(det_bundle, tmp_path):
    """Session 60's hang: a kernel that never ended held the post thread in its wait on the batch, and the GPU
    thread on a free buffer set; the run's end joined them without a bound, so SIGTERM (and a second one) never
    ended `serve`. Here a real kernel spins forever on the third batch's wait: a SIGTERM ends the process (the
    stages left behind after drain.STAGE_STUCK_S, nothing freed that the kernel may use) with exit 1 and the
    reason in the summary."""
    import signal
    import subprocess
    import sys

    from tests.support import ROOT

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen([sys.executable, "-c", HUNG_SERVE, str(det_bundle)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "hung", proc.stderr.read()[-3000:]
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)  # 3 s without a batch, then the process's own end
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err[-3000:]
    assert "left behind" in err and '"failure"' in err
