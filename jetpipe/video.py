"""What a video source delivers and how it ends; shared by the pipelines' sources and the runtime's
hardware decoder (which lives in the CUDA layer, below the pipelines)."""

from __future__ import annotations

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


def file_bit_rate(location: str) -> float:
    """Bits a second of a video file as its container says (a clips ring's size); 0.0 where it does not."""
    try:
        import av

        with av.open(location) as container:
            return float(container.bit_rate or 0)
    except Exception:  # not a file PyAV opens, or no PyAV: the ring is sized by its bound alone
        return 0.0
