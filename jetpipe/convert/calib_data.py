"""Calibration data: image folders, video files, .npy input tensors, rendered text.

Every source yields float32 NCHW batches one at a time (bounded memory) and has
a fingerprint that changes when the data, its selection or its preprocessing
does, so stored calibration results are only reused for the same data.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from jetpipe import uri as uris
from jetpipe.bundle import sha256_file
from jetpipe.errors import CalibrationError
from jetpipe.lazy import lazy_import
from jetpipe.preprocess import preprocess_bgr
from jetpipe.spec import PreprocessSpec
from jetpipe.synth import is_line_shaped, render_text_image, render_text_line, several_fonts

cv2 = lazy_import("cv2")

log = logging.getLogger(__name__)

VIDEO_SUFFIXES = {".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg"}
SYNTHETIC = "synthetic"


class CalibrationSource:
    """Base: subclasses yield BGR frames or ready tensors; this batches and counts."""

    skipped = 0  # unreadable items, counted and reported

    def __init__(self, size_hw: tuple[int, int], spec: PreprocessSpec, limit: int):
        self.size_hw, self.spec, self.limit = size_hw, spec, limit

    def __len__(self) -> int:
        raise NotImplementedError

    def frames(self) -> Iterator[np.ndarray]:
        raise NotImplementedError

    def identity(self) -> str:
        raise NotImplementedError

    def fingerprint(self) -> str:
        h = hashlib.sha256(self.identity().encode())
        h.update(repr((self.size_hw, self.spec.to_dict(), self.limit)).encode())
        return h.hexdigest()

    def held_out_frames(self, count: int) -> Iterator[np.ndarray]:
        """Up to `count` frames of the same data that calibration does not see (none where it has no more)."""
        return iter(())

    def held_out(self, count: int) -> tuple[np.ndarray | None, bool]:
        """(samples for the accuracy check, whether calibration never saw them): held-out samples where the
        data has more than calibration takes, else the first `count` calibration samples (read once more:
        only those, not the whole set)."""
        held = [preprocess_bgr(frame, self.size_hw, self.spec)[0] for frame in self.held_out_frames(count)]
        if held:
            return np.stack(held), True
        first = next(self.batches(max(1, count)), None)
        return first, False

    def batches(self, batch_size: int) -> Iterator[np.ndarray]:
        """Batches the caller owns: each is a new array, never overwritten by the next (calibrate accuracy
        keeps them all; a reused buffer had every kept batch show the last images). One batch of memory at a
        time while the caller drops them, as the streaming statistics do."""
        buffer, filled = None, 0
        for frame in self.frames():
            if buffer is None:
                buffer = np.empty((batch_size, self.spec.channels, *self.size_hw), np.float32)
            preprocess_bgr(frame, self.size_hw, self.spec, out=buffer[filled])
            filled += 1
            if filled == batch_size:
                yield buffer
                buffer, filled = None, 0
        if filled:
            yield buffer[:filled]


class ImageFolder(CalibrationSource):
    def __init__(self, folder: Path, size_hw, spec, limit):
        super().__init__(size_hw, spec, limit)
        files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in uris.IMAGE_SUFFIXES)
        if not files:
            raise CalibrationError(
                f"calibration folder {folder} holds no images ({', '.join(sorted(uris.IMAGE_SUFFIXES))}); "
                "point --calib at a folder of images, a video or a .npy file"
            )
        self.folder, self.files, self.unused = folder, files[:limit], files[limit:]
        self._warned: set[Path] = set()  # several passes read the folder: say each unreadable file once

    def __len__(self):
        return len(self.files)

    def held_out_frames(self, count):
        for path in self.unused[:count]:
            image = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if image is not None:
                yield image

    def frames(self):
        self.skipped = 0
        for path in self.files:
            image = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if image is None:
                self.skipped += 1
                if path not in self._warned:
                    self._warned.add(path)
                    log.warning("skipping unreadable calibration image %s", path)
                continue
            yield image
        if self.skipped == len(self.files):
            raise CalibrationError(
                f"none of the {len(self.files)} images in {self.folder} could be read: "
                "are they valid image files?"
            )

    def identity(self):
        h = hashlib.sha256()
        for path in self.files:
            h.update(str(path.relative_to(self.folder)).encode())
            h.update(hashlib.sha256(path.read_bytes()).digest())
        return "images:" + h.hexdigest()


class VideoFile(CalibrationSource):
    """Up to `limit` frames spread evenly over the video."""

    def __init__(self, path: Path, size_hw, spec, limit):
        super().__init__(size_hw, spec, limit)
        capture = cv2.VideoCapture(str(path))
        count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) if capture.isOpened() else 0
        capture.release()
        if count <= 0:
            raise CalibrationError(f"cannot read video {path}: is it a video OpenCV can decode?")
        self.path, self.count = path, count
        self.picks = _spread(list(range(count)), limit)

    def __len__(self):
        return len(self.picks)

    def held_out_frames(self, count):
        """Frames between the calibration picks (videos shorter than the picks have none)."""
        yield from self._read(_spread([i for i in range(self.count) if i not in self.picks], count))

    def frames(self):
        yield from self._read(self.picks, count_skipped=True)

    def _read(self, indices: set[int], count_skipped: bool = False):
        """The frames at `indices`, decoding from the start; count_skipped: those past the video's real end
        (its header promised more) count as skipped."""
        if not indices:
            return
        capture = cv2.VideoCapture(str(self.path))
        try:
            for index in range(max(indices) + 1):
                ok, frame = capture.read()
                if not ok:
                    if count_skipped:
                        self.skipped += sum(1 for p in indices if p >= index)
                    return
                if index in indices:
                    yield frame
        finally:
            capture.release()

    def identity(self):
        return "video:" + sha256_file(self.path)


def _spread(items: list[int], count: int) -> set[int]:
    """Up to `count` of `items`, spread evenly over them."""
    if not items:
        return set()
    return {items[i] for i in np.linspace(0, len(items) - 1, min(count, len(items))).astype(int)}


class NpyTensors(CalibrationSource):
    """Ready network inputs (N,C,H,W float32), memory-mapped and used as they are."""

    def __init__(self, path: Path, input_shape: tuple, size_hw, spec, limit):
        super().__init__(size_hw, spec, limit)
        try:
            self.array = np.load(path, mmap_mode="r")
        except Exception as exc:
            raise CalibrationError(f"cannot read {path} as a .npy array: {exc}") from exc
        expected = (input_shape[1], *size_hw)
        if self.array.dtype != np.float32 or self.array.ndim != 4 or self.array.shape[1:] != expected:
            raise CalibrationError(
                f"{path} holds {self.array.dtype} {list(self.array.shape)}; the model needs "
                f"float32 [N, {', '.join(map(str, expected))}]"
            )
        if len(self.array) == 0:
            raise CalibrationError(f"{path} holds no samples")
        self.path = path

    def __len__(self):
        return min(len(self.array), self.limit)

    def batches(self, batch_size):
        for start in range(0, len(self), batch_size):
            yield self._finite(np.ascontiguousarray(self.array[start:min(start + batch_size, len(self))]), start)

    def held_out(self, count):
        rest = self.array[len(self):len(self) + count]
        if len(rest):
            return self._finite(np.ascontiguousarray(rest), len(self)), True
        first = max(0, len(self) - count)
        return self._finite(np.ascontiguousarray(self.array[first:len(self)]), first), False

    def _finite(self, batch: np.ndarray, first: int) -> np.ndarray:
        """NaN or infinite inputs give meaningless ranges (a 0.0 input range, NaN errors): refused, named."""
        bad = ~np.isfinite(batch).reshape(len(batch), -1).all(axis=1)
        if bad.any():
            raise CalibrationError(f"{self.path}: sample {first + int(np.argmax(bad))} holds NaN or infinite "
                                   "values: calibration needs finite network inputs")
        return batch

    def identity(self):
        return "npy:" + sha256_file(self.path)


class SyntheticText(CalibrationSource):
    """Rendered-text images made on the fly: the embedded default data. Scene text (words anywhere on a
    textured background, what a text detector sees); for a line-shaped input (a recognizer's), text-line
    crops instead, each in one of several typefaces (calibrated on Pillow's one font, PP-OCRv4 rec in INT8
    lost 7.5 points of word recall on tilted lines in other fonts, docs/lab/benchmarks.md)."""

    seed = 10_000  # tests and accuracy checks use seeds below this: no overlap

    def __init__(self, size_hw, spec, limit):
        super().__init__(size_hw, spec, limit)
        self.lines = is_line_shaped(size_hw)
        self.fonts = several_fonts() if self.lines else None  # found once, not at every line rendered

    def __len__(self):
        return self.limit

    def _render(self, seed: int) -> np.ndarray:
        if self.lines:
            return render_text_line(seed, self.size_hw, fonts=self.fonts).bgr
        return render_text_image(seed, self.size_hw).bgr

    def frames(self):
        for i in range(self.limit):
            yield self._render(self.seed + i)

    def held_out_frames(self, count):
        for i in range(count):  # the images after the calibration set's: never calibrated on
            yield self._render(self.seed + self.limit + i)

    def identity(self):
        return f"synthetic-{'lines-fonts' if self.lines else 'text'}:{self.seed}"

    def describe(self) -> str:
        return "text lines" if self.lines else "scene text"


def open_source(spec_text: str, input_shape: tuple, size_hw, spec: PreprocessSpec,
                limit: int) -> CalibrationSource:
    """--calib PATH -> a source; 'synthetic' selects rendered text images."""
    if limit <= 0:
        raise CalibrationError(f"--calib-size {limit} must be at least 1")
    uri = uris.parse(spec_text)
    if uri.scheme == "synthetic" and not uri.location:
        return SyntheticText(size_hw, spec, limit)
    if uri.scheme != "file":
        raise CalibrationError(f"--calib {spec_text}: calibration data is a folder of images, a video file, "
                               "a .npy file or 'synthetic' (rendered text images), not a live source")
    path = uri.path
    if not path.exists():
        raise CalibrationError(f"calibration data {path} not found: pass a folder, video or .npy file")
    if path.is_dir():
        return ImageFolder(path, size_hw, spec, limit)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return NpyTensors(path, input_shape, size_hw, spec, limit)
    if suffix in VIDEO_SUFFIXES:
        return VideoFile(path, size_hw, spec, limit)
    raise CalibrationError(
        f"--calib {path}: unsupported file type {suffix!r}; use an image folder, "
        f"a video ({', '.join(sorted(VIDEO_SUFFIXES))}), a .npy file, or 'synthetic'"
    )
