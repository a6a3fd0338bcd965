"""Every record to every sink: the one place delivery happens and failures are counted.

The post stage offers each frame to the sinks that take frames (a copy, before its ring slot is released)
and puts the frame's record on a bounded queue; the writer thread (`run`) hands each record to every sink
in order. A sink that raises is counted (its `fail`) and the others go on. The viewers (the preview page)
take frames like sinks but are no sink of the user's: not in the summary's lists.
"""

from __future__ import annotations

import logging
import queue

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from jetpipe.pipelines.outputs.sinks.base import Sink
from jetpipe.pipelines.outputs.sinks.delivery import QueuedSink

log = logging.getLogger(__name__)

QUEUE_RECORDS = 256  # records waiting for the writer; a full queue holds up the post stage, not memory
POLL_S = 0.2  # a put into a full queue, the writer's wait at the end: how often they look whether to give up


class SinkFanout:
    def __init__(self, sinks: list[Sink], on_record=None):
        """on_record(record): called first for each record (frames', events', clips') in the writer thread (the
        demo's console, a program's loop: pipelines/service/embed.py)."""
        self.sinks = list(sinks)
        self.frame_takers = [s for s in self.sinks if s.takes_frames]
        self.on_record = on_record
        self.records: queue.Queue = queue.Queue(maxsize=QUEUE_RECORDS)
        self._closed: set[int] = set()
        self.written = 0  # records handed to every sink: the writer's progress (drain.end_writer)
        self.writing = None  # the sink (or on_record) in a write now
        self.given_up: str | None = None  # why the writer was given up on (a sink blocked in a write), once it was
        self.records_dropped = 0  # records not written: queued or put after the writer was given up on
        self._ending = False
        self.scene = None  # scene(stream, frame_hw): what is drawn beside the results (show_scene)

    def show_scene(self, scene) -> None:
        """scene(stream, frame_hw, view): what the frame sinks draw beside the results (the rules:
        EventStep.scene; view: a moving camera's, the record's Detections.view)."""
        self.scene = scene

    def add_viewer(self, viewer) -> None:
        """A frame taker that is no sink of the user's (the preview page): offered frames, closed by its owner."""
        self.frame_takers.append(viewer)

    def offer(self, stream_id: int, frame, record, to_host, wait: bool) -> None:
        """A frame and its record to each sink that draws frames; wait: a file's frame, every one is drawn."""
        if self.scene is not None and self.frame_takers:  # the rules and counts as they are at this frame
            record.scene = self.scene(stream_id, frame.size(), record.detections.view)
        for sink in self.frame_takers:
            try:
                sink.offer(stream_id, frame, record, to_host, wait=wait)
            except Exception as exc:  # a sink that fails never fails the batch
                sink.fail(exc)

    def put(self, record) -> None:
        """The record queued for the writer: waits while the queue is full (the sinks hold up the post stage),
        until the writer is given up on (then dropped, counted)."""
        while not self.given_up:
            try:
                self.records.put(record, timeout=POLL_S)
                return
            except queue.Full:
                pass
        self.records_dropped += 1

    def finish(self) -> None:
        """No more records: run() returns once it has written those queued. Never waits: a writer blocked in a
        sink's write (a reader that stopped reading stdout) would hold the run's end (drain.end_writer bounds it)."""
        self._ending = True
        try:
            self.records.put_nowait(None)
        except queue.Full:
            pass  # the writer ends once it finds the queue empty

    def run(self) -> None:
        """The writer thread: each record to every sink, in order, until finish()."""
        while True:
            try:
                record = self.records.get(timeout=POLL_S)
            except queue.Empty:
                if self._ending:
                    return
                continue
            if record is None:
                return
            if self.on_record is not None:
                self.writing = self.on_record
                self.on_record(record)
            for sink in self.sinks:
                self.writing = sink
                try:
                    sink.write(record)
                except Exception as exc:  # one sink failing must not stop the others
                    sink.fail(exc)
            self.writing = None
            self.written += 1

    def give_up(self) -> str | None:
        """Where the writer is blocked in a sink's write (no record written while the run ends), give it up: the
        records queued are dropped (counted) and puts no longer wait, so the post stage can finish. Why, or None
        where the writer is not in a write. Again later: what was queued since is dropped too."""
        held = self.writing
        if held is None and not self.given_up:
            return None
        if not self.given_up:
            what = "the results' loop (on_record)" if held is self.on_record else f"sink {held.describe()}"
            self.given_up = f"{what} blocked in a write (a reader that stopped reading, a stalled disk or network)"
        while True:
            try:
                self.records_dropped += self.records.get_nowait() is not None
            except queue.Empty:
                break
        return self.given_up

    def end_stream(self, stream_id: int) -> None:
        """A removed stream's outputs end (its last frame was offered already)."""
        for sink in self.frame_takers:
            sink.end_stream(stream_id)

    def cut_short(self) -> int:
        """A bounded drain ran out: the frame sinks drop the frames still waiting to be drawn (counted in their
        `dropped`); how many."""
        return sum(sink.cut_short() for sink in self.frame_takers)

    def close(self) -> None:
        """Close every sink once (after the run, so the summary counts what fails as they finish; or at an
        early close())."""
        for i, sink in enumerate(self.sinks):
            if i in self._closed:
                continue
            self._closed.add(i)
            if self.given_up and sink is self.writing:  # its close (a flush) would block as its write does
                continue
            try:
                sink.close()
            except Exception as exc:
                sink.failures += 1
                log.error("sink %s failed while closing: %s", sink.describe(), exc)

    def failures(self) -> list[int]:
        return [s.failures for s in self.sinks]

    def dropped(self) -> list[int]:
        return [s.dropped for s in self.sinks]

    def deliveries(self) -> list[dict]:
        """The brokers' sinks: records sent, lost, queued now and failed tries (the summary's `delivery`)."""
        return [s.delivery() for s in self.sinks if isinstance(s, QueuedSink)]

    def metric_families(self):
        """For /metrics: each broker sink's records sent and lost, and its queue now."""
        queued = [s for s in self.sinks if isinstance(s, QueuedSink)]
        for name, help_text, kind, read in (
                ("jetpipe_sink_records_sent", "Records a broker acknowledged.", CounterMetricFamily, "sent"),
                ("jetpipe_sink_records_lost", "Records a broker sink could not deliver (queue full, refused, "
                                              "left at stop).", CounterMetricFamily, "lost"),
                ("jetpipe_sink_queue", "Records waiting in a broker sink's queue.", GaugeMetricFamily, "queued")):
            family = kind(name, help_text, labels=["sink"])
            for sink in queued:
                family.add_metric([sink.describe()], sink.delivery()[read])
            yield family
