"""Frame rings: preallocated slots that sources write into and the runtime reads in place.

A slot is free, being written by its source, queued, or in a batch on the GPU;
it returns to the free list when the batch that used it is collected (or the
frame is dropped). Nothing is allocated per frame.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.frames import frame_shape
from jetpipe.runtime.api import Frame


@dataclass(frozen=True)
class DeviceSlot:
    """A ring slot in device memory (a hardware decoder writes it; the kernel reads it in place)."""

    address: int
    nbytes: int
    format: str
    height: int
    width: int


def slot_bytes(hw: tuple[int, int], device: bool, fmt: str | None = None) -> int:
    """A slot's bytes for frames up to hw: what the decoders write there. fmt: the source's format where it is
    known before the ring is made (a file, probed; NV12 is half of BGR); otherwise a device ring takes NVDEC's
    NV12 or its FFmpeg fallback's YUV (4:2:2 packed at most: 2 bytes a pixel), a host ring any format (BGR: 3)."""
    if fmt is not None:
        return int(np.prod(frame_shape(fmt, *hw)))
    return hw[0] * hw[1] * (2 if device else 3)


class FrameRing:
    def __init__(self, buffers: list, addresses: list[int | None], pinned: bool, device: bool = False,
                 slot_bytes: int | None = None):
        """buffers: host arrays, or (device=True) device allocations of slot_bytes whose addresses are given."""
        self.buffers, self.addresses, self.pinned, self.device = buffers, addresses, pinned, device
        self.slot_bytes = slot_bytes if slot_bytes is not None else min(b.nbytes for b in buffers)
        self._free = list(range(len(buffers)))
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.buffers)

    def acquire(self) -> int | None:
        with self._lock:
            return self._free.pop() if self._free else None

    def release(self, slot: int) -> None:
        with self._lock:
            self._free.append(slot)

    def free_slots(self) -> int:
        with self._lock:
            return len(self._free)

    def view(self, slot: int, fmt: str, height: int, width: int):
        """Where a source writes this slot's frame: the bytes as a frame array (no copy), or a DeviceSlot."""
        shape = frame_shape(fmt, height, width)
        nbytes = int(np.prod(shape))
        if nbytes > self.slot_bytes:  # a stream larger than it said, or than the ring was sized for
            raise JetpipeError(f"a {width}x{height} {fmt} frame does not fit the ring slot of {self.slot_bytes} "
                               "bytes: raise max_frame_hw (pipeline config) to the stream's size")
        if self.device:
            return DeviceSlot(self.addresses[slot], nbytes, fmt, height, width)
        return self.buffers[slot][:nbytes].reshape(shape)

    def frame(self, slot: int, fmt: str, height: int, width: int, standard="bt601", value_range="limited"):
        if self.device:
            return Frame(None, fmt, standard, value_range, address=self.addresses[slot], device=True,
                         hw=(height, width))
        return Frame(self.view(slot, fmt, height, width), fmt, standard, value_range,
                     address=self.addresses[slot], pinned=self.pinned)


def host_ring(count: int, slot_bytes: int) -> FrameRing:
    """Plain numpy slots (the CPU runtime)."""
    return FrameRing([np.empty(slot_bytes, np.uint8) for _ in range(count)], [None] * count, pinned=False)
