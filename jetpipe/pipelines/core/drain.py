"""A stop's drain, bounded: what is queued when a stop comes (SIGTERM, --duration) is finished, for at most
stop_timeout_s; then the frames still queued and those waiting in the frame sinks (drawing, encoding) are
dropped, counted, and the run ends with its files finished and its summary written, inside the service manager's
own stop timeout (the shipped unit's TimeoutStopSec=30, after which systemd kills the whole group).
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class DrainBound:
    def __init__(self, seconds: float, batcher, sinks):
        """seconds: the drain's bound (0: none); batcher, sinks: what is dropped when it is reached."""
        self.seconds, self.batcher, self.sinks = seconds, batcher, sinks
        self.cut: dict | None = None  # the summary's drain_cut_short, once the bound was reached
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """A stop came: the drain has `seconds` from now (a later stop does not restart it)."""
        with self._lock:
            if self.seconds and self._timer is None:
                self._timer = threading.Timer(self.seconds, self._reached)
                self._timer.daemon = True
                self._timer.start()

    def cancel(self) -> None:
        """The run is through: nothing is dropped."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()

    def _reached(self) -> None:
        queued = self.batcher.abort()
        waiting = self.sinks.cut_short()
        self.cut = {"after_s": self.seconds, "queued_frames_dropped": queued, "sink_frames_dropped": waiting}
        log.warning("the drain reached stop_timeout_s = %g s: %d queued frame(s) and %d waiting in the frame sinks "
                    "dropped; finishing the batches in flight and the files", self.seconds, queued, waiting)
