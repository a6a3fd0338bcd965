"""OpenCV sources: decode and convert colour on the CPU (BGR frames).

Kept for `decoder = "opencv"` (the baseline the benchmarks compare with, and the
fallback where no ffmpeg is installed) and for image folders, which are stills.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from jetpipe.errors import JetpipeError, worth_logging
from jetpipe.lazy import lazy_import
from jetpipe.pipelines.ingest.sources.base import EndOfStream, FrameInfo, SourceError, not_teed, read_whole
from jetpipe.uri import IMAGE_SUFFIXES, SourceURI

cv2 = lazy_import("cv2")

log = logging.getLogger(__name__)


class OpenCVSource:
    """Video files, V4L2 cameras, RTSP and GStreamer pipelines through cv2.VideoCapture (BGR frames)."""

    memory = "host"
    shares_thread = False
    decode_errors = 0
    keeps_packets, packet_ring = False, None  # VideoCapture gives decoded frames only: no clips

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

    read_queued = read_whole  # the frame is in the slot when read_into returns
    tee_packets = not_teed  # its packets, where it keeps them, are demuxed in this process

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
    """Images of a folder in name order (decoded per frame by OpenCV, resized to the first's size). An image that
    does not decode is skipped, counted (decode_errors) and said; a folder where none does is refused."""

    memory = "host"
    shares_thread = False
    live = False
    keeps_packets, packet_ring = False, None  # still pictures: no clips

    def __init__(self, folder: str, loop: bool = False, uri: str | None = None):
        self.folder, self.loop, self.uri = Path(folder), loop, uri or str(folder)
        self.files = sorted(p for p in self.folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not self.files:
            raise JetpipeError(f"source {folder}: no images in the folder")
        self.index, self.info, self.decode_errors = 0, None, 0
        self._first = self._next_image()  # the frames' size; at start-up, so a folder of bad images is one line
        if self._first is None:
            raise JetpipeError(f"source {folder}: none of its {len(self.files)} images could be decoded (OpenCV)")
        self.index = self.decode_errors = 0  # the reads count (and say) them again

    def describe(self) -> str:
        return str(self.folder)

    def open(self) -> FrameInfo:
        self.info = FrameInfo("bgr", self._first.shape[0] // 2 * 2, self._first.shape[1] // 2 * 2)
        return self.info

    def _next_image(self):
        """The next image that decodes (None at the folder's end); those that do not are counted and said."""
        while self.index < len(self.files):
            path = self.files[self.index]
            self.index += 1
            image = cv2.imread(str(path))
            if image is not None:
                return image
            self.decode_errors += 1
            if worth_logging(self.decode_errors):
                log.warning("source %s: cannot decode %s (#%d): skipped", self.folder, path.name, self.decode_errors)
        return None

    read_queued = read_whole  # the frame is in the slot when read_into returns
    tee_packets = not_teed  # its packets, where it keeps them, are demuxed in this process

    def read_into(self, slot: np.ndarray) -> None:
        image = self._next_image()
        if image is None and self.loop:
            self.index = 0
            image = self._next_image()
        if image is None:
            raise EndOfStream(str(self.folder))
        cv2.resize(image, (self.info.width, self.info.height), dst=slot)

    def interrupt(self) -> None:
        pass

    def restart(self) -> bool:
        """A folder has no connection to end."""
        return False

    def close(self) -> None:
        pass
