"""A synthetic camera: rendered text panning over a textured background (tests, demo, benchmarks)."""

from __future__ import annotations

import time

import numpy as np

from jetpipe import uri as uris
from jetpipe.errors import JetpipeError
from jetpipe.frames import frame_shape, from_bgr
from jetpipe.pipelines.ingest.sources.base import FrameInfo, not_teed, read_whole
from jetpipe.synth import render_text_image


class SyntheticCamera:
    """Rendered text panning over a textured background, at a given size, rate and pixel format.

    One wide canvas is rendered and encoded once; frame t is a horizontal slice of
    it, so producing a frame is a copy into the ring slot: no per-frame allocation.
    """

    memory = "host"

    pan = 512  # pixels of canvas beyond the frame width; frames step PAN_STEP pixels
    decode_errors = 0
    shares_thread = True     # a read is a copy: a capture thread can serve several (pipelines.capture)
    keeps_packets, packet_ring = False, None  # no compressed stream: no clips
    paced_by_caller = False  # set by a shared capture thread: it waits for due_in(), read_into does not sleep

    def __init__(self, width=640, height=480, fps=30.0, fmt="nv12", seed=0, step=8, uri: str = "synthetic",
                 still: bool = False):
        """still: a ring slot that already holds a frame is sent again as it is (no copy: benchmarks that
        measure the pipeline, not the camera's memcpy)."""
        frame_shape(fmt, height, width)  # validates format and even sizes
        if fmt == "i420":  # planar chroma cannot be panned by slicing columns
            raise JetpipeError("synthetic sources produce nv12, yuyv, uyvy, bgr or rgb, not i420")

        self.uri = uri
        self.info = FrameInfo(fmt, height, width, fps=fps)
        self.fps, self.step = fps, step
        # paced (FPS > 0) it is a camera: behind, its oldest frame is dropped. Unpaced (@0) it has no clock to fall
        # behind: offered as fast as the pipeline takes frames, every frame processed, as a file is. Before, an
        # unpaced camera made frames only to have them dropped (the saturated benchmarks' capture work on frames
        # never processed: 10-95 % more frames than processed on an H100)
        self.live = fps > 0
        wide = render_text_image(seed, (height, width + self.pan), max_words=max(6, width // 80))
        self.boxes = np.array(wide.boxes, np.float64).reshape(-1, 4)
        self.canvas = from_bgr(wide.bgr, fmt)
        self.count = 0
        self._next = None
        self.still = still
        self._filled: set[int] = set()  # addresses of ring slots holding a frame (still mode)

    @classmethod
    def from_uri(cls, text: str, seed: int = 0) -> SyntheticCamera:
        uri = uris.parse(text)
        if uri.scheme != "synthetic":
            raise JetpipeError(f"source {text!r} is not a synthetic camera: write synthetic://WxH@FPS/FORMAT")
        width, height, fps, fmt = uris.synthetic_spec(uri)
        return cls(width, height, fps, fmt, seed=seed, uri=text, still=uris.synthetic_still(uri))

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

    def due_in(self) -> float:
        """Seconds until the next frame is due (<= 0: now)."""
        return self._next + 1.0 / self.fps - time.monotonic() if self.fps > 0 else 0.0

    read_queued = read_whole  # the frame is in the slot when read_into returns
    tee_packets = not_teed  # its packets, where it keeps them, are demuxed in this process

    def read_into(self, slot: np.ndarray) -> float | None:
        if self.fps > 0:  # pace like a camera
            self._next += 1.0 / self.fps
            delay = self._next - time.monotonic()
            if self.paced_by_caller:  # read once due: late by less than a frame keeps the pace, more starts anew
                if delay < -1.0 / self.fps:
                    self._next = time.monotonic()
            elif delay > 0:
                time.sleep(delay)
            else:
                self._next = time.monotonic()
        if not (self.still and slot.ctypes.data in self._filled):
            self._render(slot, self.offset(self.count))
        if self.still:
            self._filled.add(slot.ctypes.data)
        self.count += 1
        return (self.count - 1) / self.fps if self.fps > 0 else None

    def _render(self, slot: np.ndarray, x: int) -> None:
        width = self.info.width
        if self.info.format in ("yuyv", "uyvy"):
            slot[:] = self.canvas[:, 2 * x:2 * (x + width)]
        else:
            slot[:] = self.canvas[:, x:x + width]

    def interrupt(self) -> None:
        pass

    def restart(self) -> bool:
        """A rendered camera has no connection to end."""
        return False

    def close(self) -> None:
        pass
