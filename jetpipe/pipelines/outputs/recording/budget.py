"""What the recording may have on disk: room is made before anything is written (the oldest segments go), so
that the folder never holds more than max_size and the file system keeps min_free, also while a segment is
being written.

The folder's bytes (as `du` counts them: whole blocks) are the closed segments' sizes (the index's sum, kept
here as a running total), the open segments' reservations (each GOP reserves what writing it may add, at most:
segments.reserve_for, before it is written) and the index's own files with room for them to grow until the next
look (INDEX_HEADROOM). Segments that hold no event go before those that do; an open segment never goes. Where
nothing is left to remove, the GOP is not written: the stream's recording has a gap (counted, said; serving
goes on).
"""

from __future__ import annotations

import logging
import shutil
import time

from jetpipe.errors import worth_logging
from jetpipe.pipelines.amounts import say_bytes
from jetpipe.pipelines.config import ConfigError
from jetpipe.pipelines.outputs.recording.segments import HEADER_BYTES

log = logging.getLogger(__name__)

INDEX_HEADROOM = 2_000_000  # the index's growth between looks (a write-ahead log of up to ~1 MB, new rows) and
#                             the stream and day folders' own blocks
BLOCK = 4096                # a file takes whole blocks on disk: what `du` counts, and what the budget counts


def on_disk(size: int) -> int:
    """A file's bytes as its whole blocks (du's count, not ls's)."""
    return -(-size // BLOCK) * BLOCK


class Budget:
    def __init__(self, index, max_bytes: int, min_free: int):
        """index: the recording's RecordIndex (the closed segments, the oldest to remove)."""
        self.index, self.max_bytes, self.min_free = index, max_bytes, min_free
        self.closed = index.closed_bytes(BLOCK)  # on disk: whole blocks
        self.reserved = 0    # the open segments' reservations
        self.removed = 0     # segments removed to make room
        self.refused = 0     # GOPs not written: no room could be made
        self.refused_at = 0.0  # when the last was (monotonic): /healthz says degraded for a while after

    def used(self) -> int:
        return self.closed + self.reserved + self.index.files_bytes() + INDEX_HEADROOM

    def reserve(self, nbytes: int) -> bool:
        """Room for nbytes more in an open segment, made by removing the oldest closed segments where needed;
        False (nothing reserved, counted) where it cannot be made."""
        while not self._fits(nbytes):
            victim = self.index.oldest(held=False) or self.index.oldest(held=True)
            if victim is None:
                self._refuse(nbytes)
                return False
            self.drop(victim)
            self.removed += 1
        self.reserved += nbytes
        return True

    def _fits(self, nbytes: int) -> bool:
        if self.used() + nbytes > self.max_bytes:
            return False
        return not self.min_free or shutil.disk_usage(self.index.folder).free - nbytes >= self.min_free

    def closed_segment(self, reserved: int, size: int) -> None:
        """A segment was closed: its reservation becomes its size (never more: reserve_for's bound)."""
        self.reserved -= reserved
        self.closed += on_disk(size)

    def released(self, reserved: int) -> None:
        """An open segment was given up (a write failed): its reservation goes; what it holds is counted by
        the caller as closed."""
        self.reserved -= reserved

    def drop(self, segment) -> None:
        self.index.drop(segment)
        self.closed -= on_disk(segment.bytes)

    def _refuse(self, nbytes: int) -> None:
        self.refused += 1
        self.refused_at = time.monotonic()
        if worth_logging(self.refused):
            free = shutil.disk_usage(self.index.folder).free
            log.warning("recording: no room for %s more (#%d): the folder holds %s of %s, %s free on its disk "
                        "(at least %s kept): this stretch is not recorded; serving goes on", say_bytes(nbytes),
                        self.refused, say_bytes(self.used()), say_bytes(self.max_bytes), say_bytes(free),
                        say_bytes(self.min_free))

    def degraded(self, within_s: float = 10.0) -> bool:
        return self.refused > 0 and time.monotonic() - self.refused_at < within_s


class Room:
    def __init__(self, config, max_bytes: int):
        """What the streams' open and newest segments need of the segments' share of the budget (max_bytes), at
        their bit rates. config: RecordConfig (checked)."""
        self.config, self.max_bytes = config, max_bytes
        self.planned = INDEX_HEADROOM

    def take(self, stream_id: int, bit_rate: float, at_start: bool) -> None:
        """Room for two of the stream's segments (one written, one kept); where the budget has not: one line
        (ConfigError) at start-up, a warning for a stream added later (it is recorded, its oldest segments going
        sooner)."""
        segment_s = self.config.segment_s
        need = 2 * (int(bit_rate / 8 * (segment_s + 2.0)) + HEADER_BYTES)
        if self.planned + need > self.max_bytes:
            max_size = self.config.max_size
            why = (f"record max_size = {say_bytes(max_size)} holds less than two {segment_s:g}-s segments of each "
                   f"stream at its bit rate ({say_bytes(self.planned + need)} with stream {stream_id}, beside "
                   f"{say_bytes(max_size - self.max_bytes)} for clips and snapshots): raise --record-max-size or "
                   "shorten segment_s")
            if at_start:
                raise ConfigError(why)
            log.warning("%s; it is recorded, its oldest segments going sooner", why)
        self.planned += need
