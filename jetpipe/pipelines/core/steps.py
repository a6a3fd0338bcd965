"""Per-frame steps: what runs on each frame's results after the model's own postprocessing, in order.

The post stage calls every step of the list the daemon builds (`build_steps`) on the frames of each finished
batch, one stream's frames in their order, in one thread. A step may add to the frames' results (the
tracker's `tracker_id`) or read what earlier steps added (the events read the tracks); it may decide the
batch at once (the events do: array operations over all its boxes). When a stream leaves its slot and another
takes it, `reset(slot)` forgets the old stream's state (called from another thread).

A new step is a class with `name`, `run(packets, results)`, `reset(slot)`, `flush()` and `stats()`, and one
line in `build_steps`.
A packet (ingest.batcher.QueuedFrame) is a queued frame: its slot (`stream`), number, pts, capture time, the
frame, and (`read`) where the primary's kernel read it (device memory on the GPU runtime: crops cut there).
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np

from jetpipe.pipelines.core.bus import RecordBus
from jetpipe.pipelines.core.events import EventStep
from jetpipe.pipelines.core.ground import GroundStep
from jetpipe.pipelines.core.tracking import BotSortParams, BotSortTable, make_tracker
from jetpipe.pipelines.core.tracking.camera import CameraMotion, luma
from jetpipe.tasks.detections import Detections

log = logging.getLogger(__name__)


class FrameStep(Protocol):
    name: str

    def run(self, packets: list, results: list[Detections]) -> None:
        """A finished batch's frames and their results (arrays), a stream's in their order."""

    def reset(self, slot: int) -> None:
        """A new stream takes `slot`: what was kept of the last one goes."""

    def flush(self) -> None:
        """What it held back to decide with later frames, decided now (the post stage is idle, or ends)."""

    def stats(self) -> dict:
        """Its part of the run's summary ({}: none)."""


class TrackStep:
    """A track_id for each detected box (pipelines.tracking): botsort keeps every slot's tracks in one table and
    tracks a batch's frames in one pass, moving a moving camera's tracks with it (tracking/camera.py); ByteTrack
    and IoU a tracker per slot."""

    name = "tracker"

    def __init__(self, kind: str, slots: int, first_ids: list[int] | None = None, moving=None, to_host=None,
                 appearance=None):
        """first_ids: the first track ID of each slot's stream (a restarted GPU worker's go on; else 1);
        moving(slot): whether the slot's stream is a moving camera (botsort only); to_host(frame, out): the
        runtime's copy of a frame in device memory into a host array (its first out.nbytes: the luma);
        appearance: the objects' looks for botsort (tracking.appearance.Appearance: embed(jobs))."""
        self.kind = kind
        first_ids = first_ids or [1] * slots
        self.table = BotSortTable(BotSortParams(), first_ids) if kind == "botsort" else None
        self.trackers = [] if self.table is not None else [make_tracker(kind, next_id=n) for n in first_ids]
        self.moving = moving or (lambda slot: False)
        self.cameras: dict[int, CameraMotion] = {}  # a moving camera's slot -> its motion, frame to frame
        self.views: dict[int, np.ndarray] = {}  # and its frame's pixels -> its first frame's (3 x 3)
        self.to_host = to_host
        self.appearance = appearance
        self.lumas: dict[int, np.ndarray] = {}  # a moving camera's slot -> its luma's host copy (frames on the GPU)
        self.camera_counts = {"measured": 0, "not_measured": 0, "on_the_gpu": 0}
        self._reset: list[int] = []  # slots a new stream took (the control API's thread): reset by the frames'

    def run(self, packets: list, results: list[Detections]) -> None:
        while self._reset:
            slot = self._reset.pop()
            self.table.reset(slot)
            self.cameras.pop(slot, None)
            self.views.pop(slot, None)
        times = [packet.pts if packet.pts is not None else packet.t_capture for packet in packets]  # the frames' clock
        if self.table is not None:
            frames = [(packet.stream, found.xyxy, found.confidence, t, self._motion(packet, found))
                      for packet, found, t in zip(packets, results, times)]
            embed = None if self.appearance is None else (  # the crops of the boxes that need a look, of these frames
                lambda jobs: self.appearance.embed([(packets[k].as_read(), boxes) for k, boxes in jobs]))
            for found, ids in zip(results, self.table.update(frames, embed)):
                found.tracker_id = ids
            return
        for packet, found, t in zip(packets, results, times):
            found.tracker_id = self.trackers[packet.stream].update(found.xyxy.astype(np.float64),
                                                                   found.confidence.astype(np.float64), t)

    def _motion(self, packet, found: Detections):
        """A moving camera's motion since its last frame (None: a fixed camera, its first frame, or not
        measured), from the frame's luma with the detections left out."""
        if not self.moving(packet.stream):
            return None
        frame = packet.frame
        height, width = frame.size()
        if frame.device:
            if self.to_host is None or frame.format not in ("nv12", "i420"):
                if not self.camera_counts["on_the_gpu"]:
                    log.warning("stream slot %d: moving_camera: this runtime cannot copy its frames' luma from the "
                                "GPU: its tracks do not follow the camera", packet.stream)
                self.camera_counts["on_the_gpu"] += 1
                return None
            picture = self._luma_from_gpu(packet.stream, frame, height, width)
        else:
            picture = luma(frame.data, frame.format, height, width)
        motion = self.cameras.setdefault(packet.stream, CameraMotion()).estimate(picture, found.xyxy)
        self.camera_counts["measured" if motion is not None else "not_measured"] += 1
        view = self.views.get(packet.stream, np.eye(3))
        if motion is not None:  # first <- last, then last <- this: the inverse of this frame's motion
            view = view @ np.linalg.inv(np.vstack([motion, [0.0, 0.0, 1.0]]))
        self.views[packet.stream] = view
        found.view = view[:2]  # the rules decide where the object is in the first frame's view
        return motion

    def stats(self) -> dict:
        """The run summary's part: the moving cameras' frames whose motion was measured, not measured (too few
        background corners), or left (frames on the GPU of a runtime that cannot copy them); with looks, what
        their model ran (`reid`) and what the tracker learnt of their cosines."""
        counts = self.camera_counts
        looks = {"reid": {**self.appearance.stats(), **self.table.look_stats.summary()}} \
            if self.appearance is not None else {}
        return {**({"moving_cameras": dict(counts)} if any(counts.values()) else {}), **looks}

    def look_of(self, slot: int, track_id: int) -> np.ndarray | None:
        """A confirmed track's look now (botsort with looks; None: no such track, or no look yet)."""
        rows = np.flatnonzero((self.table.slot == slot) & (self.table.ids == track_id)) if self.table else ()
        if not len(rows) or not np.isfinite(self.table.look_t[rows[0]]):
            return None
        return self.table.look[rows[0]]

    def _luma_from_gpu(self, slot: int, frame, height: int, width: int) -> np.ndarray:
        """A device frame's Y plane (its first height x width bytes: NV12 and I420 start with it), copied into
        the slot's host buffer (made at its first frame, again only if the size changes)."""
        out = self.lumas.get(slot)
        if out is None or out.shape != (height, width):
            out = self.lumas[slot] = np.empty((height, width), np.uint8)
        self.to_host(frame, out)
        return out

    def reset(self, slot: int) -> None:
        if self.table is not None:
            self._reset.append(slot)  # the new stream's tracks number from 1
        else:
            self.trackers[slot] = make_tracker(self.kind)  # the new stream's tracks number from 1

    def flush(self) -> None:
        """Nothing held back: each frame's tracks are its record's."""


def build_steps(config, slots: int, labels=None, stream_id=None, bus=None, first_ids=None,
                counts=None, moving=None, to_host=None, appearance=None) -> list[FrameStep]:
    """The steps the configuration asks for, in the order they run. labels: the model's class names;
    stream_id(slot): the ID of a slot's stream; bus: the record bus the events are published on (bus.RecordBus;
    their frames kept where a subscriber takes frames); first_ids: each slot's first track ID,
    counts: each rule's counts so far (a restarted GPU worker's go on: streams.Resume; None: from 1 and 0);
    moving(slot): whether a slot's stream is a moving camera; to_host: the runtime's frame_to_host;
    appearance: botsort's looks (tracking.appearance.Appearance; None: by motion only)."""
    steps: list[FrameStep] = []
    bus = bus if bus is not None else RecordBus()
    tracks = None
    if config.tracker != "none":
        tracks = TrackStep(config.tracker, slots, first_ids, moving, to_host, appearance)
        steps.append(tracks)
    if config.calibrations and config.tracker != "none":  # positions and speeds of the tracks, for the events too
        steps.append(GroundStep(config.calibrations, stream_id or (lambda slot: slot)))
    # after the tracker: events are facts about tracks; with the control API rules may come later (/rules)
    if config.zones or config.lines or (config.control.enabled and config.tracker != "none"):
        look_of = tracks.look_of if config.reid_in_events and appearance is not None else None
        steps.append(EventStep([*config.zones, *config.lines], labels, stream_id, bus.publish, bus.wants_frames(),
                               counts, look_of))
    return steps
