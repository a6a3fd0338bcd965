"""Frame sources: each writes into its preallocated ring slot; failures reconnect with backoff.

Specs: `synthetic`, `synthetic:1920x1080@30:nv12`, a video file or image folder,
`/dev/videoN` (V4L2), `rtsp://...`, `gst:PIPELINE` (OpenCV's GStreamer backend,
e.g. the Jetson CSI camera `gst:nvarguscamerasrc ! ... ! appsink`).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.frames import frame_shape, from_bgr

log = logging.getLogger(__name__)


class SourceError(JetpipeError):
    """A source cannot open or read; the worker reconnects with backoff."""


class EndOfStream(Exception):
    """A finite source is exhausted (and does not loop)."""


@dataclass(frozen=True)
class FrameInfo:
    format: str
    height: int
    width: int


class SyntheticCamera:
    """Rendered text panning over a textured background, at a given size, rate and pixel format.

    One wide canvas is rendered and encoded once; frame t is a horizontal slice of
    it, so producing a frame is a copy into the ring slot: no per-frame allocation.
    """

    uri_pattern = re.compile(r"^synthetic(?::(\d+)x(\d+))?(?:@(\d+(?:\.\d+)?))?(?::(\w+))?$")
    pan = 512  # pixels of canvas beyond the frame width; frames step PAN_STEP pixels

    def __init__(self, width=640, height=480, fps=30.0, fmt="nv12", seed=0, step=8):
        frame_shape(fmt, height, width)  # validates format and even sizes
        if fmt == "i420":  # planar chroma cannot be panned by slicing columns
            raise JetpipeError("synthetic sources produce nv12, yuyv, uyvy, bgr or rgb, not i420")
        from jetpipe.synth import render_text_image

        self.info = FrameInfo(fmt, height, width)
        self.fps, self.step = fps, step
        wide = render_text_image(seed, (height, width + self.pan), max_words=max(6, width // 80))
        self.boxes = np.array(wide.boxes, np.float64).reshape(-1, 4)
        self.canvas = from_bgr(wide.bgr, fmt)
        self.count = 0
        self._next = None

    @classmethod
    def from_uri(cls, uri: str, seed: int = 0) -> SyntheticCamera:
        match = cls.uri_pattern.match(uri)
        if not match:
            raise JetpipeError(f"source {uri!r}: write synthetic or synthetic:WIDTHxHEIGHT@FPS:FORMAT, "
                               "e.g. synthetic:1920x1080@30:nv12")
        w, h, fps, fmt = match.groups()
        return cls(int(w or 640), int(h or 480), float(fps or 30), fmt or "nv12", seed=seed)

    def describe(self) -> str:
        i = self.info
        return f"synthetic {i.width}x{i.height}@{self.fps:g} {i.format}"

    def open(self) -> FrameInfo:
        self._next = time.monotonic()
        return self.info

    def offset(self, index: int) -> int:
        """Left edge of frame `index` in canvas pixels (even, so chroma pairs stay aligned)."""
        return (index * self.step) % self.pan // 2 * 2

    def visible_boxes(self, index: int) -> np.ndarray:
        """Ground-truth word boxes fully inside frame `index` (x0, y0, x1, y1)."""
        shifted = self.boxes - [self.offset(index), 0, self.offset(index), 0]
        inside = (shifted[:, 0] >= 0) & (shifted[:, 2] <= self.info.width)
        return shifted[inside]

    def read_into(self, slot: np.ndarray) -> None:
        if self.fps > 0:  # pace like a camera
            self._next += 1.0 / self.fps
            delay = self._next - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                self._next = time.monotonic()
        x = self.offset(self.count)
        i = self.info
        if i.format in ("yuyv", "uyvy"):
            slot[:] = self.canvas[:, 2 * x:2 * (x + i.width)]
        else:
            slot[:] = self.canvas[:, x:x + i.width]
        self.count += 1

    def close(self) -> None:
        pass


class OpenCVSource:
    """Video files, V4L2 cameras, RTSP and GStreamer pipelines through cv2.VideoCapture (BGR frames)."""

    def __init__(self, uri: str, loop: bool = False):
        self.uri, self.loop, self.capture, self.info = uri, loop, None, None
        self.is_file = Path(uri).is_file()

    def describe(self) -> str:
        return self.uri

    def _open_capture(self):
        import cv2

        if self.uri.startswith("gst:"):
            return cv2.VideoCapture(self.uri[4:], cv2.CAP_GSTREAMER)
        if re.match(r"^/dev/video\d+$", self.uri):
            return cv2.VideoCapture(self.uri, cv2.CAP_V4L2)
        return cv2.VideoCapture(self.uri)

    def open(self) -> FrameInfo:
        import cv2

        capture = self._open_capture()
        if not capture.isOpened():
            capture.release()
            raise SourceError(f"cannot open {self.uri}: check the path/URL/device and that OpenCV was "
                              "built with the backend it needs (FFmpeg, GStreamer, V4L2)")
        width = int(capture.get(cv2.CAP_PROP_FRAME_WIDTH))
        height = int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
        if width <= 0 or height <= 0:
            capture.release()
            raise SourceError(f"{self.uri} reports no frame size")
        self.capture, self.info = capture, FrameInfo("bgr", height, width)
        return self.info

    def read_into(self, slot: np.ndarray) -> None:
        ok, image = self.capture.read(slot)
        if not ok:
            if self.is_file and self.loop:
                import cv2

                self.capture.set(cv2.CAP_PROP_POS_FRAMES, 0)
                ok, image = self.capture.read(slot)
            if not ok:
                if self.is_file:
                    raise EndOfStream(self.uri)
                raise SourceError(f"{self.uri}: read failed (disconnected or decode error)")
        if image is not slot:  # OpenCV allocated (size changed): keep the slot's contents right
            if image.shape != slot.shape:
                raise SourceError(f"{self.uri}: frame size changed to {image.shape[1]}x{image.shape[0]}")
            np.copyto(slot, image)

    def close(self) -> None:
        if self.capture is not None:
            self.capture.release()
            self.capture = None


class ImageFolderSource:
    """Images of a folder in name order (decoded per frame by OpenCV, resized to the first's size)."""

    def __init__(self, folder: str, loop: bool = False):
        from jetpipe.convert.calib_data import IMAGE_SUFFIXES

        self.folder, self.loop = Path(folder), loop
        self.files = sorted(p for p in self.folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not self.files:
            raise JetpipeError(f"source {folder}: no images in the folder")
        self.index, self.info = 0, None

    def describe(self) -> str:
        return str(self.folder)

    def open(self) -> FrameInfo:
        import cv2

        first = cv2.imread(str(self.files[0]))
        if first is None:
            raise SourceError(f"cannot read {self.files[0]}")
        self.info = FrameInfo("bgr", first.shape[0] // 2 * 2, first.shape[1] // 2 * 2)
        return self.info

    def read_into(self, slot: np.ndarray) -> None:
        import cv2

        if self.index >= len(self.files):
            if not self.loop:
                raise EndOfStream(str(self.folder))
            self.index = 0
        path = self.files[self.index]
        self.index += 1
        image = cv2.imread(str(path))
        if image is None:
            raise SourceError(f"cannot decode {path}")
        cv2.resize(image, (self.info.width, self.info.height), dst=slot)

    def close(self) -> None:
        pass


def open_source(uri: str, loop: bool = False, seed: int = 0):
    """A source object for a spec string (nothing is opened yet)."""
    if uri.startswith("synthetic"):
        return SyntheticCamera.from_uri(uri, seed=seed)
    if uri.startswith(("rtsp://", "rtmp://", "http://", "https://", "gst:")) or uri.startswith("/dev/video"):
        return OpenCVSource(uri, loop)
    path = Path(uri)
    if path.is_dir():
        return ImageFolderSource(uri, loop)
    if path.is_file():
        return OpenCVSource(uri, loop)
    raise JetpipeError(f"source {uri!r} not found: use synthetic[:WxH@FPS:FORMAT], a video file, an image "
                       "folder, /dev/videoN, rtsp://... or gst:PIPELINE")
