"""CPU reference preprocessing (OpenCV + numpy).

Used for calibration data and the CPU runtime, and the reference the fused GPU
kernels are tested against; the letterbox geometry both follow is jetpipe.geometry.
"""

from __future__ import annotations

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.frames import (
    ColourMatrix,
    Crop,
    check_crop,
    crop_native,
    frame_size,
    native_planes,
    to_gray_float,
    to_rgb_float,
)
from jetpipe.geometry import Letterbox, affine, fit, quad_homography, quad_size
from jetpipe.lazy import lazy_import
from jetpipe.spec import PreprocessSpec

cv2 = lazy_import("cv2")


def _normalize_into(content: np.ndarray, box: Letterbox, size_hw, spec: PreprocessSpec,
                    out: np.ndarray | None) -> np.ndarray:
    """content: resized h x w x 3 in the network's channel order (h x w for gray) -> normalized CHW canvas."""
    nh, nw = content.shape[:2]
    channels = spec.channels
    canvas = np.full((size_hw[0], size_hw[1], channels), spec.pad_value, dtype=np.float32)
    canvas[box.pad_y:box.pad_y + nh, box.pad_x:box.pad_x + nw] = content.reshape(nh, nw, channels)
    mul, add = affine(spec)
    if out is None:
        out = np.empty((channels, size_hw[0], size_hw[1]), np.float32)
    out[...] = (canvas * mul + add).transpose(2, 0, 1)
    return out


def preprocess_bgr(image: np.ndarray, size_hw: tuple[int, int], spec: PreprocessSpec,
                   out: np.ndarray | None = None) -> tuple[np.ndarray, Letterbox]:
    """One HxWx3 uint8 BGR image -> CxHxW float32 network input (written into `out` if given).

    Resizes in uint8 (OpenCV's fast path); preprocess_frame resizes in float.
    The two differ by less than one 8-bit step."""
    (nh, nw), box = fit(image.shape[:2], size_hw, spec.resize)
    if spec.channel_order == "gray":
        image = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
    resized = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_LINEAR)
    if spec.channel_order == "rgb":
        resized = resized[:, :, ::-1]
    return _normalize_into(resized, box, size_hw, spec, out), box


def preprocess_frame(frame: np.ndarray, fmt: str, size_hw: tuple[int, int], spec: PreprocessSpec,
                     matrix=None, out: np.ndarray | None = None,
                     crop: Crop | None = None, quad=None) -> tuple[np.ndarray, Letterbox]:
    """Any camera frame (see jetpipe.frames) -> network input: the GPU kernel's reference.

    Colour conversion (or luma, for gray) in float at full resolution, then float bilinear resize.
    crop (x0, y0, x1, y1): only that rectangle becomes the input (its borders replicated by the resize,
    as the kernel clamps to it); the letterbox then maps network pixels to the crop's.
    quad (with crop = the region that holds it): the quadrilateral is warped upright into the input
    (see warp_quad); the letterbox maps network pixels to the upright crop's."""
    if quad is not None:
        return _preprocess_quad(frame, fmt, size_hw, spec, matrix, out, crop, quad, fast=False)
    height, width = frame_size(frame, fmt)
    if crop is not None:
        check_crop(crop, height, width)
        frame, crop = crop_native(frame, fmt, height, width, crop)
        height, width = frame_size(frame, fmt)
    if spec.channel_order == "gray":
        pixels = to_gray_float(frame, fmt, height, width, matrix)
    else:
        pixels = to_rgb_float(frame, fmt, height, width, matrix)
    if crop is not None:
        pixels, (height, width) = pixels[crop[1]:crop[3], crop[0]:crop[2]], (crop[3] - crop[1], crop[2] - crop[0])
    (nh, nw), box = fit((height, width), size_hw, spec.resize)
    resized = cv2.resize(pixels, (nw, nh), interpolation=cv2.INTER_LINEAR)
    if spec.channel_order == "bgr":
        resized = resized[:, :, ::-1]
    return _normalize_into(resized, box, size_hw, spec, out), box


def warp_quad(pixels: np.ndarray, homography: np.ndarray, content_hw: tuple[int, int]) -> np.ndarray:
    """Bilinear samples of `pixels` (H x W [x C] float) at homography(u + 0.5, v + 0.5) - 0.5 for every
    content pixel (u, v), the border repeated: the GPU kernel's warp, in float64."""
    nh, nw = content_hw
    v, u = np.mgrid[0:nh, 0:nw].astype(np.float64) + 0.5
    m = homography
    den = m[2, 0] * u + m[2, 1] * v + m[2, 2]
    sx = (m[0, 0] * u + m[0, 1] * v + m[0, 2]) / den - 0.5
    sy = (m[1, 0] * u + m[1, 1] * v + m[1, 2]) / den - 0.5
    x0, x1, ax = _taps(sx, pixels.shape[1])
    y0, y1, ay = _taps(sy, pixels.shape[0])
    if pixels.ndim == 3:
        ax, ay = ax[..., None], ay[..., None]
    top = pixels[y0, x0] + (pixels[y0, x1] - pixels[y0, x0]) * ax
    bottom = pixels[y1, x0] + (pixels[y1, x1] - pixels[y1, x0]) * ax
    return (top + (bottom - top) * ay).astype(np.float32)


def _taps(s: np.ndarray, size: int):
    """The kernel's tap(): floor and fraction, replicated border (no blend past either edge)."""
    i0 = np.floor(s).astype(np.int64)
    a = s - i0
    low, high = i0 < 0, i0 >= size - 1
    i0 = np.where(low, 0, np.where(high, size - 1, i0))
    a = np.where(low | high, 0.0, a)
    return i0, np.minimum(i0 + 1, size - 1), a


def _preprocess_quad(frame, fmt, size_hw, spec, matrix, out, crop, quad, fast: bool):
    """A quadrilateral warped upright into the input: only the region around it (crop) is converted."""
    if crop is None:
        raise JetpipeError("a quad crop needs the region that holds it (crop)")
    height, width = frame_size(frame, fmt)
    check_crop(crop, height, width)
    part, (x0, y0, x1, y1) = crop_native(frame, fmt, height, width, crop)
    part_hw = frame_size(part, fmt)
    gray = spec.channel_order == "gray"
    if fast and not gray and _opencv_decodes(fmt, matrix):
        pixels = opencv_bgr(part, fmt)[y0:y1, x0:x1, ::-1].astype(np.float32)
    else:
        pixels = (to_gray_float if gray else to_rgb_float)(part, fmt, *part_hw, matrix)[y0:y1, x0:x1]
    (nh, nw), box = fit(quad_size(quad), size_hw, spec.resize)
    content = warp_quad(pixels, quad_homography(quad, (nh, nw), crop[:2]), (nh, nw))
    if spec.channel_order == "bgr":
        content = content[:, :, ::-1]
    return _normalize_into(content, box, size_hw, spec, out), box


def _opencv_decodes(fmt: str, matrix) -> bool:
    """OpenCV's integer decoders give this frame's colours: RGB / BGR, or YUV in BT.601 limited range."""
    return fmt in ("bgr", "rgb") or matrix is None or matrix == ColourMatrix.of("bt601", "limited")


_OPENCV_DECODE = {"nv12": "COLOR_YUV2BGR_NV12", "i420": "COLOR_YUV2BGR_I420",
                  "yuyv": "COLOR_YUV2BGR_YUYV", "uyvy": "COLOR_YUV2BGR_UYVY"}


def opencv_bgr(frame: np.ndarray, fmt: str) -> np.ndarray:
    """Any frame -> BGR through OpenCV's integer decoders (BT.601 limited range for YUV, what OpenCV
    implements): fast, within 1.5 8-bit steps of the float reference for that standard."""
    if fmt == "bgr":
        return frame
    if fmt == "rgb":
        return frame[:, :, ::-1]
    source = frame.reshape(frame.shape[0], -1, 2) if fmt in ("yuyv", "uyvy") else frame
    return cv2.cvtColor(source, getattr(cv2, _OPENCV_DECODE[fmt]))


def frame_bgr(frame: np.ndarray, fmt: str, matrix=None) -> np.ndarray:
    """Any frame -> BGR in its own colours: OpenCV's integer decoders where they apply (BT.601 limited range),
    the float reference for other standards and ranges (a full-range camera, BT.709 video)."""
    if _opencv_decodes(fmt, matrix):
        return opencv_bgr(frame, fmt)
    height, width = frame_size(frame, fmt)
    return np.rint(to_rgb_float(frame, fmt, height, width, matrix)[:, :, ::-1]).astype(np.uint8)


def preprocess_frame_fast(frame: np.ndarray, fmt: str, size_hw: tuple[int, int], spec: PreprocessSpec,
                          matrix=None, out: np.ndarray | None = None,
                          crop: Crop | None = None, quad=None) -> tuple[np.ndarray, Letterbox]:
    """The CPU runtime's path: OpenCV's integer decoders where they apply (BT.601 limited range,
    what OpenCV implements), then the uint8 resize. Within 1.5 8-bit steps of preprocess_frame (both
    round to uint8), several times faster; other standards and ranges take the exact float path.
    crop: only the even-aligned part of the frame around it is converted, then the crop is cut from that.
    quad: as preprocess_frame's, from that part decoded by OpenCV."""
    if quad is not None:
        return _preprocess_quad(frame, fmt, size_hw, spec, matrix, out, crop, quad, fast=True)
    if crop is not None:
        height, width = frame_size(frame, fmt)
        check_crop(crop, height, width)
        if spec.channel_order == "gray" or not _opencv_decodes(fmt, matrix):
            return preprocess_frame(frame, fmt, size_hw, spec, matrix, out, crop)
        part, (x0, y0, x1, y1) = crop_native(frame, fmt, height, width, crop)
        return preprocess_bgr(opencv_bgr(part, fmt)[y0:y1, x0:x1], size_hw, spec, out)
    if fmt in ("bgr", "rgb"):
        return preprocess_bgr(opencv_bgr(frame, fmt), size_hw, spec, out)
    if spec.channel_order == "gray":
        return _preprocess_luma(frame, fmt, size_hw, spec, matrix or ColourMatrix.of(), out)
    if _opencv_decodes(fmt, matrix):
        return preprocess_bgr(opencv_bgr(frame, fmt), size_hw, spec, out)
    height, width = frame_size(frame, fmt)
    (nh, nw), _ = fit((height, width), size_hw, spec.resize)
    if nh * nw >= height * width:  # enlarging: converting first costs no more
        return preprocess_frame(frame, fmt, size_hw, spec, matrix, out)
    return _preprocess_yuv_resized_first(frame, fmt, size_hw, spec, matrix, out)


def _preprocess_luma(frame, fmt, size_hw, spec, matrix, out):
    """Gray from a YUV frame: only its Y plane, resized (uint8, OpenCV), then brought to full range."""
    height, width = frame_size(frame, fmt)
    (nh, nw), box = fit((height, width), size_hw, spec.resize)
    y = native_planes(frame, fmt, height, width)[0]
    resized = cv2.resize(np.ascontiguousarray(y), (nw, nh), interpolation=cv2.INTER_LINEAR).astype(np.float32)
    return _normalize_into(np.clip((resized - matrix.y0) * matrix.ky, 0.0, 255.0), box, size_hw, spec, out), box


def _preprocess_yuv_resized_first(frame, fmt, size_hw, spec, matrix, out):
    """Other standards and ranges (BT.709 HD video, full-range MJPEG), which OpenCV's decoders lack:
    resize the Y, U and V planes (uint8, OpenCV) to the network's size first, then convert colour there.
    The conversion is affine and the resize linear, so the order changes only rounding and where
    chroma is sampled; an HD frame costs a ninth of the full-resolution float conversion."""
    height, width = frame_size(frame, fmt)
    (nh, nw), box = fit((height, width), size_hw, spec.resize)
    y, u, v = (cv2.resize(plane, (nw, nh), interpolation=cv2.INTER_LINEAR).astype(np.float32)
               for plane in native_planes(frame, fmt, height, width))
    yy = (y - matrix.y0) * matrix.ky
    cb, cr = (u - 128.0) * matrix.kc, (v - 128.0) * matrix.kc
    rgb = np.clip(np.stack([yy + matrix.rv * cr, yy + matrix.gu * cb + matrix.gv * cr, yy + matrix.bu * cb],
                           axis=-1), 0.0, 255.0)
    if spec.channel_order == "bgr":
        rgb = rgb[:, :, ::-1]
    return _normalize_into(rgb, box, size_hw, spec, out), box
