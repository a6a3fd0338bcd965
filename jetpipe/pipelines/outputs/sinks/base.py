"""What every sink is, as sources/base.py says what every source is.

A sink takes the pipeline's records (`write`, from the fan-out's writer thread) and, where `takes_frames`,
the frames they describe too (`offer`, from the post stage, before the frame's ring slot is released). A sink
that fails is counted (`fail`: its `failures`, the one count the summary reports) and logged now and then;
the pipeline and the other sinks go on. `dropped`: frames it let go while busy (frame sinks only).
"""

from __future__ import annotations

import importlib
import logging
from typing import Protocol
from urllib.parse import parse_qs, urlparse

from jetpipe.errors import JetpipeError, worth_logging

log = logging.getLogger(__name__)


class Sink(Protocol):
    takes_frames: bool  # offer() is called with every frame before write() gets its record
    failures: int
    dropped: int

    def describe(self) -> str: ...

    def write(self, record) -> None:
        """A record (record.FrameRecord: its json() is the line to write)."""

    def fail(self, exc: Exception) -> None:
        """Count one failure of this sink (a write that raised, a frame it could not draw or encode)."""

    def end_stream(self, stream: int) -> None:
        """Stream `stream` was removed: its output ends (a video file's trailer)."""

    def close(self) -> None: ...


class FrameTaker(Sink, Protocol):
    def offer(self, stream: int, frame, record, to_host=None, wait: bool = False) -> bool:
        """Take a copy of the frame (YUV as it sits in the ring) for drawing; False when it was not taken."""

    def cut_short(self) -> int:
        """A bounded drain ran out: drop the frames still waiting to be drawn (counted in `dropped`); how many."""


class SinkBase:
    """The counting every sink shares."""

    takes_frames = False
    failures = 0
    dropped = 0

    def describe(self) -> str:
        raise NotImplementedError

    def fail(self, exc: Exception) -> None:
        self.failures += 1
        if worth_logging(self.failures):
            log.error("sink %s failed %d time(s): %s", self.describe(), self.failures, exc)

    def end_stream(self, stream: int) -> None:
        """Records sinks have nothing to end per stream."""


def client_module(name: str, scheme: str, package: str, extra: str):
    """A broker client's module (an optional dependency), imported when a sink of its scheme opens."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise JetpipeError(f"sink {scheme}:// needs {package}: pip install 'jetpipe[{extra}]'") from None


def port_of(parsed, shown: str, default: int | None = None) -> int | None:
    """A sink URI's port (`default` where it names none); one that is no port is a mistake."""
    try:
        port = parsed.port
    except ValueError:
        port = 0
    if port == 0:  # ':0' was taken as no port at all: the default, silently
        raise JetpipeError(f"sink {shown}: the port is not a number from 1 to 65535")
    return default if port is None else port


def sink_options(spec: str, known: tuple[str, ...]) -> tuple[str, dict[str, str]]:
    """(path, ?options) of a `SCHEME:PATH?KEY=VALUE` sink; an option it does not know is a mistake (a typo was
    silently ignored), and so is one left empty (`?width=`)."""
    path = spec.split("?", 1)[0].split(":", 1)[1]
    options = {k: v[-1] for k, v in parse_qs(urlparse(spec).query, keep_blank_values=True).items()}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise JetpipeError(f"sink {spec}: unknown option {unknown[0]!r}; this sink takes {', '.join(known)}")
    return path, options
