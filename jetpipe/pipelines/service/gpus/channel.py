"""What a GPU's worker and the face say to each other.

Worker -> face, one line each on a pipe of its own (standard output stays the worker's, unused):

    H {json}                                   hello: built, serving (its metrics address, backend, engine time)
    E {json}                                   it could not start: {"error": the one line}
    R STREAM TYPE LATENCY_MS FRAME TRACK RECORD_JSON
                                               a record, as the sinks take it (TYPE and LATENCY_MS: - for none;
                                               FRAME: its frame's number, - for a clip or
                                               snapshot; TRACK: the highest track ID in it, -
                                               for none; RECORD_JSON - where the face has no sink for frames'
                                               records). FRAME and TRACK let the face start a worker again
                                               where the dead one's records ended (streams.Resume)
    S {json}                                   its run's summary, the last line

Face -> worker, on the worker's standard input: first the job (its length, then the pickled Job), then lines:
`stop` (drain, as a first SIGTERM), `abort SIGNAL` (as a second). Its end (the face gone) is a stop.

A record's JSON is compact (no newline in it), so a line is a record; it is not parsed again on the way: the
face's sinks write the same text.
"""

from __future__ import annotations

import json
import pickle
import struct
import threading
from dataclasses import dataclass

from jetpipe.pipelines.core.events.record import EventRecord
from jetpipe.pipelines.core.record import FrameRecord
from jetpipe.pipelines.ingest.streams import Resume
from jetpipe.pipelines.outputs.sinks.base import SinkBase
from jetpipe.tasks import json_numbers
from jetpipe.tasks.detections import NO_TRACK

LENGTH = struct.Struct("<Q")
NONE = "-"


@dataclass
class Job:
    """A worker's part of the daemon."""

    gpu: int
    config: object      # its PipelineConfig: its sources, the frame sinks, metrics on 127.0.0.1:0 or off
    ids: list[int]      # the daemon-wide IDs of its sources, in order
    total: int          # streams the daemon serves in all
    fd: int             # the pipe it writes its lines to
    records: bool = True  # the face has sinks of records: frames' records go whole (else their latency only)
    first_added: int | None = None  # streams added through the control API: this ID, then every stride-th
    stride: int = 1
    resume: Resume | None = None  # a restarted worker's: where its streams go on from
    worker: int = 0     # its number among the face's workers (the placement's; one a GPU: the GPU's place in --gpus)
    k: int = 0          # its place among its GPU's workers, from 1, where the GPU has several; 0: the GPU's only one


def worker_name(gpu: int, k: int) -> str:
    """How a worker is said (k as in Job): "GPU 0", or "GPU 0 worker 2" where its GPU has several."""
    return f"GPU {gpu}" + (f" worker {k}" if k else "")


def worker_who(gpu: int, k: int) -> str:
    """"GPU 0's worker", or "GPU 0's worker 2" where its GPU has several."""
    return f"GPU {gpu}'s worker" + (f" {k}" if k else "")


def send_job(stream, job: Job) -> None:
    data = pickle.dumps(job)
    stream.write(LENGTH.pack(len(data)) + data)
    stream.flush()


def read_job(stream) -> Job:
    (size,) = LENGTH.unpack(stream.read(LENGTH.size))
    return pickle.loads(stream.read(size))  # from the face that started this process: trusted


@dataclass(slots=True)
class Forwarded:
    """A worker's record at the face: what the sinks read of a record (stream, type, json)."""

    stream: int
    type: str | None
    text: str

    def json(self) -> str:
        return self.text


class Outbox:
    """The worker's side of the pipe: whole lines, one writer at a time."""

    def __init__(self, fd: int):
        self.file = open(fd, "wb", buffering=1 << 20, closefd=True)  # noqa: SIM115 (closed by close())
        self.lock = threading.Lock()

    def send(self, kind: str, payload: dict) -> None:
        self.line(f"{kind} {json.dumps(payload, separators=(',', ':'))}")

    def line(self, text: str) -> None:
        with self.lock:
            self.file.write(text.encode() + b"\n")
            self.file.flush()  # a record reaches the face's sinks now, not with the next block

    def flush(self) -> None:
        with self.lock:
            self.file.flush()

    def close(self) -> None:
        with self.lock:
            self.file.close()


class ForwardSink(SinkBase):
    """The worker's last sink: every record to the face, in the order the writer thread hands them. records:
    False where the face has no sink for frames' records: then a frame's latency goes alone (making each
    record's JSON for nobody cost a third of one GPU's frames/s, 48 streams on an H200)."""

    def __init__(self, outbox: Outbox, records: bool = True):
        self.outbox, self.records = outbox, records
        if records:
            json_numbers.make_tables()  # the frames' records' JSON: its tables made now, not at the first record

    def describe(self) -> str:
        return "face"

    def write(self, record) -> None:
        kind = record.type or NONE
        frame = isinstance(record, FrameRecord)
        latency = f"{record.latency_ms['total']:.3f}" if frame else NONE
        body = record.json() if self.records or not frame else NONE
        at, track = _progress(record)
        self.outbox.line(f"R {record.stream} {kind} {latency} {_word(at)} {_word(track)} {body}")

    def close(self) -> None:
        self.outbox.flush()


def _progress(record) -> tuple[int | None, int | None]:
    """(its frame's number, the highest track ID in it): what the face resumes a restarted worker from."""
    if isinstance(record, FrameRecord):
        return record.frame, highest_track(record)
    if isinstance(record, EventRecord):
        return record.frame, record.track_id
    return None, None  # a clip's or snapshot's record: the frames' records say it already


def _word(value: int | None) -> str:
    return NONE if value is None else str(value)


def highest_track(record: FrameRecord) -> int | None:
    """The highest track ID among a frame's results (None: no tracks)."""
    ids = record.detections.tracker_id
    return int(ids.max()) if ids is not None and len(ids) and ids.max() != NO_TRACK else None


@dataclass(slots=True)
class Line:
    """A record line at the face."""

    stream: int
    record: Forwarded | None  # None where only its latency came
    latency_ms: float | None  # a frame's; None for the others
    frame: int | None         # its frame's number (None: a clip's or a snapshot's record)
    track: int | None         # the highest track ID in it


def parse(line: bytes) -> tuple[str, object]:
    """(kind, what it carries): a record line -> a Line; the others -> their dict."""
    text = line.decode().rstrip("\n")
    kind, _, rest = text.partition(" ")
    if kind != "R":
        return kind, json.loads(rest)
    stream, kind_of, latency, frame, track, body = rest.split(" ", 5)
    record = None if body == NONE else Forwarded(int(stream), None if kind_of == NONE else kind_of, body)
    return "R", Line(int(stream), record, None if latency == NONE else float(latency),
                     None if frame == NONE else int(frame), None if track == NONE else int(track))
