"""The pipeline inside one's own program: every record it makes, as the sinks get them, in a for loop.

    for record in jetpipe.iter_results(config):   # a PipelineConfig, or the path of a jetpipe.toml
        if record.type is None:                   # a frame's record (an event's, a clip's: their type)
            found = record.detections             # arrays: xyxy, confidence, class_id, tracker_id, data
            ...

The pipeline runs in threads of its own, as `jetpipe serve` runs it (the configuration's sinks write too);
the loop is one more sink, fed in order. A loop slower than the pipeline holds up the sinks' thread: cameras
then drop their oldest frames (counted), files wait. Leaving the loop (break, an exception) stops the pipeline
and waits for it to end; the run's summary is then `results.summary` of the iterator.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path

from jetpipe.pipelines.config import PipelineConfig, load, validate
from jetpipe.pipelines.service.daemon import Pipeline

WAITING = 64  # records waiting for the loop at most
_END = object()


class Results:
    """An iterator over a pipeline's records; `summary` once it has ended (None before)."""

    def __init__(self, config, waiting: int = WAITING):
        if not isinstance(config, PipelineConfig):
            config = load(Path(config))
        self.summary: dict | None = None
        self._records: queue.Queue = queue.Queue(maxsize=waiting)
        self._pipeline = Pipeline(validate(config), on_result=self._records.put)
        self._thread = threading.Thread(target=self._run, name="pipeline", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.summary = self._pipeline.run()
        finally:
            self._records.put(_END)

    def __iter__(self) -> Iterator:
        try:
            while (record := self._records.get()) is not _END:
                yield record
        finally:
            self.close()

    def close(self) -> None:
        """Stop the pipeline (what is queued drains, as at a SIGTERM) and wait for its end."""
        if self._thread.is_alive():
            self._pipeline.stop()
        while self._thread.is_alive():  # the sinks' thread may wait to hand over a record: take them
            try:
                self._records.get(timeout=0.1)
            except queue.Empty:
                pass
        self._thread.join()


def iter_results(config, waiting: int = WAITING) -> Results:
    """Run a pipeline and iterate its records (frames' and events'), in order: see the module's text."""
    return Results(config, waiting)
