"""When a secondary stage is behind, live frames wait in the batcher, not in batches queued for it.

A batch's frames, once cut, cannot be shed: every batch cut while the secondary is still reading an
earlier one waits for it, and with a pipeline's buffer sets (up to five batches between the batcher and the
secondary's records) a camera's frames came out five secondary reads after capture: on the CPU runtime,
p50 5 s for the demo's two cameras at batch 8, though every frame had just been taken from its queue.

So the primary's next batch of live frames is cut only when it will not queue behind a batch already
waiting for the secondary: while the secondary reads, at most one cut batch is ahead of it (being run,
finished, or waiting in the handoff). Frames arriving meanwhile wait in the batcher, where the newest are
kept and those past the latency budget are shed, and the batch cut when the secondary takes the one ahead
holds the freshest frames. A secondary that keeps up is never waited for (nothing is ahead of it when it
reads), nor is a primary slower than it (the secondary is idle when the next batch is cut). Files (no live
frame) are never held: they keep every frame, and batches queued for the secondary keep it busy.
"""

from __future__ import annotations

import threading
import time


class ChainGate:
    """Counts the batches cut but not yet taken by the secondary thread, and whether it is reading."""

    def __init__(self):
        self._changed = threading.Condition()
        self.ahead = 0          # batches cut, not yet taken by the secondary thread (or failed before it)
        self.reading = False    # the secondary thread is reading crops
        self.live = False       # the last batch cut held a live frame (a camera, a --realtime file)
        self.held_s = 0.0       # seconds the primary waited for the secondary before cutting

    def wait_open(self, timeout: float) -> bool:
        """Whether the next batch may be cut now; waits up to `timeout` for the secondary to take the batch
        ahead of it."""
        with self._changed:
            if self._open():
                return True
            start = time.monotonic()
            opened = self._changed.wait_for(self._open, timeout)
            self.held_s += time.monotonic() - start
            return opened

    def _open(self) -> bool:
        return not (self.live and self.reading and self.ahead >= 1)

    def cut(self, live: bool) -> None:
        """A batch was cut (`live`: it holds a live frame)."""
        with self._changed:
            self.ahead += 1
            self.live = live

    def lost(self) -> None:
        """A cut batch failed before the secondary took it."""
        with self._changed:
            self.ahead -= 1
            self._changed.notify_all()

    def taken(self, batches: int) -> None:
        """The secondary thread took `batches` and reads their crops."""
        with self._changed:
            self.ahead -= batches
            self.reading = True
            self._changed.notify_all()

    def read(self) -> None:
        """The secondary thread is done with what it took."""
        with self._changed:
            self.reading = False
            self._changed.notify_all()
