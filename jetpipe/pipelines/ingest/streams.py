"""The daemon's streams in slots whose capacity is allocated at start-up.

A slot holds one stream at a time and owns what the frame loop needs for it: frame rings (allocated
at start-up: a slot of the control API's spare capacity gets a host ring and, where NVDEC decodes into
GPU memory, a device ring), a batcher queue, counters, a tracker. Adding a stream takes a free slot and
allocates nothing on the GPU; removing one stops its source, lets its queued and in-flight frames finish
(its ring drains), then frees the slot. A stream's ID is never reused: records, /metrics labels and sink
file names keep apart the streams a slot held one after another.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from jetpipe import uri
from jetpipe.errors import JetpipeError
from jetpipe.pipelines.config import SourceConfig
from jetpipe.runtime.ring import slot_bytes


class ControlError(JetpipeError):
    """A control request that cannot be done; `status` is the HTTP status that says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Stream:
    id: int
    spec: SourceConfig
    source: object
    slot: int
    state: str = "running"  # running | ended (source ended; slot kept until removed or needed) | stopping | removed
    camera: bool = field(init=False)  # a camera or network stream (its frames are not read again), not a file
    stop: threading.Event = field(default_factory=threading.Event)  # removal asked: capture ends
    started: bool = False  # its capture was started (in a thread of its own or a shared one)
    done: threading.Event = field(default_factory=threading.Event)  # its capture ended

    def __post_init__(self):
        self.camera = uri.parse(self.spec.uri).live

    def capturing(self) -> bool:
        return self.started and not self.done.is_set()


class Streams:
    def __init__(self, capacity: int, ids: list[int] | None = None, first_added: int | None = None, stride: int = 1,
                 resume: Resume | None = None):
        """ids: the IDs the configured streams take, in order (a GPU's worker serves its share of a daemon's
        streams under their daemon-wide IDs: pipelines/service/gpus); None: 0, 1, ... Streams added later take
        first_added, then every stride-th (each GPU's worker its own residue: IDs unique over the daemon)."""
        self.given, self.stride = list(ids or ()), stride
        self.slots: list[Stream | None] = [None] * capacity
        self.rings: list = [None] * capacity  # the ring the slot's stream writes
        self.choices: list[list] = [[] for _ in range(capacity)]  # the rings allocated for each slot
        self.retired: dict[int, dict] = {}  # removed streams: their counters when they were removed
        self.next_id = max(self.given, default=-1) + 1 if first_added is None else first_added
        self.resume = resume or Resume()
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # a stream was removed (its slot freed)

    @property
    def capacity(self) -> int:
        return len(self.slots)

    def live(self) -> list[Stream]:
        """The streams in slots now (a copy: safe to iterate while others are added or removed)."""
        with self.lock:
            return [s for s in self.slots if s is not None]

    def find(self, stream_id: int) -> Stream | None:
        with self.lock:
            return next((s for s in self.slots if s is not None and s.id == stream_id), None)

    def id_of(self, slot: int) -> int:
        return self.slots[slot].id

    def moving(self, slot: int) -> bool:
        """Whether the slot's stream is a moving camera (its source's moving_camera)."""
        stream = self.slots[slot]
        return stream is not None and stream.spec.moving_camera

    def first_track_ids(self) -> list[int]:
        """The first track ID of each slot's stream: where a restarted worker's stream goes on (Resume), else 1."""
        return [1 if s is None else self.resume.track_ids.get(s.id, 1) for s in self.slots]

    def frame_number(self, stream: Stream, count: int) -> int | None:
        """The number of a stream's count-th frame read (from 0), or None where it is skipped: a restarted worker's
        camera goes on numbering where the last worker's records ended; its file (paced or not) is read again from
        its start (a frame's number is its place in the file), the frames already delivered skipped."""
        first = self.resume.frames.get(stream.id, 0)
        if stream.camera:
            return first + count
        return count if count >= first else None

    def ring_for(self, hw: tuple[int, int], device: bool, fmt: str | None = None) -> tuple[int, object] | None:
        """A free slot with a ring of this memory that holds frames up to hw (of format fmt where the source
        knows it): the smallest that fits."""
        need = slot_bytes(hw, device, fmt)
        fits = [(ring.slot_bytes, slot, ring) for slot, stream in enumerate(self.slots) if stream is None
                for ring in self.choices[slot] if ring.device == device and ring.slot_bytes >= need]
        if not fits:
            return None
        _, slot, ring = min(fits, key=lambda f: f[0])
        return slot, ring

    def describe_free(self) -> str:
        """What the free slots take, for a 409's reason."""
        kinds = sorted({f"{'device' if r.device else 'host'} memory up to {r.slot_bytes // _pixel_bytes(r)} pixels"
                        for slot, s in enumerate(self.slots) if s is None for r in self.choices[slot]})
        return "; ".join(kinds) if kinds else "none"

    def take(self, slot: int, ring, spec: SourceConfig, source) -> Stream:
        if self.given:
            stream = Stream(self.given.pop(0), spec, source, slot)
        else:
            stream = Stream(self.next_id, spec, source, slot)
            self.next_id += self.stride
        self.slots[slot], self.rings[slot] = stream, ring
        return stream

    def free(self, stream: Stream, counts: dict) -> None:
        """The stream is gone: its slot is free, its counters kept for the summary."""
        with self.lock:
            self.retired[stream.id] = {"uri": stream.spec.uri, "state": "removed", **counts}
            self.slots[stream.slot] = None
            stream.state = "removed"
            self.changed.notify_all()


@dataclass
class Resume:
    """Where a restarted GPU worker's streams go on from (pipelines/service/gpus): the worker before it died, and
    what it had delivered is history the new one must not write again. By daemon-wide stream ID: the next frame number
    (a camera's numbering goes on there; a file, read again from its start, skips to it), the next track ID (a
    new object never takes an ID already delivered); by rule, the events counted so far (counts go on)."""

    frames: dict[int, int] = field(default_factory=dict)
    track_ids: dict[int, int] = field(default_factory=dict)
    event_counts: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass
class Share:
    """This process's part of a daemon's streams: a GPU's worker (pipelines/service/gpus) serves some of them, under
    their daemon-wide IDs, and hands every record on to the face."""

    ids: list[int]  # the daemon-wide IDs of the configured sources, in order
    total: int      # the streams the daemon serves in all (the frame sinks' file names are numbered by it)
    forward: object  # the sink that takes every record to the face
    first_added: int | None = None  # the ID of the first stream added through the control API
    stride: int = 1  # and of each after it: every stride-th
    resume: Resume | None = None  # a restarted worker's: where its streams go on from


def _pixel_bytes(ring) -> int:
    return slot_bytes((1, 1), ring.device)
