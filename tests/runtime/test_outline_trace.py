"""The GPU's outline tracing (jetpipe/runtime/outline.cuh) built with the host's C++ compiler and compared with
what the CPU path gets from OpenCV (segmentation_yolo.trace_outlines: findContours RETR_EXTERNAL +
CHAIN_APPROX_SIMPLE, the largest contour, approxPolyDP): point for point, on masks made to be hard (noise,
holes, components inside holes, one-pixel lines, touching the edges). The kernel runs the same code on the
device (tests/runtime/test_postprocess_gpu.py)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

from jetpipe.tasks.segmentation_yolo import OUTLINE_TOLERANCE, segment_distance, trace_outlines  # noqa: E402

HARNESS = Path(__file__).with_name("outline_harness.cpp")
HEADERS = Path(__file__).parents[2] / "jetpipe" / "runtime"


@pytest.fixture(scope="module")
def outline_lib(tmp_path_factory):
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler (g++): the outline tracing is compared with OpenCV by building it for the host")
    library = tmp_path_factory.mktemp("outline") / "liboutline.so"
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-x", "c++", f"-I{HEADERS}", str(HARNESS), "-o",
                    str(library)], check=True, capture_output=True)
    lib = ctypes.CDLL(str(library))
    lib.outline_of.restype = lib.simplified.restype = ctypes.c_int
    return lib


def _pointer(array: np.ndarray):
    return array.ctypes.data_as(ctypes.c_void_p)


def device_outline(lib, mask: np.ndarray, tolerance: float, room: int | None = None) -> np.ndarray:
    """The outline the kernel's code gives for a 0 / 1 mask, bit-packed as seg_masks packs it; `room`: the points
    a chain keeps while the scan runs (the kernel's 2 (w + h) + 64; fewer: the largest traced again)."""
    height, width = mask.shape
    padded = np.zeros((height, (width + 31) // 32 * 32), np.uint8)
    padded[:, :width] = mask
    words = np.ascontiguousarray(np.packbits(padded, axis=1, bitorder="little").view(np.uint32))
    out, area2 = np.zeros(2 * (4 * mask.size + 8), np.int32), ctypes.c_longlong(0)
    room = 2 * (width + height) + 64 if room is None else room
    count = lib.outline_of(_pointer(words), width, height, ctypes.c_double(tolerance), int(segment_distance()),
                           room, _pointer(out), ctypes.byref(area2))
    return out[:2 * count].reshape(-1, 2)


def hard_masks(seed: int, count: int):
    """Masks of 1..80 pixels a side: noise, ellipses with holes and blobs in the holes, blocky shapes, lines."""
    rng = np.random.default_rng(seed)
    for trial in range(count):
        height, width = (int(v) for v in rng.integers(1, 80, 2))
        mask = np.zeros((height, width), np.uint8)
        kind = trial % 4
        if kind == 0:
            mask[:] = rng.random((height, width)) < rng.random()
        elif kind == 1:
            for value, size, shapes in ((1, 30, 4), (0, 12, 3), (1, 4, 3)):  # objects, holes, islands in holes
                for _ in range(int(rng.integers(1, shapes + 1))):
                    centre = (int(rng.integers(0, width)), int(rng.integers(0, height)))
                    axes = (int(rng.integers(1, size)), int(rng.integers(1, size)))
                    cv2.ellipse(mask, centre, axes, float(rng.integers(0, 180)), 0, 360, value, -1)
        elif kind == 2:
            blocks = (rng.random((max(1, height // 4), max(1, width // 4))) < 0.5).astype(np.uint8)
            mask = cv2.resize(blocks, (width, height), interpolation=cv2.INTER_NEAREST)
        else:
            for _ in range(int(rng.integers(1, 6))):
                a, b = (tuple(int(v) for v in rng.integers(0, 80, 2)) for _ in range(2))
                cv2.line(mask, a, b, 1, int(rng.integers(1, 3)))
        yield mask


@pytest.mark.parametrize("tolerance, room", [(0.0, None), (OUTLINE_TOLERANCE, None), (1.5, None),
                                             (OUTLINE_TOLERANCE, 6)])
def test_device_outlines_are_opencvs_point_for_point(outline_lib, tolerance, room):
    """1,200 masks at each tolerance: the kernel's code and the CPU path give the same points in the same order,
    also where the largest border's chain did not fit the scan's room and was traced again."""
    differing = []
    for index, mask in enumerate(hard_masks(11, 1200)):
        (expected,), _ = trace_outlines([(mask, 0, 0)], tolerance)
        got = device_outline(outline_lib, mask, tolerance, room)
        if got.shape != expected.shape or (got != expected).any():
            differing.append(index)
    assert differing == []


def test_the_largest_of_equals_is_the_one_python_max_takes(outline_lib):
    """Two to four copies of one shape side by side (equal areas and points): the CPU path takes the first of
    OpenCV's list, the last found in the scan; so does the device."""
    shape = np.zeros((9, 7), np.uint8)
    cv2.ellipse(shape, (3, 4), (3, 4), 0, 0, 360, 1, -1)
    for copies in (2, 3, 4):
        mask = np.hstack([np.pad(shape, ((0, 0), (0, 2)))] * copies)
        mask = np.vstack([mask, np.roll(mask, 3, axis=1)])
        (expected,), _ = trace_outlines([(mask, 0, 0)], 0.0)
        np.testing.assert_array_equal(device_outline(outline_lib, mask, 0.0), expected)


def test_simplification_is_approxpolydp_on_any_closed_polyline(outline_lib):
    """Random closed polylines (repeated points, collinear runs, back-and-forth) at several tolerances: the
    kernel's Douglas-Peucker keeps OpenCV's points, by the distance rule of the OpenCV installed here."""
    rng = np.random.default_rng(5)
    for _ in range(3000):
        points = rng.integers(0, int(rng.integers(2, 40)), (int(rng.integers(1, 30)), 2)).astype(np.int32)
        tolerance = float(rng.choice([0.25, 0.5, 1.0, 2.0, 7.5]))
        out = np.zeros_like(points)
        count = outline_lib.simplified(_pointer(points), len(points), ctypes.c_double(tolerance),
                                       int(segment_distance()), _pointer(out))
        expected = cv2.approxPolyDP(points.reshape(-1, 1, 2), tolerance, True).reshape(-1, 2)
        np.testing.assert_array_equal(out[:count], expected)
