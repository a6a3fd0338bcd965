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
