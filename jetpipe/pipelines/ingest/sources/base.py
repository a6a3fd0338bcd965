"""What every source is: opened, read into ring slots in its native pixel format, interrupted, closed."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from jetpipe.video import EndOfStream, FrameInfo, SourceError

__all__ = ["EndOfStream", "FrameInfo", "Source", "SourceError", "not_teed", "read_whole"]


class Source(Protocol):
    uri: str           # as the user wrote it (JSONL records carry it)
    memory: str        # "host": writes numpy ring slots; "device": writes DeviceSlots (a hardware decoder)
    live: bool         # drop-oldest when behind (cameras, network); files deliver every frame
    info: FrameInfo | None  # known before open() where the source can tell (files); sizes the ring
    decode_errors: int
    shares_thread: bool  # its reads never block for long: a shared capture thread reads it (pipelines.capture)
    # clips around events (pipelines/outputs/clips): whether it can give its compressed packets as its demuxer read them
    # (not where its frames come decoded: a camera's raw frames, OpenCV's reads), and the ring they go to once
    # the clips writer set one (None: not kept)
    keeps_packets: bool
    packet_ring: object | None
    bit_rate: float  # where it keeps packets: bits a second where its container says (0: not said)

    def describe(self) -> str: ...

    def open(self) -> FrameInfo: ...

    def read_into(self, slot: np.ndarray) -> float | None:
        """Write the next frame into `slot` (a view of this format and size); return its time in seconds."""

    def read_queued(self, slot) -> tuple[float | None, object | None]:
        """read_into, where the source may leave its copy into a device slot queued on the GPU: (its time, an
        event the frame's readers on the GPU wait for; None: the frame is in the slot now). read_whole for a
        source that writes the whole frame before it returns."""

    def tee_packets(self, tee) -> bool:
        """Where the stream's packets pass through a process of its own (an NVDEC network stream's remux ffmpeg),
        have it write them also to the pipe `tee` opens at each connection, which another process (the
        recording's) reads: this process never touches them. False where it cannot (they are demuxed here, or a
        connection was started already): they come through packet_ring then. not_teed for such a source."""

    def interrupt(self) -> None:
        """Unblock a read or open in progress (called from another thread when stopping)."""

    def restart(self) -> bool:
        """End the connection of a live stream that stalled, so that capture opens it again (the read in
        progress fails); False where this source has no connection to end."""

    def close(self) -> None: ...


def read_whole(source, slot) -> tuple[float | None, None]:
    """Source.read_queued of a source whose read_into writes the whole frame into the slot."""
    return source.read_into(slot), None


def not_teed(source, tee) -> bool:
    """Source.tee_packets of a source whose packets are demuxed in this process (or not at all)."""
    return False
