"""Camera frame formats and their CPU reference conversion to RGB.

Layouts (tightly packed host frames, `pitch` = bytes per luma / packed row):
  NV12  Y plane h x w, then interleaved UV plane h/2 x w      -> array (h*3/2, w)
  I420  Y plane h x w, then U (h/2 x w/2), then V              -> array (h*3/2, w)
  YUYV  Y0 U Y1 V per pixel pair                                -> array (h, 2w)
  UYVY  U Y0 V Y1 per pixel pair                                -> array (h, 2w)
  BGR / RGB packed 8-bit                                        -> array (h, w, 3)
Chroma is sampled at the nearest site (as OpenCV does), and the conversion is
float math clamped to [0, 255]: the GPU kernel does exactly this per tap.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from jetpipe.errors import JetpipeError

FORMATS = ("nv12", "i420", "yuyv", "uyvy", "bgr", "rgb")
FORMAT_CODES = {name: i for i, name in enumerate(FORMATS)}
STANDARDS = ("bt601", "bt709")
RANGES = ("limited", "full")
YUV_FORMATS = ("nv12", "i420", "yuyv", "uyvy")
GRAY_WEIGHTS = (0.299, 0.587, 0.114)  # R, G, B: BT.601 luma, as OpenCV's COLOR_BGR2GRAY

# Kr, Kb of each standard: R = Y + 2(1-Kr) Cr, B = Y + 2(1-Kb) Cb, G from the luma equation
_KR_KB = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722)}


@dataclass(frozen=True)
class ColourMatrix:
    """YUV -> RGB: R = ky*(Y - y0) + rv*(V-128)*kc, etc.; kc folds in the chroma range."""

    ky: float
    y0: float
    kc: float
    rv: float
    gu: float
    gv: float
    bu: float

    @classmethod
    def of(cls, standard: str = "bt601", value_range: str = "limited") -> ColourMatrix:
        return _colour_matrix(cls, standard, value_range)


@functools.cache  # asked for every frame and every crop of a batch; a handful exist
def _colour_matrix(cls, standard: str, value_range: str) -> ColourMatrix:
    if standard not in _KR_KB:
        raise JetpipeError(f"colour standard {standard!r}: choose one of {', '.join(STANDARDS)}")
    if value_range not in RANGES:
        raise JetpipeError(f"range {value_range!r}: choose one of {', '.join(RANGES)}")
    kr, kb = _KR_KB[standard]
    kg = 1.0 - kr - kb
    limited = value_range == "limited"
    return cls(ky=255.0 / 219.0 if limited else 1.0, y0=16.0 if limited else 0.0,
               kc=255.0 / 224.0 if limited else 1.0,
               rv=2 * (1 - kr), gu=-2 * (1 - kb) * kb / kg, gv=-2 * (1 - kr) * kr / kg, bu=2 * (1 - kb))


def frame_shape(fmt: str, height: int, width: int) -> tuple[int, ...]:
    """Shape of a tightly packed host frame of this format."""
    if fmt not in FORMAT_CODES:
        raise JetpipeError(f"pixel format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt in YUV_FORMATS and (height % 2 or width % 2):
        raise JetpipeError(f"{fmt} frames need an even width and height, got {width}x{height}")
    if fmt in ("nv12", "i420"):
        return (height * 3 // 2, width)
    if fmt in ("yuyv", "uyvy"):
        return (height, width * 2)
    return (height, width, 3)


def frame_size(frame: np.ndarray, fmt: str) -> tuple[int, int]:
    """(height, width) of a tightly packed host frame, from its array shape."""
    if fmt in ("nv12", "i420") and frame.ndim == 2:
        return frame.shape[0] * 2 // 3, frame.shape[1]
    if fmt in ("yuyv", "uyvy") and frame.ndim == 2:
        return frame.shape[0], frame.shape[1] // 2
    if fmt in ("bgr", "rgb") and frame.ndim == 3:
        return frame.shape[0], frame.shape[1]
    raise JetpipeError(f"a {fmt} frame cannot have shape {list(frame.shape)}: see jetpipe.frames for layouts")


def check_frame(frame: np.ndarray, fmt: str, height: int, width: int) -> None:
    expected = frame_shape(fmt, height, width)
    if frame.dtype != np.uint8 or frame.shape != expected:
        raise JetpipeError(f"{fmt} frame of {width}x{height} must be uint8 {list(expected)}, "
                           f"got {frame.dtype} {list(frame.shape)}")


def native_planes(frame: np.ndarray, fmt: str, height: int, width: int):
    """Y at full resolution, U and V at their own (contiguous uint8 arrays, as OpenCV wants them)."""
    h, w = height, width
    if fmt == "nv12":
        uv = frame[h:].reshape(h // 2, w // 2, 2)
        return frame[:h], np.ascontiguousarray(uv[..., 0]), np.ascontiguousarray(uv[..., 1])
    if fmt == "i420":
        chroma = frame[h:].reshape(-1)
        return (frame[:h], chroma[: h * w // 4].reshape(h // 2, w // 2),
                chroma[h * w // 4:].reshape(h // 2, w // 2))
    quads = frame.reshape(h, w // 2, 4)
    order = (0, 1, 2, 3) if fmt == "yuyv" else (1, 0, 3, 2)  # Y0 U Y1 V  /  U Y0 V Y1
    y = np.stack([quads[..., order[0]], quads[..., order[2]]], axis=-1).reshape(h, w)
    return y, np.ascontiguousarray(quads[..., order[1]]), np.ascontiguousarray(quads[..., order[3]])


def yuv_planes(frame: np.ndarray, fmt: str, height: int, width: int):
    """Full-resolution Y, U, V float32 planes (chroma repeated: nearest site)."""
    h, w = height, width
    if fmt == "nv12":
        y = frame[:h]
        uv = frame[h:].reshape(h // 2, w // 2, 2)
        u, v = uv[..., 0], uv[..., 1]
    elif fmt == "i420":
        y = frame[:h]
        chroma = frame[h:].reshape(-1)
        u = chroma[: h * w // 4].reshape(h // 2, w // 2)
        v = chroma[h * w // 4:].reshape(h // 2, w // 2)
    else:
        quads = frame.reshape(h, w // 2, 4)
        order = (0, 1, 2, 3) if fmt == "yuyv" else (1, 0, 3, 2)  # Y0 U Y1 V  /  U Y0 V Y1
        y = np.stack([quads[..., order[0]], quads[..., order[2]]], axis=-1).reshape(h, w)
        u, v = quads[..., order[1]], quads[..., order[3]]
        return (y.astype(np.float32), np.repeat(u, 2, axis=1).astype(np.float32),
                np.repeat(v, 2, axis=1).astype(np.float32))
    up = lambda c: np.repeat(np.repeat(c, 2, axis=0), 2, axis=1).astype(np.float32)  # noqa: E731
    return y.astype(np.float32), up(u), up(v)


def to_rgb_float(frame: np.ndarray, fmt: str, height: int, width: int,
                 matrix: ColourMatrix | None = None) -> np.ndarray:
    """Any supported frame -> H x W x 3 float32 RGB in [0, 255] (the reference conversion)."""
    check_frame(frame, fmt, height, width)
    if fmt == "bgr":
        return frame[..., ::-1].astype(np.float32)
    if fmt == "rgb":
        return frame.astype(np.float32)
    m = matrix or ColourMatrix.of()
    y, u, v = yuv_planes(frame, fmt, height, width)
    yy = (y - m.y0) * m.ky
    cb, cr = (u - 128.0) * m.kc, (v - 128.0) * m.kc
    rgb = np.stack([yy + m.rv * cr, yy + m.gu * cb + m.gv * cr, yy + m.bu * cb], axis=-1)
    return np.clip(rgb, 0.0, 255.0)


def to_gray_float(frame: np.ndarray, fmt: str, height: int, width: int,
                  matrix: ColourMatrix | None = None) -> np.ndarray:
    """Any supported frame -> H x W float32 luma in [0, 255] (the gray reference): a YUV frame's Y plane
    brought to full range, BT.601 weights for BGR / RGB (OpenCV's COLOR_BGR2GRAY)."""
    check_frame(frame, fmt, height, width)
    if fmt in ("bgr", "rgb"):
        rgb = frame.astype(np.float32)[..., ::-1] if fmt == "bgr" else frame.astype(np.float32)
        return rgb @ np.array(GRAY_WEIGHTS, np.float32)
    m = matrix or ColourMatrix.of()
    y = native_planes(frame, fmt, height, width)[0].astype(np.float32)
    return np.clip((y - m.y0) * m.ky, 0.0, 255.0)


def from_bgr(bgr: np.ndarray, fmt: str, matrix: ColourMatrix | None = None) -> np.ndarray:
    """Encode a BGR image into a frame of `fmt` (for tests and the synthetic camera)."""
    h, w = bgr.shape[:2]
    frame_shape(fmt, h, w)
    if fmt == "bgr":
        return np.ascontiguousarray(bgr)
    if fmt == "rgb":
        return np.ascontiguousarray(bgr[..., ::-1])
    m = matrix or ColourMatrix.of()
    rgb = bgr[..., ::-1].astype(np.float64)
    # invert the matrix: luma from Kr/Kb weights, chroma as scaled differences
    kb = m.bu / 2
    kb = 1 - kb
    kr = 1 - m.rv / 2
    luma = kr * rgb[..., 0] + (1 - kr - kb) * rgb[..., 1] + kb * rgb[..., 2]
    cb = (rgb[..., 2] - luma) / m.bu
    cr = (rgb[..., 0] - luma) / m.rv
    y = np.clip(np.round(luma / m.ky + m.y0), 0, 255).astype(np.uint8)
    sub = lambda c: c.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3))  # noqa: E731
    if fmt in ("yuyv", "uyvy"):
        sub = lambda c: c.reshape(h, w // 2, 2).mean(axis=2)  # noqa: E731
    u = np.clip(np.round(sub(cb) / m.kc + 128), 0, 255).astype(np.uint8)
    v = np.clip(np.round(sub(cr) / m.kc + 128), 0, 255).astype(np.uint8)
    if fmt == "nv12":
        return np.concatenate([y, np.stack([u, v], axis=-1).reshape(h // 2, w)])
    if fmt == "i420":
        return np.concatenate([y, np.concatenate([u.ravel(), v.ravel()]).reshape(h // 2, w)])
    y_pairs = y.reshape(h, w // 2, 2)
    quads = (np.stack([y_pairs[..., 0], u, y_pairs[..., 1], v], axis=-1) if fmt == "yuyv"
             else np.stack([u, y_pairs[..., 0], v, y_pairs[..., 1]], axis=-1))
    return quads.reshape(h, w * 2)


Crop = tuple[int, int, int, int]  # x0, y0, x1, y1 in source pixels (x1, y1 exclusive)


def check_crop(crop: Crop, height: int, width: int) -> None:
    x0, y0, x1, y1 = crop
    if not (0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height):
        raise JetpipeError(f"crop {list(crop)} is not a non-empty rectangle inside the {width}x{height} frame")


def crop_native(frame: np.ndarray, fmt: str, height: int, width: int, crop: Crop) -> tuple[np.ndarray, Crop]:
    """The smallest even-aligned part of a frame, in its own layout, that holds `crop` (a new, tightly packed
    frame: subsampled chroma keeps whole 2x2 sites), and `crop` relative to that part. Converting only this
    part costs as much as the crop, not the frame."""
    x0, y0, x1, y1 = crop
    if fmt in ("bgr", "rgb"):
        return frame[y0:y1, x0:x1], (0, 0, x1 - x0, y1 - y0)
    ex0, ey0 = x0 & ~1, y0 & ~1
    ex1, ey1 = min(width, x1 + (x1 & 1)), min(height, y1 + (y1 & 1))
    w, h = ex1 - ex0, ey1 - ey0
    if fmt in ("yuyv", "uyvy"):  # a macropixel holds two pixels: whole macropixels
        part = frame[ey0:ey1, 2 * ex0:2 * ex1]
    elif fmt == "nv12":
        part = np.concatenate([frame[ey0:ey1, ex0:ex1], frame[height + ey0 // 2:height + ey1 // 2, ex0:ex1]])
    else:  # i420: each chroma plane is (height/2) x (width/2), packed row after row
        _, u, v = native_planes(frame, fmt, height, width)
        chroma = [p[ey0 // 2:ey1 // 2, ex0 // 2:ex1 // 2].reshape(-1) for p in (u, v)]
        part = np.concatenate([frame[ey0:ey1, ex0:ex1].reshape(-1), *chroma]).reshape(h * 3 // 2, w)
    return np.ascontiguousarray(part), (x0 - ex0, y0 - ey0, x1 - ex0, y1 - ey0)
