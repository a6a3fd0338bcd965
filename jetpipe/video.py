"""What a video source delivers and how it ends; shared by the pipelines' sources and the runtime's
hardware decoder (which lives in the CUDA layer, below the pipelines)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from jetpipe.errors import JetpipeError


class SourceError(JetpipeError):
    """A source cannot open or read; the worker reconnects with backoff."""


class EndOfStream(Exception):
    """A finite source is exhausted (and does not loop)."""


@dataclass(frozen=True)
class FrameInfo:
    """What a source delivers: pixel format and size, and how its YUV is to be read."""

    format: str
    height: int
    width: int
    standard: str = "bt601"
    range: str = "limited"
    fps: float = 0.0


@dataclass(slots=True)
class Packet:
    """A compressed video packet as a demuxer gave it (what a clip is made of: pipelines/outputs/clips)."""
    t: float          # its pts in seconds, the frames' clock
    data: bytes
    pts: int | None   # in the stream's time base
    dts: int | None
    duration: int
    key: bool


SAMPLE_BITS = 3  # one packet in 2**3, drawn at random, is timed on its thread's CPU clock (KeepClock)
SAMPLE_EVERY = 1 << SAMPLE_BITS


class KeepClock:
    """What a source's thread spends keeping packets (a clips ring's, or a decode process's batch): cpu_s."""

    cpu_s: float

    def clock(self) -> float | None:
        """Where a source starts keeping a packet: its thread's CPU time, for one packet in SAMPLE_EVERY drawn at
        random (a thread-clock read is a system call, 0.3-1 us: a fifth of what keeping a packet costs;
        perf_counter counted the waits for the GIL too; every 8th packet would be the same places of each GOP
        where a GOP is 8k or 30 long, its keyframe counted twice or never), else None."""
        return time.thread_time() if not random.getrandbits(SAMPLE_BITS) else None

    def clocked(self, started: float | None) -> None:
        """Where it is done (started: clock()'s): the sample counted for the SAMPLE_EVERY packets it stands for."""
        if started is not None:
            self.cpu_s += SAMPLE_EVERY * (time.thread_time() - started)


def file_bit_rate(location: str) -> float:
    """Bits a second of a video file as its container says (a clips ring's size); 0.0 where it does not."""
    try:
        import av

        with av.open(location) as container:
            return float(container.bit_rate or 0)
    except Exception:  # not a file PyAV opens, or no PyAV: the ring is sized by its bound alone
        return 0.0
