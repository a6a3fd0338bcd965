"""OpenCV sources: decode and convert colour on the CPU (BGR frames).

Kept for `decoder = "opencv"` (the baseline the benchmarks compare with, and the
fallback where no ffmpeg is installed) and for image folders, which are stills.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.lazy import lazy_import
from jetpipe.pipelines.sources.base import EndOfStream, FrameInfo, SourceError
from jetpipe.uri import IMAGE_SUFFIXES, SourceURI

cv2 = lazy_import("cv2")

log = logging.getLogger(__name__)


class OpenCVSource:
    """Video files, V4L2 cameras, RTSP and GStreamer pipelines through cv2.VideoCapture (BGR frames)."""

    memory = "host"
    shares_thread = False
    decode_errors = 0

    def __init__(self, uri: SourceURI, loop: bool = False):
        self.source_uri, self.uri, self.loop, self.capture, self.info = uri, uri.text, loop, None, None
        self.is_file, self.live = uri.scheme == "file", uri.live

    def describe(self) -> str:
        return f"{self.uri} (OpenCV, BGR on the CPU)"

    def _open_capture(self):
        location = self.source_uri.location
        if self.source_uri.scheme == "gst":
            return cv2.VideoCapture(location, cv2.CAP_GSTREAMER)
        if self.source_uri.scheme == "v4l2":
            return cv2.VideoCapture(location, cv2.CAP_V4L2)
        return cv2.VideoCapture(location)

    def open(self) -> FrameInfo:
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

    def read_into(self, slot: np.ndarray) -> float | None:
        ok, image = self.capture.read(slot)
        if not ok:
            if self.is_file and self.loop:
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
        return self.capture.get(cv2.CAP_PROP_POS_MSEC) / 1000.0

    def interrupt(self) -> None:
        pass  # cv2.VideoCapture cannot be interrupted: the daemon stops waiting for it after a deadline

    def restart(self) -> bool:
        """cv2.VideoCapture's connection cannot be ended from another thread."""
        return False

    def close(self) -> None:
        if self.capture is not None:
            self.capture.release()
            self.capture = None


class ImageFolderSource:
    """Images of a folder in name order (decoded per frame by OpenCV, resized to the first's size)."""

    memory = "host"
    shares_thread = False
    live = False
    decode_errors = 0

    def __init__(self, folder: str, loop: bool = False, uri: str | None = None):
        self.folder, self.loop, self.uri = Path(folder), loop, uri or str(folder)
        self.files = sorted(p for p in self.folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not self.files:
            raise JetpipeError(f"source {folder}: no images in the folder")
        self.index, self.info = 0, None

    def describe(self) -> str:
        return str(self.folder)

    def open(self) -> FrameInfo:
        first = cv2.imread(str(self.files[0]))
        if first is None:
            raise SourceError(f"cannot read {self.files[0]}")
        self.info = FrameInfo("bgr", first.shape[0] // 2 * 2, first.shape[1] // 2 * 2)
        return self.info

    def read_into(self, slot: np.ndarray) -> None:
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

    def interrupt(self) -> None:
        pass

    def restart(self) -> bool:
        """A folder has no connection to end."""
        return False

    def close(self) -> None:
        pass
