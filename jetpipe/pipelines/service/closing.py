"""Closing what start-up opened: each closer, the last registered first (what was opened later may use what
was opened before it), one that fails said and the others still closed."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

log = logging.getLogger(__name__)


def close_in_reverse(closers: list) -> None:
    """Call each closer, the last first, and empty the list (a second close does nothing)."""
    for close in reversed(closers):
        try:
            close()
        except Exception as exc:
            log.warning("while closing: %s", exc)
    closers.clear()


def exit_if_left_behind(summary: dict, code: int) -> None:
    """Where the run left a stage behind (a batch the GPU never finished: drain.StageJoin), end the process now,
    its output flushed: the interpreter's own exit runs CUDA's and ONNX Runtime's teardown, which waits for the
    stuck batch (measured on an H100: the summary written, the process alive until killed)."""
    if summary.get("left_behind"):
        exit_now(code)


def exit_now(code: int) -> None:
    """End the process with `code` now, its log and output flushed, without the interpreter's shutdown (which
    joins what may never end: a thread blocked in a read, CUDA's teardown of a stuck batch)."""
    if threading.current_thread() is threading.main_thread():  # a late signal would raise into the flush's wait
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        _bounded(stream.flush, "flush")
    os._exit(code)


FLUSH_WAIT_S = 2.0


def write_bounded(stream, text: str) -> bool:
    """text written to stream and flushed, waited for at most FLUSH_WAIT_S: False where it did not return; the
    process must then end through exit_now, whose flush is bounded too."""
    def write() -> None:
        stream.write(text)
        stream.flush()

    return _bounded(write, "write")


def _bounded(work, name: str) -> bool:
    """work() in a thread of its own, waited for at most FLUSH_WAIT_S: whether it returned. A write or flush to a
    stream whose reader stopped reading does not, nor one waiting on the stream's lock, which a sink's write
    blocked on that reader holds."""
    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    thread.join(FLUSH_WAIT_S)
    return not thread.is_alive()
