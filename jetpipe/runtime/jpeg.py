"""JPEG pictures of frames: snapshots of events and the jpeg: sink's files.

Two encoders with one interface:
  GpuJpeg  the frame stays on the GPU: copied from its ring slot into a buffer of the encoder's (device to
           device for NVDEC frames), turned into RGB by one kernel (preprocess.cu's frame_to_rgb8, boxes
           drawn in the same pass) and encoded by nvJPEG through NVIDIA's nvImageCodec
           (`pip install nvidia-nvimgcodec-cu13[nvjpeg]`; on a Jetson nvidia-nvimgcodec-tegra-cu13).
  CpuJpeg  OpenCV: the frame converted to BGR and encoded on the CPU (no GPU, or no nvImageCodec).
`hold(frame)` copies a frame while it is in its ring slot (None: every buffer is busy, the caller counts a
drop); `picture(held, boxes, crop)` encodes it later, in another thread; `release(held)` gives the buffer
back. `encode_image(bgr)` encodes a picture drawn on the host (the jpeg: sink's). Buffers are allocated
once, at construction, for the largest frame the pipeline takes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from dataclasses import dataclass

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.frames import ColourMatrix, frame_shape
from jetpipe.lazy import lazy_import
from jetpipe.preprocess import frame_bgr
from jetpipe.runtime.kernels import PARAMS, frame_params, pitch_of

cv2 = lazy_import("cv2")
log = logging.getLogger(__name__)

ENCODERS = ("auto", "gpu", "cpu")
MAX_BOXES = 32        # outlined on one picture (the events of one frame); more are left out
BOX_THICKNESS = 3     # pixels
BOX_BGR = (0, 255, 0)
NVIMGCODEC_MISSING = ("nvImageCodec is not installed: pip install 'nvidia-nvimgcodec-cu13[nvjpeg]' (on a Jetson "
                      "nvidia-nvimgcodec-tegra-cu13)")


@dataclass
class Held:
    """A frame copied into one of an encoder's buffers: its layout, and the buffer (host array or device)."""
    buffer: object
    format: str
    hw: tuple[int, int]
    standard: str
    range: str


def clip_box(box, hw: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """A box in source pixels as whole pixels inside the frame (end exclusive); None where nothing is left."""
    height, width = hw
    x0, y0 = max(0, int(np.floor(box[0]))), max(0, int(np.floor(box[1])))
    x1, y1 = min(width, int(np.ceil(box[2]))), min(height, int(np.ceil(box[3])))
    return (x0, y0, x1, y1) if x1 > x0 and y1 > y0 else None


class _HeldFrames:
    """What both encoders share: buffers for the frames they hold, allocated at construction (`make()` each:
    any format, at most 3 bytes a pixel of the largest frame), taken by hold() and given back by release()."""

    def _allocate(self, buffers: int, make) -> None:
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(buffers):
            self._free.put(make())

    def hold(self, frame) -> Held | None:
        """A copy of the frame, taken while it is in its ring slot; None (a drop) when every buffer is busy."""
        hw = frame.size()
        try:
            buffer = self._free.get_nowait()
        except queue.Empty:
            return None
        self._copy(frame, hw, buffer)
        return Held(buffer, frame.format, hw, frame.standard, frame.range)

    def release(self, held: Held) -> None:
        self._free.put(held.buffer)

    def _copy(self, frame, hw: tuple[int, int], buffer) -> None:
        raise NotImplementedError


def jpeg_encoder(runtime, choice: str, quality: int, buffers: int, max_hw: tuple[int, int]):
    """The JPEG encoder of snapshots and the jpeg: sink for the frames a runtime reads: nvJPEG through
    nvImageCodec on the GPU runtime's device (`auto` and `gpu`; a trial picture at start-up), OpenCV where asked
    for, on the CPU runtime, or (auto) where the GPU's cannot be had, said in the log. `gpu` without a GPU is
    a mistake."""
    gpu = runtime.device
    if gpu is None:
        if choice == "gpu":
            raise JetpipeError("JPEG encoder 'gpu': the CPU runtime has no GPU; use auto or cpu")
        return CpuJpeg(quality, buffers, max_hw)
    if choice != "cpu":
        try:
            encoder = GpuJpeg(gpu, runtime.module, quality, buffers, max_hw)
            encoder.encode_image(np.zeros((16, 16, 3), np.uint8))
            return encoder
        except Exception as exc:
            if choice == "gpu":
                raise JetpipeError(f"JPEG encoder 'gpu': {str(exc).strip()[:300]}") from None
            log.info("JPEG pictures are encoded by OpenCV on the CPU: the GPU's encoder cannot be had (%s)",
                     str(exc).strip()[:200])
    return CpuJpeg(quality, buffers, max_hw, runtime.frame_to_host)


class CpuJpeg(_HeldFrames):
    """OpenCV's encoder. to_host(frame, out): copies a frame in device memory (the GPU runtime without
    nvImageCodec); None where frames are always on the host."""

    kind = "cpu"

    def __init__(self, quality: int, buffers: int, max_hw: tuple[int, int], to_host=None):
        self.quality, self.to_host = quality, to_host
        self._allocate(buffers, lambda: np.empty(max_hw[0] * max_hw[1] * 3, np.uint8))
        self.describe = "OpenCV (CPU)"

    def _copy(self, frame, hw: tuple[int, int], buffer) -> None:
        shape = frame_shape(frame.format, *hw)
        view = buffer[:int(np.prod(shape))].reshape(shape)
        if frame.device:
            self.to_host(frame, view)
        else:
            np.copyto(view, frame.data)

    def picture(self, held: Held, boxes=(), crop=None) -> bytes:
        """The held frame as a JPEG: whole, boxes outlined, or only the rectangle `crop` (x0, y0, x1, y1)."""
        shape = frame_shape(held.format, *held.hw)
        bgr = frame_bgr(held.buffer[:int(np.prod(shape))].reshape(shape), held.format,
                        ColourMatrix.of(held.standard, held.range))
        if crop is not None:
            x0, y0, x1, y1 = crop
            return self.encode_image(np.ascontiguousarray(bgr[y0:y1, x0:x1]))
        if boxes and np.shares_memory(bgr, held.buffer):  # a BGR frame's own pixels: drawn on a copy
            bgr = bgr.copy()
        for x0, y0, x1, y1 in boxes[:MAX_BOXES]:
            cv2.rectangle(bgr, (x0, y0), (x1 - 1, y1 - 1), BOX_BGR, BOX_THICKNESS)
        return self.encode_image(bgr)

    def encode_image(self, bgr: np.ndarray, quality: int | None = None) -> bytes:
        """A BGR picture (quality: this one's, else the encoder's)."""
        ok, data = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality or self.quality])
        if not ok:
            raise OSError("OpenCV could not encode the JPEG")
        return data.tobytes()

    def close(self) -> None:
        pass


class _DeviceImage:
    """An RGB / BGR picture in device memory as nvImageCodec reads it (CUDA array interface)."""

    def __init__(self, address: int, hw: tuple[int, int], stream_handle: int):
        height, width = hw
        self.__cuda_array_interface__ = {"shape": (height, width, 3), "strides": None, "typestr": "|u1",
                                         "data": (int(address), False), "version": 3, "stream": stream_handle}


class GpuJpeg(_HeldFrames):
    """nvJPEG through nvImageCodec, from frames on the GPU (see the module's note). device: the runtime's
    CudaDevice; module: its compiled preprocess.cu."""

    kind = "gpu"

    def __init__(self, device, module, quality: int, buffers: int, max_hw: tuple[int, int]):
        nvimgcodec = import_nvimgcodec()
        self.device, self.quality, self.max_hw = device, quality, max_hw
        self.capacity = max_hw[0] * max_hw[1] * 3
        self.lock = threading.Lock()  # one picture at a time: the RGB buffer, the parameters, the encoder's stream
        self._params_dtype = PARAMS
        with device.active():
            self.copy_stream = device.stream(non_blocking=True)   # hold(): the post thread's copies
            self.stream = device.stream(non_blocking=True)        # the kernel and the encoder
            self._allocate(buffers, lambda: device.alloc(self.capacity))
            self.rgb = device.alloc(self.capacity)
            self.host_args = device.pinned((PARAMS.itemsize + 16 * MAX_BOXES,), np.uint8)
            self.device_args = device.alloc(self.host_args.nbytes)
            self.function = module.get_function("frame_to_rgb8")
            self.function.prepare("PPiPii")
        # nvJPEG's encoder is the one of kind HYBRID_CPU_GPU (GPU_ONLY has none; CPU_ONLY: libjpeg-turbo's)
        with _quiet_stderr():  # it loads its codecs' libraries here too
            self.codec = nvimgcodec.Encoder(device_id=device.ordinal,
                                            backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.HYBRID_CPU_GPU)])
        self.params = _encode_params(nvimgcodec, quality)
        self._nvimgcodec = nvimgcodec
        self.describe = f"nvJPEG on the GPU (nvImageCodec {getattr(nvimgcodec, '__version__', '?')})"

    def _copy(self, frame, hw: tuple[int, int], buffer) -> None:
        cuda = self.device.cuda
        with self.device.active():
            if frame.device:
                cuda.memcpy_dtod_async(buffer, frame.address, frame.nbytes, self.copy_stream)
            else:
                cuda.memcpy_htod_async(buffer, np.ascontiguousarray(frame.data), self.copy_stream)
            self.copy_stream.synchronize()  # the frame's ring slot may be reused once this returns

    def picture(self, held: Held, boxes=(), crop=None) -> bytes:
        height, width = held.hw
        region = crop if crop is not None else (0, 0, width, height)
        out_hw = (region[3] - region[1], region[2] - region[0])
        values, _ = frame_params(held.format, height, width, pitch_of(held.format, width), int(held.buffer), out_hw,
                                 "stretch", ColourMatrix.of(held.standard, held.range), crop=region)
        drawn = [] if crop is not None else list(boxes[:MAX_BOXES])
        with self.lock, self.device.active():
            self.host_args[:self._params_dtype.itemsize].view(self._params_dtype)[0] = values
            boxes_array = self.host_args[self._params_dtype.itemsize:].view(np.int32).reshape(-1, 4)
            for i, box in enumerate(drawn):
                boxes_array[i] = box
            self.device.cuda.memcpy_htod_async(self.device_args, self.host_args, self.stream)
            block = (32, 8, 1)
            grid = ((out_hw[1] + 31) // 32, (out_hw[0] + 7) // 8, 1)
            self.function.prepared_async_call(grid, block, self.stream, self.device_args, self.rgb,
                                              np.int32(out_hw[1] * 3),
                                              int(self.device_args) + self._params_dtype.itemsize,
                                              np.int32(len(drawn)), np.int32(BOX_THICKNESS))
            return self._encode(out_hw, self._nvimgcodec.SampleFormat.I_RGB)

    def encode_image(self, bgr: np.ndarray, quality: int | None = None) -> bytes:
        """A BGR picture drawn on the host, uploaded and encoded on the GPU (quality: this one's, else the
        encoder's)."""
        if bgr.nbytes > self.capacity:
            raise JetpipeError(f"a {bgr.shape[1]}x{bgr.shape[0]} picture is larger than the JPEG encoder's buffer")
        with self.lock, self.device.active():
            self.device.cuda.memcpy_htod_async(self.rgb, np.ascontiguousarray(bgr), self.stream)
            return self._encode(bgr.shape[:2], self._nvimgcodec.SampleFormat.I_BGR, quality)

    def _encode(self, hw, sample_format, quality: int | None = None) -> bytes:
        """The picture in self.rgb (written on self.stream) as JPEG bytes."""
        nvimgcodec = self._nvimgcodec
        handle = self.stream.handle
        image = nvimgcodec.as_image(_DeviceImage(int(self.rgb), hw, handle), handle, sample_format=sample_format)
        params = self.params if quality in (None, self.quality) else _encode_params(nvimgcodec, quality)
        code = self.codec.encode(image, "jpeg", params=params, cuda_stream=handle)
        if code is None:
            raise OSError("nvImageCodec could not encode the JPEG")
        return bytes(memoryview(code))

    def close(self) -> None:
        self.codec = None  # its buffers go; the device's allocations go with the runtime's device


def _encode_params(nvimgcodec, quality: int):
    """JPEG quality 1-100: by QualityType since nvImageCodec 0.6, as `quality` before."""
    quality_type = getattr(nvimgcodec, "QualityType", None)
    if quality_type is not None:
        return nvimgcodec.EncodeParams(quality_type=quality_type.QUALITY, quality_value=float(quality))
    return nvimgcodec.EncodeParams(quality=float(quality))


def import_nvimgcodec():
    """nvidia.nvimgcodec, its import's complaints about the codecs jetpipe does not use (JPEG 2000, TIFF: their
    libraries are separate wheels) kept out of the log; JetpipeError where it is not installed."""
    try:
        with _quiet_stderr():
            from nvidia import nvimgcodec
    except ImportError:
        raise JetpipeError(NVIMGCODEC_MISSING) from None
    return nvimgcodec


@contextlib.contextmanager
def _quiet_stderr():
    """Standard error (file descriptor 2, where the C++ library prints) sent to /dev/null for the block."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
