"""Real video on the GPU (marker gpu): NVDEC -> device ring -> kernel, against FFmpeg YUV -> kernel.

Needs PyCUDA, onnxruntime-gpu, PyNvVideoCodec and ffmpeg (to encode the clips at test time).
"""

import shutil

import numpy as np
import pytest

from jetpipe import uri as uris
from jetpipe.frames import frame_shape
from jetpipe.pipelines.config import SourceConfig
from jetpipe.pipelines.daemon import Pipeline
from jetpipe.pipelines.sources import EndOfStream, FFmpegSource
from jetpipe.runtime.api import Frame
from tests.pipelines.test_sources import _config, encode

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu (CUDA execution provider) is not installed")
    if shutil.which("ffmpeg") is None or shutil.which("ffprobe") is None:
        pytest.skip("ffmpeg/ffprobe not installed: the clips are encoded at test time")
    pytest.importorskip("PyNvVideoCodec", reason="PyNvVideoCodec (pip install pynvvideocodec) not installed")
    folder = tmp_path_factory.mktemp("gpuclips")
    return {"h264": encode(folder / "h264.mp4", "1920x1080", 24),
            "hevc": encode(folder / "hevc.mp4", "1280x720", 16, "libx265", extra=("-x265-params", "log-level=error")),
            "yuv444": encode(folder / "yuv444.mp4", "640x480", 8, pix_fmt="yuv444p")}


@pytest.fixture(scope="module")
def runtime(det_bundle):
    from jetpipe.runtime.gpu_runtime import GpuRuntime

    rt = GpuRuntime(det_bundle, max_batch=4, backend="onnxruntime-cuda")
    yield rt
    rt.close()


def _nvdec_frames(runtime, clip, count, loop=False):
    """NVDEC-decoded frames in device ring slots, as the daemon gets them."""
    source = runtime.hardware_decoder(uris.parse(str(clip)), loop=loop)
    assert source is not None and source.memory == "device"
    info = source.open()
    ring = runtime.frame_ring(count, (info.height, info.width), device=True)
    frames = []
    for slot in range(count):
        source.read_into(ring.view(slot, info.format, info.height, info.width))
        frames.append(ring.frame(slot, info.format, info.height, info.width, info.standard, info.range))
    source.close()
    return info, frames


def _ffmpeg_yuv(clip, count):
    source = FFmpegSource(uris.parse(str(clip)))
    info = source.open()
    frames = []
    try:
        while len(frames) < count:
            slot = np.empty(frame_shape(info.format, info.height, info.width), np.uint8)
            source.read_into(slot)
            frames.append(slot)
    except EndOfStream:
        pass
    source.close()
    return info, frames


@pytest.mark.parametrize("name", ["h264", "hevc"])
def test_nvdec_loops_without_losing_or_repeating_frames(runtime, clips, name):
    length = {"h264": 24, "hevc": 16}[name]
    _, frames = _nvdec_frames(runtime, clips[name], length + 3, loop=True)
    with runtime.device.active():
        pixels = [runtime.device.cuda.from_device(f.address, (f.nbytes,), np.uint8) for f in frames]
    for k in range(3):  # the second pass starts with the first pass's frames, in order
        np.testing.assert_array_equal(pixels[length + k], pixels[k])
    assert not np.array_equal(pixels[length - 1], pixels[0])


@pytest.mark.parametrize("name", ["h264", "hevc"])
def test_nvdec_kernel_output_equals_ffmpeg_yuv_kernel_output(runtime, clips, name):
    info, device_frames = _nvdec_frames(runtime, clips[name], 4)
    ff_info, host = _ffmpeg_yuv(clips[name], 4)  # I420, as the decoder gave it
    assert (info.height, info.width) == (ff_info.height, ff_info.width)
    # the same colour interpretation for both, so that only the decoders' pixels are compared
    ours = runtime.preprocess_only(device_frames)
    theirs = runtime.preprocess_only([Frame(f, ff_info.format, info.standard, info.range) for f in host])
    spec = runtime.spec
    scale = 255.0 * np.asarray(spec.std, np.float32).reshape(1, 3, 1, 1)  # back to 8-bit levels
    diff = np.abs(ours - theirs) * scale
    assert diff.max() <= 1.0 + 1e-3, diff.max()


def test_nvdec_pipeline_copies_no_pixels_on_the_host_and_processes_every_frame(det_bundle, clips, tmp_path):
    config = _config(det_bundle, [SourceConfig(str(clips["h264"])), SourceConfig(str(clips["hevc"]))],
                     backend="onnxruntime-cuda", max_batch=4, queue_depth=2)
    pipeline = Pipeline(config)
    assert [s.describe().endswith("(nvdec)") for s in pipeline.sources] == [True, True]
    summary = pipeline.run()
    assert summary["processed"] == [24, 16] and summary["dropped"] == [0, 0] and summary["failed"] == [0, 0]
    assert pipeline.runtime.frame_bytes_uploaded == 0 and pipeline.runtime.host_frame_copies == 0


def test_a_stream_nvdec_cannot_take_falls_back_to_ffmpeg_and_says_why(det_bundle, clips, caplog):
    config = _config(det_bundle, [SourceConfig(str(clips["yuv444"]))], backend="onnxruntime-cuda", max_batch=4)
    pipeline = Pipeline(config)
    assert pipeline.sources[0].describe().endswith("(ffmpeg)")
    assert "NVDEC cannot decode it" in caplog.text and "decoding with FFmpeg" in caplog.text
    summary = pipeline.run()
    assert summary["processed"] == [8]
    assert pipeline.runtime.frame_bytes_uploaded > 0  # the FFmpeg path uploads from pinned ring slots


def test_nvdec_frames_reach_a_drawing_sink_from_gpu_memory(det_bundle, clips, tmp_path):
    """Frames NVDEC decoded into device memory are copied to the host for a drawing sink (at its rate only):
    the JPEGs show the decoded picture, and inference still uploads no pixel."""
    import cv2

    folder = tmp_path / "jpegs"
    folder.mkdir()
    config = _config(det_bundle, [SourceConfig(str(clips["h264"]))], backend="onnxruntime-cuda", max_batch=4,
                     sinks=[f"jpeg:{folder}?every=8&width=960"])
    pipeline = Pipeline(config)
    assert pipeline.sources[0].describe().endswith("(nvdec)")
    summary = pipeline.run()
    assert summary["processed"] == [24] and pipeline.runtime.frame_bytes_uploaded == 0
    assert sorted(p.name for p in folder.iterdir()) == [f"s0_{i:06d}.jpg" for i in (0, 8, 16)]
    capture = cv2.VideoCapture(str(clips["h264"]))
    for index in range(17):
        ok, reference = capture.read()
        if index in (0, 8, 16):
            drawn = cv2.imread(str(folder / f"s0_{index:06d}.jpg"))
            expected = cv2.resize(reference, (960, 540), interpolation=cv2.INTER_AREA)
            assert ok and drawn.shape == expected.shape
            assert np.median(np.abs(drawn.astype(int) - expected)) < 6  # the same picture, boxes aside
    capture.release()
