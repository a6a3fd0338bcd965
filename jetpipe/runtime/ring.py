"""Frame rings: preallocated slots that sources write into and the runtime reads in place.

A slot is free, being written by its source, queued, or in a batch on the GPU;
it returns to the free list when the batch that used it is collected (or the
frame is dropped). Nothing is allocated per frame.

A stream's own ring holds what only it can fill (its queue, the frame being written, a spare); the frames its
batches hold while on the GPU and in postprocessing may come from a pool that the rings of streams of one
frame size share (share()): those are bounded by the batches in flight, not by the streams. 64 x 1080p
streams at batch 32: 6 own slots a stream + 128 shared instead of 22 a stream (1.6 instead of 4.4 GB).
"""

from __future__ import annotations

import math
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
        self.pool: FrameRing | None = None  # slots shared with other streams' rings, taken when all own are used
        self._borrowed = 0

    def __len__(self) -> int:
        return len(self.buffers)

    def share(self, pool: FrameRing) -> None:
        """Take slots from `pool` (a ring of the same slot size and memory) when every own slot is in use:
        its slot n is this ring's slot len(self) + n."""
        if pool.device != self.device or pool.slot_bytes < self.slot_bytes:
            raise JetpipeError("a shared pool of frame slots must be of the ring's memory and at least its size")
        self.pool = pool

    def acquire(self) -> int | None:
        with self._lock:
            if self._free:
                return self._free.pop()
            borrowed = self.pool.acquire() if self.pool is not None else None
            if borrowed is None:
                return None
            self._borrowed += 1
            return len(self.buffers) + borrowed

    def release(self, slot: int) -> None:
        if slot >= len(self.buffers):
            self.pool.release(slot - len(self.buffers))
            with self._lock:
                self._borrowed -= 1
            return
        with self._lock:
            self._free.append(slot)

    def free_slots(self) -> int:
        """Own slots free (a pool's are counted by the pool)."""
        with self._lock:
            return len(self._free)

    def in_use(self) -> int:
        """Slots this ring's stream holds: own and borrowed from its pool."""
        with self._lock:
            return len(self.buffers) - len(self._free) + self._borrowed

    def view(self, slot: int, fmt: str, height: int, width: int):
        """Where a source writes this slot's frame: the bytes as a frame array (no copy), or a DeviceSlot."""
        if slot >= len(self.buffers):
            return self.pool.view(slot - len(self.buffers), fmt, height, width)
        shape = frame_shape(fmt, height, width)
        nbytes = math.prod(shape)  # np.prod: 4 us, twice a frame
        if nbytes > self.slot_bytes:  # a stream larger than it said, or than the ring was sized for
            raise JetpipeError(f"a {width}x{height} {fmt} frame does not fit the ring slot of {self.slot_bytes} "
                               "bytes: raise max_frame_hw (pipeline config) to the stream's size")
        if self.device:
            return DeviceSlot(self.addresses[slot], nbytes, fmt, height, width)
        return self.buffers[slot][:nbytes].reshape(shape)

    def frame(self, slot: int, fmt: str, height: int, width: int, standard="bt601", value_range="limited"):
        if slot >= len(self.buffers):
            return self.pool.frame(slot - len(self.buffers), fmt, height, width, standard, value_range)
        if self.device:
            return Frame(None, fmt, standard, value_range, address=self.addresses[slot], device=True,
                         hw=(height, width))
        return Frame(self.view(slot, fmt, height, width), fmt, standard, value_range,
                     address=self.addresses[slot], pinned=self.pinned)


def host_ring(count: int, slot_bytes: int) -> FrameRing:
    """Plain numpy slots (the CPU runtime)."""
    return FrameRing([np.empty(slot_bytes, np.uint8) for _ in range(count)], [None] * count, pinned=False)


def frame_ring(runtime, count: int, max_hw: tuple[int, int], device: bool = False, fmt: str | None = None):
    """Slots for `count` frames up to max_hw of one source, allocated now for the runtime that reads them:
    sized for `fmt` where the source's format is known, else for BGR. The CPU runtime: plain arrays. The GPU
    runtime: pinned (mapped in its 'mapped' mode: the kernel reads them with no copy), or with device=True slots
    in device memory for a hardware decoder, read in place by the kernel."""
    nbytes = slot_bytes(max_hw, device, fmt)
    gpu = runtime.device
    if gpu is None:
        if device:
            raise JetpipeError("device-memory frame rings need the GPU runtime")
        return host_ring(count, nbytes)
    with gpu.active():
        if device:
            allocations = [gpu.alloc(nbytes) for _ in range(count)]
            return FrameRing(allocations, [int(a) for a in allocations], pinned=False, device=True, slot_bytes=nbytes)
        mapped = runtime.memory == "mapped"
        arrays = [gpu.pinned((nbytes,), np.uint8, mapped=mapped) for _ in range(count)]
    addresses = [gpu.device_pointer(a) if mapped else None for a in arrays]
    return FrameRing(arrays, addresses, pinned=True)
