"""What the decode processes' links (pipelines.decode_procs) ask of the serving process for a stream: the
capture loop's part (pipelines.capture), for frames a decode process wrote into the stream's ring slots."""

from __future__ import annotations

import logging

from jetpipe.pipelines.ingest.decode_procs import LIVE_CREDITS

log = logging.getLogger(__name__)


class DecodedElsewhere:
    def __init__(self, capture):
        """capture: the serving process's Capture (its batcher, rings, counters, free slots and queueing)."""
        self.capture = capture

    def credits_wanted(self, handle, held: int) -> int:
        """Slots to hand the process now: a live stream one being decoded and the next (its oldest queued
        frame is dropped for a slot when behind); a file as many as its queue has room for."""
        if handle.source.live:
            return max(0, LIVE_CREDITS - held)
        batcher = self.capture.batcher
        return max(0, batcher.depth - len(batcher.queues[handle.slot]) - held)

    def acquire(self, handle) -> int | None:
        return self.capture.free_slot(handle.slot, handle.source.live)

    def slot_address(self, handle, slot: int) -> int:
        """The slot's device allocation (its base address: a device ring allocates each slot on its own)."""
        info = handle.source.info
        return self.capture.streams.rings[handle.slot].view(slot, info.format, info.height, info.width).address

    def deliver(self, handle, slot: int, pts: float | None, count: int) -> None:
        """The stream's count-th frame decoded (from 0), in ring slot `slot`."""
        frame_no = self.capture.streams.frame_number(handle, count)
        if frame_no is None:  # delivered by the worker before this one (Streams.resume)
            self.release(handle, slot)
            return
        # never waits: a file's credits were its queue's room
        self.capture.queue_frame(handle.slot, self.capture.streams.rings[handle.slot], slot, handle.source.info,
                                 frame_no, pts, handle.source.live, wait=False)

    def release(self, handle, slot: int) -> None:
        self.capture.streams.rings[handle.slot].release(slot)

    def ended(self, handle, how: str, why: str, frames: int) -> None:
        """The process is done with the stream: at its end, its frame limit, its removal, or (failed) gone."""
        source = handle.source
        if how == "failed":
            self.capture.metrics.count("failed", handle.slot)
            log.error("source %d (%s): %s", handle.id, source.describe(), why)
        elif how == "ended":
            log.info("source %d (%s) ended after %d frames, %d decode error(s)", handle.id, source.describe(),
                     frames, source.decode_errors)
        if how in ("ended", "failed") and handle.state == "running":
            handle.state = "ended"
        handle.done.set()

    def failed(self, handle, why: str, backoff: float) -> None:
        """A read failed in the process; it opens the stream again after `backoff`."""
        self.capture.metrics.count("failed", handle.slot)
        self.capture.metrics.count("reconnects", handle.slot)
        log.warning("source %d (%s): %s; reconnecting in %.1f s", handle.id, handle.source.describe(), why, backoff)

    def stopping(self, handle) -> bool:
        return self.capture.stopping.is_set() or handle.stop.is_set()
