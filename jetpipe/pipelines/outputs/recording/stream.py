"""One stream's recording: the whole GOPs its packet ring holds, written one after another into segments.

It follows the ring from behind (about a GOP: a GOP is written once the next one starts) and pins where it
is, so that the ring keeps what it has not written yet (up to the ring's max_bytes: beyond that GOPs are lost,
counted, and the recording has a gap). A segment ends at the first keyframe past segment_s, where the stream's
clock goes back (a looped file's next pass, a camera's reset), at a gap, and at the end.

Wall clock: a segment's start is its first packet's time on the stream's clock plus the stream's offset to
the wall clock, taken from its frames' records (capture time - pts) and kept while it holds within a second,
so that consecutive segments meet exactly; where no frame was seen yet, from the ring's newest packet.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from jetpipe.errors import worth_logging
from jetpipe.pipelines.outputs.recording.budget import BLOCK
from jetpipe.pipelines.outputs.recording.index import segment_path
from jetpipe.pipelines.outputs.recording.segments import (
    HEADER_BYTES,
    SegmentFile,
    parameter_sets,
    reserve_for,
    template_of,
)

log = logging.getLogger(__name__)

PIN = "recording"   # the ring's pin of the recorder (PacketRing.pin)
RESYNC_S = 1.0      # the stream's offset to the wall clock is taken again where it moved this much
MAX_NAME_TRIES = 100


@dataclass
class Open:
    """The segment being written."""
    file: SegmentFile
    row: int
    start: float      # wall clock of its time 0
    t0: float         # the stream's clock at its time 0
    reserved: int     # what the budget holds for it


@dataclass
class StreamRecording:
    stream: int
    source: str             # its URI, as the index keeps it
    ring: object            # ingest.packet_ring.PacketRing
    mode: str               # all | events
    generation: int = -1    # the ring's pass being followed
    cursor: float = float("-inf")  # the start of the last GOP written (its ring time)
    next_t: float | None = None    # where the stream's clock goes on after what was written
    offset: float | None = None    # wall clock - stream clock
    seen_offset: float | None = None  # the newest frame's (on_frame; read in the recorder's thread)
    segment: Open | None = None
    file_template: object = None   # the container segments copy codec parameters from (_template)
    template_key: bytes = b""      # its parameter sets (Annex B)
    lost: int = 0            # GOPs the ring let go before they were written
    written: int = 0         # segments closed
    failed: int = 0          # segments a write failed in
    removed: bool = False    # its stream was removed: forgotten once its ring's end is written

    def __post_init__(self):
        self.ring.pin(PIN, float("-inf"))  # kept from its first packet until written (max_bytes still holds)

    def follow(self, recorder, last_too: bool = False) -> None:
        """Write what the ring holds beyond the cursor (recorder: Recorder, for its index, budget and
        segment_s); last_too: the newest GOP as well (the stop). Every pass of the stream's clock the ring holds,
        the oldest first: the recording process's ring keeps a pass until it is written (a camera that
        reconnected within a poll of the stop had its new connection's packets lost, the stop writing only the
        oldest)."""
        while True:
            generation, gops = self.ring.whole_gops_after(self.cursor, last_too)
            if generation != self.generation:  # the stream's clock went back: a new pass, a new segment
                self.close(recorder)
                self.generation, self.cursor, self.next_t = generation, float("-inf"), None
                continue
            if not gops:
                return
            for gop in gops:
                self._write(recorder, gop)
                self.cursor = gop.start
                self.ring.pin(PIN, gop.start)

    def _write(self, recorder, gop) -> None:
        packets = gop.packets
        base = min(p.dts if p.dts is not None else p.pts for p in packets)
        start_t = base * float(self.ring.time_base)
        if self.next_t is not None and start_t - self.next_t > recorder.gap_s:
            self.lost += 1  # the ring let GOPs go (max_bytes) before they were written: a gap, a new segment
            self.close(recorder)
        segment = self.segment
        if segment is not None and start_t - segment.t0 >= recorder.segment_s - 1e-3:  # (float times)
            self.close(recorder, t1=start_t)
            segment = None
        # a new file: its header, and its last block taken whole on disk
        need = reserve_for(packets) + (HEADER_BYTES + BLOCK if segment is None else 0)
        if not recorder.budget.reserve(need):  # no room: a gap (the budget said so), a new segment after it
            self.close(recorder)
            self.next_t = None
            return
        try:
            if segment is None:
                segment = self._open(recorder, packets, base, start_t, need)
                self.segment = segment
            else:
                segment.reserved += need
            segment.file.write(packets)
        except Exception as exc:  # a full disk, a codec the muxer refuses: this segment ends, the next tries
            if segment is None:
                recorder.budget.released(need)
            self._failed(recorder, exc)
            return
        self.next_t = segment.file.last

    def _open(self, recorder, packets, base: int, start_t: float, need: int) -> Open:
        """A new segment starting with these packets: its row, then its file."""
        ring = self.ring
        if self.offset is None or (self.seen_offset is not None and abs(self.seen_offset - self.offset) > RESYNC_S):
            self.offset = self.seen_offset if self.seen_offset is not None else time.time() - ring.newest
        start = start_t + self.offset
        path = next(p for attempt in range(MAX_NAME_TRIES)
                    if not os.path.lexists(recorder.folder / (p := segment_path(self.stream, start, attempt))))
        target = recorder.folder / path
        make_folders(recorder.folder, target.parent)
        template = self._template(packets)
        row = recorder.index.begin(self.stream, self.source, path, start, start_t)
        try:
            file = SegmentFile(target, template, ring.time_base, base)
        except BaseException:
            recorder.index.forget_row(row)
            raise
        return Open(file, row, start, start_t, need)

    def _template(self, packets):
        """The container a segment copies its codec parameters from, opened again only where they changed:
        the input file's (once), or a raw stream of this GOP where its parameter sets differ from the last
        (opening one probes the GOP: 25 ms at 1080p, 64 times in a 30-s run of 16 streams before)."""
        ring = self.ring
        if ring.annexb is None:
            if self.file_template is None:
                self.file_template = template_of(None, ring.template, packets)
            return self.file_template
        key = parameter_sets(packets[0].data, ring.annexb)
        if self.file_template is None or (key and key != self.template_key):
            if self.file_template is not None:
                self.file_template.close()
            self.file_template, self.template_key = template_of(ring.annexb, "", packets), key
        return self.file_template

    def close(self, recorder, t1: float | None = None) -> None:
        """The open segment finished and indexed (t1: where the next one starts)."""
        segment = self.segment
        if segment is None:
            return
        try:
            written = segment.file.close(t1)
        except Exception as exc:
            self._failed(recorder, exc)
            return
        self.segment = None
        end = segment.start + (written.t1 - written.t0)
        held = recorder.index.event_near(self.stream, written.t0, written.t1, recorder.before_s, recorder.after_s)
        recorder.index.finish(segment.row, end, written.t1, written.bytes, written.packets, held)
        recorder.budget.closed_segment(segment.reserved, written.bytes)
        self.written += 1

    def _failed(self, recorder, exc: Exception) -> None:
        """A write or a close failed: the segment ends with what it holds (its whole fragments play), indexed
        at its size on disk."""
        segment, self.segment = self.segment, None
        self.failed += 1
        self.next_t = None
        if segment is not None:
            segment.file.abandon()
            try:
                size = segment.file.path.stat().st_size
            except OSError:
                size = 0
            t1 = segment.file.last or segment.t0
            recorder.index.finish(segment.row, segment.start + (t1 - segment.t0), t1, size, segment.file.packets,
                                  False)
            recorder.budget.closed_segment(segment.reserved, size)
        if worth_logging(self.failed):
            log.warning("recording of stream %d: a segment failed (#%d): %s; the next GOP starts a new one",
                        self.stream, self.failed, str(exc)[:200])

    def end(self) -> None:
        if self.file_template is not None:
            self.file_template.close()
            self.file_template = None
        self.ring.unpin(PIN)


def make_folders(root, folder) -> None:
    """The stream's and the day's folders under the recording's, made where missing; a link in their place
    is refused (a segment is never written through one)."""
    for step in (folder.parent, folder):
        try:
            step.mkdir()
        except FileExistsError:
            pass
        if step.is_symlink() or not step.is_dir():
            raise OSError(f"{step} is not a folder of the recording (a link, or a file): remove it")
