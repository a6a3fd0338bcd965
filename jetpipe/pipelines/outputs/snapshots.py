"""Snapshots of events: a JPEG of the frame an event happened on, its boxes outlined (and, where asked, a JPEG of
each event's box alone), with a `snapshot_ready` record in the sinks when the files are whole.

The events step hands each event to `take` while the event's frame is still in its ring slot (with snapshots on
it decides every batch as it comes, rather than gathering a few: steps.py); `take` copies the frame into one of
the encoder's buffers (on the GPU for NVDEC frames: runtime/jpeg.py) and the snapshots' thread encodes and writes
it. The events of one frame share one picture. With every buffer waiting, a snapshot is dropped (counted, said):
serving never waits for the encoder. Files are written whole (temporary name, then linked), never over a file;
the folder is kept within max_total_mb and max_age_h (the oldest pictures go).
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from jetpipe.errors import worth_logging
from jetpipe.pipelines.config import SNAPSHOTS_AUTO_MB
from jetpipe.pipelines.outputs.retention import Room
from jetpipe.pipelines.outputs.sinks import scheme_of
from jetpipe.pipelines.outputs.sinks.safe_open import write_whole
from jetpipe.runtime.jpeg import clip_box
from jetpipe.runtime.jpeg import jpeg_encoder as open_jpeg_encoder

log = logging.getLogger(__name__)

SNAPSHOT_SCHEMA = "jetpipe.snapshot/1"
SNAPSHOT_NAME = re.compile(r"stream\d+-\d{8,}-\d+(-e\d+)?\.jpg")  # stream{ID}-{frame}-{n}[-e{k}].jpg
CLOSE_WAIT_S = 5.0  # at the stop, pictures still waiting get this long


@dataclass
class SnapshotRecord:
    """`jetpipe.snapshot/1`: {"schema", "type": "snapshot_ready", "stream", "frame", "pts", "path" (the frame's
    JPEG), "crops": {event_id: path of the JPEG of its box} (with crop = true), "events": [event_id, ...],
    "bytes", "encoder"}."""
    stream: int
    frame: int
    pts: float | None
    path: str
    crops: dict
    events: list
    bytes: int
    encoder: str
    type: str = "snapshot_ready"

    def json(self) -> str:
        return json.dumps({"schema": SNAPSHOT_SCHEMA, "type": self.type, "stream": self.stream, "frame": self.frame,
                           "pts": self.pts, "path": self.path, "crops": self.crops, "events": self.events,
                           "bytes": self.bytes, "encoder": self.encoder}, separators=(",", ":"))


@dataclass
class _Shot:
    stream: int
    frame: int
    pts: float | None
    held: object
    events: list = field(default_factory=list)
    taken: bool = False  # the thread has it: later events of its frame make a picture of their own


class Snapshots:
    def __init__(self, config, encoder, deliver):
        """config: SnapshotsConfig (checked); encoder: the runtime's jpeg_encoder; deliver(record): to the
        sinks."""
        self.config, self.encoder, self.deliver = config, encoder, deliver
        self.folder = Path(config.folder)
        # the folder within max_total_mb and max_age_h, room made before each picture (the oldest go)
        self.room = Room(self.folder, SNAPSHOT_NAME, config.max_total_mb or SNAPSHOTS_AUTO_MB, config.max_age_h)
        self.on = frozenset(config.on)
        self.work: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self._last: _Shot | None = None
        self.written = self.failed = self.dropped = 0
        self.encode_s = 0.0  # the thread's wall time in the encoder (pictures a second it can make: written / it)
        self.cpu_s = 0.0
        self._names = itertools.count(1)
        self.thread = threading.Thread(target=self._run, name="snapshots", daemon=True)
        self.thread.start()
        log.info("snapshots of %s in %s", ", ".join(config.on), self.folder)

    def take(self, record, frame) -> None:
        """An event (events.EventRecord) and its frame, still in its ring slot (the post stage's thread)."""
        if record.type not in self.on:
            return
        with self.lock:
            last = self._last
            if last is not None and not last.taken and (last.stream, last.frame) == (record.stream, record.frame):
                last.events.append(record)  # the frame's picture, not yet encoded: it shows this event too
                return
        held = self.encoder.hold(frame)
        if held is None:
            self.dropped += 1
            if worth_logging(self.dropped):
                log.warning("snapshots: %d dropped: the encoder is behind (%d frames wait; [snapshots] buffers)",
                            self.dropped, self.config.buffers)
            return
        shot = _Shot(record.stream, record.frame, record.pts, held, [record])
        with self.lock:
            self._last = shot
        self.work.put(shot)

    # -- the snapshots' thread ----------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while (shot := self.work.get()) is not None:
                with self.lock:
                    shot.taken = True
                try:
                    self._write(shot)
                except Exception as exc:  # a full disk, an encoder that failed: counted and said, serving goes on
                    self.failed += 1
                    if worth_logging(self.failed):
                        log.warning("snapshot of stream %d frame %d not written (#%d): %s", shot.stream, shot.frame,
                                    self.failed, str(exc)[:200])
                finally:
                    self.encoder.release(shot.held)
        finally:
            self.cpu_s = time.thread_time()

    def _write(self, shot: _Shot) -> None:
        hw = shot.held.hw
        boxes = [b for e in shot.events if e.box is not None and (b := clip_box(e.box, hw))] if self.config.box \
            else []
        started = time.perf_counter()
        pictures = [(None, self.encoder.picture(shot.held, boxes))]
        if self.config.crop:
            pictures += [(e, self.encoder.picture(shot.held, crop=b)) for e in shot.events
                         if e.box is not None and (b := clip_box(e.box, hw))]
        self.encode_s += time.perf_counter() - started
        stem = self._stem(shot)
        path, crops, size = self.folder / f"{stem}.jpg", {}, 0
        self.room.make(sum(len(data) for _, data in pictures))  # the oldest pictures go first
        for k, (event, data) in enumerate(pictures):
            target = path if event is None else self.folder / f"{stem}-e{k}.jpg"
            write_whole(target, data)
            self.room.wrote(len(data))
            size += len(data)
            if event is not None:
                crops[event.event_id] = str(target)
        self.written += 1
        self.deliver(SnapshotRecord(shot.stream, shot.frame, shot.pts, str(path), crops,
                                    [e.event_id for e in shot.events], size, self.encoder.kind))

    def _stem(self, shot: _Shot) -> str:
        """stream{ID}-{frame:08d}-{n}: a name no file of the folder has (an earlier run's are never overwritten)."""
        while True:
            stem = f"stream{shot.stream}-{shot.frame:08d}-{next(self._names)}"
            if not (self.folder / f"{stem}.jpg").exists():
                return stem

    def summary(self) -> dict:
        """written, failed, dropped (the encoder behind), the encoder, and its pictures a second of its time."""
        return {"written": self.written, "failed": self.failed, "dropped": self.dropped,
                "encoder": self.encoder.kind, "waiting": self.work.qsize(),
                "encode_ms": round(1e3 * self.encode_s / max(1, self.written), 3), "cpu_s": round(self.cpu_s, 3)}

    def close(self) -> None:
        """Write what waits (bounded by CLOSE_WAIT_S), then stop (the encoder is the daemon's, the jpeg: sinks'
        too)."""
        self.work.put(None)
        self.thread.join(timeout=CLOSE_WAIT_S)


def jpeg_encoder(config, runtime):
    """The JPEG encoder of the snapshots and the jpeg: sinks, where either is asked for (runtime.jpeg: the GPU's
    where it can be had), its buffers (frames held for snapshots) allocated now; None where neither is."""
    snapshots = config.snapshots
    if not snapshots.folder and not any(scheme_of(uri) == "jpeg" for uri in config.sinks):
        return None
    held = snapshots.buffers if snapshots.folder else 0  # frames held for snapshots; the jpeg: sink holds none
    encoder = open_jpeg_encoder(runtime, snapshots.encoder, snapshots.quality, held, config.max_frame_hw)
    log.info("JPEG pictures encoded by %s", encoder.describe)
    return encoder
