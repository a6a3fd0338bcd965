"""Per-frame steps: what runs on each frame's results after the model's own postprocessing, in order.

The post stage calls every step of the list the daemon builds (`build_steps`) on each frame of a finished
batch, one stream's frames in their order, in one thread. A step may add to the frame's results (the
tracker's `track_ids`) or read what earlier steps added (a zone counter reads the tracks). When a stream
leaves its slot and another takes it, `reset(slot)` forgets the old stream's state.

A new step is a class with `name`, `__call__(slot, packet, results)` and `reset(slot)`, and one line in
`build_steps`. The packet (batcher.Packet) is the frame's: its number, pts, capture time and the frame.
"""

from __future__ import annotations

from typing import Protocol

from jetpipe.pipelines.events import EventStep
from jetpipe.pipelines.tracking import Tracker


class FrameStep(Protocol):
    name: str

    def __call__(self, slot: int, packet, results: dict) -> None:
        """One frame's results of the stream in `slot`."""

    def reset(self, slot: int) -> None:
        """A new stream takes `slot`: what was kept of the last one goes."""


class TrackStep:
    """A track_id for each detected box: a tracker per stream slot (pipelines.tracking)."""

    name = "tracker"

    def __init__(self, kind: str, slots: int):
        self.kind = kind
        self.trackers = [Tracker(kind) for _ in range(slots)]

    def __call__(self, slot: int, packet, results: dict) -> None:
        results["track_ids"] = self.trackers[slot].update(results["boxes"], results["scores"])

    def reset(self, slot: int) -> None:
        self.trackers[slot] = Tracker(self.kind)  # the new stream's tracks number from 1


def build_steps(config, slots: int, labels=None, stream_id=None, deliver=None) -> list[FrameStep]:
    """The steps the configuration asks for, in the order they run. labels: the model's class names;
    stream_id(slot): the ID of a slot's stream; deliver(record): to the sinks (for the events' records)."""
    steps: list[FrameStep] = []
    if config.tracker != "none":
        steps.append(TrackStep(config.tracker, slots))
    # after the tracker: events are facts about tracks; with the control API rules may come later (/rules)
    if config.zones or config.lines or (config.control.enabled and config.tracker != "none"):
        steps.append(EventStep([*config.zones, *config.lines], labels, stream_id, deliver))
    return steps
