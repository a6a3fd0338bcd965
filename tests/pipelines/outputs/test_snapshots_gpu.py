"""Snapshots on the GPU (marker gpu): frames in device memory and on the host turned into RGB by the kernel and
encoded by nvJPEG (nvImageCodec), checked by decoding the JPEGs against the frames; through the daemon with NVDEC.

Needs PyCUDA, nvImageCodec with nvJPEG (pip install 'nvidia-nvimgcodec-cu13[nvjpeg]'); the daemon's test also
onnxruntime-gpu, PyNvVideoCodec and ffmpeg.
"""

from pathlib import Path

import cv2
import numpy as np
import pytest

from jetpipe.frames import from_bgr
from jetpipe.runtime.api import Frame
from tests.pipelines.outputs.test_clips_gpu import serve_nvdec_door
from tests.pipelines.outputs.test_snapshots import _frame, _green_outline

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_jpeg():
    pytest.importorskip("nvidia.nvimgcodec", reason="nvImageCodec is not installed: pip install "
                                                    "'nvidia-nvimgcodec-cu13[nvjpeg]'")
    from jetpipe.runtime.cuda import CudaDevice
    from jetpipe.runtime.jpeg import GpuJpeg
    from jetpipe.runtime.kernels import compile_module

    device = CudaDevice(0)
    with device.active():
        module = compile_module()
    encoder = GpuJpeg(device, module, 95, 2, (240, 320))
    yield encoder, device
    encoder.close()
    device.close()


def _on_device(device, frame: Frame) -> Frame:
    """The frame copied into device memory, as NVDEC's ring slots hold theirs."""
    with device.active():
        address = device.alloc(frame.data.nbytes)
        device.cuda.memcpy_htod(address, frame.data)
    height, width = frame.size()
    return Frame(None, frame.format, address=int(address), device=True, hw=(height, width))


def _decode(data: bytes) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)


@pytest.mark.parametrize("fmt,where", [("nv12", "device"), ("nv12", "host"), ("i420", "host"), ("bgr", "host")])
def test_the_gpu_encoder_pictures_the_frame_a_box_and_a_crop(gpu_jpeg, fmt, where):
    encoder, device = gpu_jpeg
    bgr, frame = _frame(fmt=fmt)
    if where == "device":
        frame = _on_device(device, frame)
    held, other = encoder.hold(frame), encoder.hold(frame)
    assert other is not None and encoder.hold(frame) is None  # two buffers: the third is a drop
    encoder.release(other)
    whole = _decode(encoder.picture(held, [(20, 30, 80, 90)]))
    assert whole.shape == bgr.shape
    assert _green_outline(whole, (20, 30, 80, 90)) > 0.9
    assert np.abs(whole[:20].astype(int) - bgr[:20]).mean() < 6
    crop = _decode(encoder.picture(held, crop=(20, 30, 80, 90)))
    assert crop.shape == (60, 60, 3) and np.abs(crop.astype(int) - bgr[30:90, 20:80]).mean() < 6
    encoder.release(held)


def test_a_host_picture_is_encoded_on_the_gpu_at_its_quality(gpu_jpeg):
    encoder, _ = gpu_jpeg
    bgr, _ = _frame()
    fine, coarse = encoder.encode_image(bgr, 95), encoder.encode_image(bgr, 30)
    assert np.abs(_decode(fine).astype(int) - bgr).mean() < 4
    assert len(coarse) < len(fine)


def test_full_range_bt709_frames_keep_their_colours(gpu_jpeg):
    """The kernel reads the frame's own colour matrix: a full-range BT.709 frame's picture is its colours."""
    from jetpipe.frames import ColourMatrix

    encoder, _ = gpu_jpeg
    bgr, _ = _frame()
    frame = Frame(from_bgr(bgr, "nv12", ColourMatrix.of("bt709", "full")), "nv12", standard="bt709", range="full")
    held = encoder.hold(frame)
    assert np.abs(_decode(encoder.picture(held)).astype(int) - bgr).mean() < 6
    encoder.release(held)


def test_serve_with_nvdec_takes_snapshots_on_the_gpu(det_bundle_square, tmp_path, panning_video, panning_h264):
    pytest.importorskip("nvidia.nvimgcodec", reason="nvImageCodec is not installed")
    folder = tmp_path / "snaps"
    records, summary = serve_nvdec_door(det_bundle_square, tmp_path, panning_video, panning_h264,
                                        ["--snapshots", str(folder)])
    events = {r["event_id"]: r for r in records if r.get("schema") == "jetpipe.event/1"}
    ready = [r for r in records if r.get("schema") == "jetpipe.snapshot/1"]
    assert len(events) == panning_video.crossings and sorted(e for r in ready for e in r["events"]) == sorted(events)
    assert summary["snapshots"]["encoder"] == "gpu"
    for record in ready:
        picture = cv2.imread(record["path"])
        assert picture.shape[:2] == (360, 640) and Path(record["path"]).parent == folder
