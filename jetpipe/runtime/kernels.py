"""The fused preprocessing kernel: compiled once through PyCUDA, cached on disk.

`GpuPreprocessor` owns the per-frame parameter buffers of one in-flight batch
and launches one kernel for the whole batch, writing straight into the
engine's input buffer.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.frames import FORMAT_CODES, ColourMatrix, frame_shape
from jetpipe.geometry import Letterbox, affine, fit, quad_homography, quad_size
from jetpipe.spec import PreprocessSpec

SOURCE = Path(__file__).with_name("preprocess.cu")
MODES = {"rgb": 0, "bgr": 1, "gray": 2}  # mirrors MODE_* in preprocess.cu
BLOCK = (32, 8, 1)  # 256 threads: preprocess.cu's RESIDENT_BLOCKS bound is for blocks of this size
QUAD = 4  # adjacent output pixels per thread (mirrors QUAD in preprocess.cu)

# Mirrors struct FrameParams in preprocess.cu (128 bytes, 8-byte aligned).
PARAMS = np.dtype([
    ("src", np.uint64), ("width", np.int32), ("height", np.int32), ("pitch", np.int32),
    ("format", np.int32), ("scale_x", np.float32), ("scale_y", np.float32), ("pad_x", np.int32),
    ("pad_y", np.int32), ("content_w", np.int32), ("content_h", np.int32), ("ky", np.float32),
    ("y0", np.float32), ("kc", np.float32), ("rv", np.float32), ("gu", np.float32),
    ("gv", np.float32), ("bu", np.float32), ("origin_x", np.int32), ("origin_y", np.int32),
    ("plane_height", np.int32), ("hom", np.float32, 9), ("warp", np.int32)], align=True)
assert PARAMS.itemsize == 128


class KernelError(JetpipeError):
    """The preprocessing kernels cannot be compiled or loaded."""


def cache_dir() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    path = root / "jetpipe" / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def compile_module(source: Path = SOURCE):
    """The compiled module (PyCUDA keys its disk cache on source, options, nvcc and GPU arch)."""
    if shutil.which("nvcc") is None:
        raise KernelError("nvcc not found: the preprocessing kernels are compiled with the CUDA toolkit's "
                          "nvcc; add it to PATH (JetPack: /usr/local/cuda/bin) or install the CUDA toolkit")
    from pycuda.compiler import SourceModule
    from pycuda.driver import CompileError

    try:
        # the source's folder for its headers (PyCUDA's cache key covers what they include)
        return SourceModule(source.read_text(), no_extern_c=True, options=["-O3"], cache_dir=str(cache_dir()),
                            include_dirs=[str(source.parent)])
    except CompileError as exc:
        raise KernelError(f"compiling {source.name} failed: {str(exc).strip()[:400]}") from exc


_NO_WARP = np.zeros(9)  # the homography of a frame read without a quadrilateral (warp = 0: never used)


def frame_params(fmt: str, height: int, width: int, pitch: int, address: int, size_hw: tuple[int, int],
                 resize: str, matrix: ColourMatrix, crop=None, quad=None) -> tuple[tuple, Letterbox]:
    """One FrameParams record's values (in PARAMS' order, assigned at once: a secondary sets one per crop)
    and the letterbox placement for postprocessing. crop (x0, y0, x1, y1): the kernel reads only that
    rectangle of the frame (its size is what is resized; the frame's height still locates the chroma
    planes). quad: four corners inside crop, warped upright (preprocess.warp_quad)."""
    x0, y0, x1, y1 = crop if crop is not None else (0, 0, width, height)
    plane_height, height, width = height, y1 - y0, x1 - x0
    (nh, nw), box = fit(quad_size(quad) if quad is not None else (height, width), size_hw, resize)
    hom = quad_homography(quad, (nh, nw), (x0, y0)).ravel() if quad is not None else _NO_WARP
    values = (address, width, height, pitch, FORMAT_CODES[fmt], width / nw, height / nh, box.pad_x, box.pad_y,
              nw, nh, matrix.ky, matrix.y0, matrix.kc, matrix.rv, matrix.gu, matrix.gv, matrix.bu, x0, y0,
              plane_height, hom, quad is not None)
    return values, box


def pitch_of(fmt: str, width: int) -> int:
    """Bytes per row of the luma / packed plane of a tightly packed frame."""
    shape = frame_shape(fmt, 2, width)
    return shape[1] * (shape[2] if len(shape) == 3 else 1)


class GpuPreprocessor:
    """Launches the fused kernel for up to max_batch frames into an NCHW buffer."""

    def __init__(self, device, module, max_batch: int, size_hw: tuple[int, int], spec: PreprocessSpec,
                 out_dtype=np.float32):
        self.size_hw, self.spec, self.max_batch = size_hw, spec, max_batch
        name = "preprocess_f16" if np.dtype(out_dtype) == np.float16 else "preprocess_f32"
        self.function = module.get_function(name)
        self.function.prepare("PPiiifffffffi")
        self.host_params = device.pinned((max_batch,), PARAMS)
        self.device_params = device.alloc(PARAMS.itemsize * max_batch)
        mul, add = (np.resize(v, 3) for v in affine(spec))  # gray: one channel, the kernel reads m0 / a0
        self.constants = (np.float32(spec.pad_value), *(np.float32(v) for v in (*mul, *add)),
                          np.int32(MODES[spec.channel_order]))
        self._cuda = device.cuda

    def set_frame(self, index: int, fmt: str, height: int, width: int, address: int,
                  matrix: ColourMatrix, pitch: int | None = None, crop=None, quad=None) -> Letterbox:
        values, box = frame_params(fmt, height, width, pitch if pitch is not None else pitch_of(fmt, width),
                                   address, self.size_hw, self.spec.resize, matrix, crop, quad)
        self.host_params[index] = values
        return box

    def launch(self, batch: int, out_address: int, stream) -> None:
        """Upload this batch's parameters and run the kernel, both on `stream`."""
        self._cuda.memcpy_htod_async(self.device_params, self.host_params[:batch], stream)
        h, w = self.size_hw
        columns = BLOCK[0] * QUAD
        grid = ((w + columns - 1) // columns, (h + BLOCK[1] - 1) // BLOCK[1], batch)
        self.function.prepared_async_call(grid, BLOCK, stream, self.device_params, out_address,
                                          np.int32(w), np.int32(h), np.int32(batch), *self.constants)
