"""Each tracked object's position on the ground, its speed and heading, from its stream's calibration.

The step runs after the tracker and before the events: a confirmed track's anchor (bottom-centre: where it
stands) goes through its stream's plane (calibration.py) to metres, with its time (the frames' clock: pts; a
box the frame's edge cuts gives none: its anchor slides), and its velocity is the slope of a straight-line fit
(least squares) of its positions over the calibration's `window_s` (window.py: running sums). A fit over a
second and more of frames, not the step between two frames: box jitter of a few pixels is metres far away,
and it averages out over the window's frames; a missed frame is just a missing sample. A track has a speed
once its positions span half the window.

One batch is one array operation over all its tracked boxes (a stream with two frames in a batch: two, in
order); the tracks' sums are rows of one table (events.columns.TrackTable).
"""

from __future__ import annotations

import math

import numpy as np

from jetpipe.pipelines.core.events.columns import TrackBatch, TrackTable
from jetpipe.pipelines.core.ground.calibration import Planes
from jetpipe.pipelines.core.ground.window import WindowFits, heading_degrees
from jetpipe.tasks.detections import NO_TRACK, Ground

MAX_TRACKS = 8192    # tracks kept at once over all streams (the one seen longest ago goes first)
MIN_SPAN = 0.5       # of the window: the positions must span this much of it before a speed is given
EDGE = 0.01         # of the frame's width: a box this close to its left, right or bottom edge is cut by it
#                     (a detector's box of a cut object stops a few pixels short of the edge)
STANDING_KMH = 1.0   # below: no heading (a standing object's jitter points anywhere)


class GroundMotion:
    """Every tracked object's fit of its ground positions, over all streams; estimate() a batch."""

    def __init__(self, calibrations: dict):
        """calibrations: stream ID -> calibration.Calibration (fitted: its `plane`)."""
        self.calibrations = calibrations
        self.planes = Planes(calibrations)
        self.table = TrackTable(max_rows=MAX_TRACKS)
        self.fits = WindowFits()

    def _fit(self) -> None:
        self.fits.grow(self.table.capacity)
        if self.table.dropped:
            self.fits.clear(self.table.dropped)
            self.table.dropped = []

    def estimate(self, batch: TrackBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each box's (N, 2) ground position in metres, speed in km/h and heading in degrees (NaN: none; the
        heading from the world's x axis towards its y axis)."""
        n = len(batch)
        position, speed, heading = np.full((n, 2), math.nan), np.full(n, math.nan), np.full(n, math.nan)
        if not n:
            return position, speed, heading
        rows = self.table.rows(batch)
        self._fit()
        window = self._positions(batch, position)
        for at in batch.parts(None):
            boxes = np.arange(n) if at is None else at
            boxes = boxes[np.isfinite(position[boxes, 0])]
            t = batch.t[boxes]
            velocity, enough = self.fits.add(rows[boxes], t, position[boxes], window[boxes])
            enough &= self.fits.span(rows[boxes], t) >= MIN_SPAN * window[boxes]
            metres = np.hypot(velocity[:, 0], velocity[:, 1])
            speed[boxes] = np.where(enough, metres * 3.6, math.nan)
            heading[boxes] = np.where(enough & (metres * 3.6 >= STANDING_KMH), heading_degrees(velocity), math.nan)
        if self.table.batches % 256 == 0:
            for row in np.flatnonzero(self.table.unseen()).tolist():
                self.table.drop(row)
        return position, speed, heading

    def _positions(self, batch: TrackBatch, position: np.ndarray) -> np.ndarray:
        """Each box's ground position (written into `position`; NaN: none, its stream uncalibrated, above the
        horizon or cut by the frame's edge), and its stream's window."""
        x, y = batch.anchors((0.5, 1.0))
        if batch.size is not None:
            height, width = (float(v) for v in batch.size)
        else:
            height, width = batch.height, batch.width
        position[:], window = self.planes.to_ground(batch.stream, x, y, width, height)
        position[_at_the_edge(batch)] = math.nan
        return window

    def reset(self, stream: int) -> None:
        self.table.drop_stream(stream)
        self._fit()


def _at_the_edge(batch: TrackBatch) -> np.ndarray:
    """Boxes the frame cuts (touching its left, right or bottom edge): their bottom-centre is not where the
    object stands, and it moves as the frame cuts more or less of it."""
    if batch.size is not None:
        height, width = (float(v) for v in batch.size)
    else:
        height, width = batch.height, batch.width
    margin = EDGE * width
    x1, _, x2, y2 = batch.box.T
    return (x1 <= margin) | (x2 >= width - margin) | (y2 >= height - margin)


class GroundStep:
    """Positions, speeds and headings of the tracked boxes of streams with a calibration (steps.FrameStep)."""

    name = "ground"

    def __init__(self, calibrations: list, stream_id):
        """calibrations: calibration.Calibration (checked); stream_id(slot): the ID of a slot's stream."""
        self.motion = GroundMotion({c.stream: c for c in calibrations})
        self.stream_id = stream_id
        self._slot_ids: dict[int, int] = {}
        self._left: list[int] = []  # streams whose slot another took: forgotten by the frames' thread

    def run(self, packets: list, results: list) -> None:
        while self._left:
            self.motion.reset(self._left.pop())
        frames, placed = [], []
        for packet, found in zip(packets, results):
            stream = self._slot_ids[packet.stream] = self.stream_id(packet.stream)
            if stream not in self.motion.calibrations or found.tracker_id is None:
                continue
            t = packet.pts if packet.pts is not None else packet.t_capture
            frames.append((stream, t, packet.frame.size(), found))
            placed.append(found)
        if not frames:
            return
        position, speed, heading = self.motion.estimate(TrackBatch(frames))
        start = 0
        for found in placed:
            tracked = np.flatnonzero(found.tracker_id != NO_TRACK)
            end = start + len(tracked)
            found.ground = Ground.at(len(found), tracked, position[start:end], speed[start:end], heading[start:end])
            start = end

    def reset(self, slot: int) -> None:
        """A new stream takes `slot` (the control API's thread): the old stream's tracks go at the next batch."""
        old = self._slot_ids.pop(slot, None)
        if old is not None:
            self._left.append(old)

    def flush(self) -> None:
        """Nothing held back."""

    def stats(self) -> dict:
        """Nothing for the run's summary."""
        return {}
