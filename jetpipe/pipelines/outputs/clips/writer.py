"""Clips around events: each stream's packets kept in a ring (ring.py), an MP4 cut from them around an event or
a control API request (cut.py), a `clip_ready` record in the sinks when the file is complete.

A request covers [t - before_s, t + after_s] on the stream's frame clock; it is cut once the ring holds its
end (or the stream ended). Requests of one stream that overlap are merged into one clip. The folder is kept
within max_total_mb and max_age_h, room made before each clip is written (the oldest clips go). A clip that
cannot be written (a full disk) is counted and said; serving goes on.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from jetpipe.errors import worth_logging
from jetpipe.pipelines.config import CLIPS_AUTO_MB, ConfigError
from jetpipe.pipelines.ingest.packet_ring import PacketRing, shared_ring
from jetpipe.pipelines.ingest.streams import ControlError
from jetpipe.pipelines.outputs.clips.cut import open_template, write_clip
from jetpipe.pipelines.outputs.retention import Room

log = logging.getLogger(__name__)

CLIP_SCHEMA = "jetpipe.clip/1"
WAIT_AFTER_END_S = 30.0   # a request waits this long past its end for the ring to get there (a stalled stream)
CLOSE_WAIT_S = 5.0        # at the stop, clips still being cut get this long
MAX_MERGED_S = 60.0        # requests merge into one clip up to this length (a scene busy for an hour: many)
MAX_SECONDS = 300.0        # before_s and after_s, at most (the config's bound too)
LAG_S, LAG_FRAMES = 2.0, 64  # a ring keeps this much more than a clip asks for (see attach)
SUFFIX = ".mp4"
CLIP_OVERHEAD = 64 * 1024  # a clip's MP4 boxes beyond its packets and their index entries, at most
CLIP_NAME = re.compile(r"stream\d+-(-)?\d{7}\.\d{3}-\d+\.mp4")  # stream{ID}-{first frame's time}-{n}.mp4


@dataclass
class ClipRecord:
    """`jetpipe.clip/1`: {"schema", "type": "clip_ready", "stream", "path", "start", "end" (the clip's first
    and last frame times, seconds on the stream's frame clock), "asked": [start, end], "events": [event_id,
    ...] (empty for a control API request), "bytes", "packets"}."""
    stream: int
    path: str
    start: float
    end: float
    asked: list
    events: list
    bytes: int
    packets: int
    type: str = "clip_ready"

    def json(self) -> str:
        return json.dumps({"schema": CLIP_SCHEMA, "type": self.type, "stream": self.stream, "path": self.path,
                           "start": self.start, "end": self.end, "asked": self.asked, "events": self.events,
                           "bytes": self.bytes, "packets": self.packets}, separators=(",", ":"))


@dataclass
class _Request:
    stream: int
    start: float
    end: float
    events: list = field(default_factory=list)
    asked_at: float = field(default_factory=time.monotonic)
    packets: list | None = None  # taken from the ring before it started again: cut these


class Clips:
    def __init__(self, config, deliver):
        """config: ClipsConfig (checked); deliver(record): each clip_ready record published (the record bus)."""
        self.config, self.deliver = config, deliver
        self.folder = Path(config.folder)
        self.rings: dict[int, PacketRing] = {}
        self.pending: list[_Request] = []
        self.cond = threading.Condition()
        self.closing = False
        self.written = self.failed = 0
        self._forgotten_cpu_s = 0.0  # the rings of removed streams
        self.cpu_s = 0.0  # this thread's CPU time, when it ended (cutting and writing the clips)
        self._names = itertools.count(1)
        # the folder within max_total_mb and max_age_h, room made before each clip (the oldest clips go)
        self.room = Room(self.folder, CLIP_NAME, config.max_total_mb or CLIPS_AUTO_MB, config.max_age_h)
        self.thread = threading.Thread(target=self._run, name="clips", daemon=True)
        self.thread.start()

    # -- streams ------------------------------------------------------------------------------------------------
    def attach(self, stream_id: int, source, at_start: bool = True) -> None:
        """A ring for the stream where its source gives its packets (a file decoded in-process); said where it
        does not. A ring its stream's bitrate would overflow: one line (ConfigError) at start-up; a stream added
        later serves without clips (said)."""
        if not source.keeps_packets:
            log.warning("stream %d (%s): no clips: its frames come decoded, without the compressed packets a "
                        "clip is made of", stream_id, source.describe())
            return
        fps = source.info.fps if source.info is not None and source.info.fps > 0 else 30.0  # a camera's: at open
        # what a clip asks for, and the frames between the source's read and its event's request (queued,
        # batched, gathered by the events step): the source reads that far ahead of the events
        keep_s = self.config.before_s + self.config.after_s + max(LAG_S, LAG_FRAMES / fps)
        need_mb = keep_s * source.bit_rate / 8e6
        if need_mb > self.config.ring_mb:
            why = (f"clips: stream {stream_id} ({source.describe()}) needs about {need_mb:.0f} MB for {keep_s:.0f} "
                   f"s of its packets, more than ring_mb = {self.config.ring_mb:g}: raise ring_mb or shorten "
                   "before_s / after_s")
            if at_start:
                raise ConfigError(why)
            log.warning("%s; it serves without clips", why)
            return
        ring = shared_ring(source, keep_s, int(self.config.ring_mb * 1e6))
        ring.on_restart = lambda: self._cut_waiting(stream_id)
        source.packet_ring = ring
        with self.cond:
            self.rings[stream_id] = ring
        log.info("stream %d: clips from its packets: the last %.1f s kept (about %.1f MB, at most %g MB)",
                 stream_id, keep_s, need_mb, self.config.ring_mb)

    def attach_all(self, streams) -> None:
        for stream in streams:
            self.attach(stream.id, stream.source)

    def removed(self, stream_id: int) -> None:
        """The stream was removed: waiting clips are cut with what its ring holds, then the ring goes."""
        ring = self.rings.get(stream_id)
        if ring is not None:
            ring.end()
            with self.cond:
                ring.forget = True
                self.cond.notify()

    # -- requests -----------------------------------------------------------------------------------------------
    def on_event(self, record) -> None:
        """An event record (from the record bus): a clip around it where its type asks for one."""
        if record.type in self.config.on and record.stream in self.rings:
            t = record.pts if record.pts is not None else record.time
            self.request(record.stream, t - self.config.before_s, t + self.config.after_s, record.event_id)

    def request(self, stream_id: int, start: float, end: float, event_id: str | None = None) -> dict:
        """A clip of [start, end] (the stream's frame clock), merged with a waiting one of the stream it
        overlaps."""
        ring = self.rings.get(stream_id)
        with self.cond:
            for waiting in self.pending:
                if waiting.packets is not None:  # its packets were taken: it grows no more
                    continue
                if waiting.stream == stream_id and start <= waiting.end and end >= waiting.start and \
                        max(end, waiting.end) - min(start, waiting.start) <= MAX_MERGED_S:
                    waiting.start, waiting.end = min(waiting.start, start), max(waiting.end, end)
                    waiting.events += [event_id] if event_id else []
                    if ring is not None:
                        ring.pin(id(waiting), waiting.start)
                    return {"stream": stream_id, "start": waiting.start, "end": waiting.end, "merged": True}
            request = _Request(stream_id, start, end, [event_id] if event_id else [])
            self.pending.append(request)
            if ring is not None:
                ring.pin(id(request), start)
            self.cond.notify()
        return {"stream": stream_id, "start": start, "end": end, "merged": False}

    def around_now(self, stream_id: int, asked) -> dict:
        """A clip of a stream around its newest packet (the control API: {"before_s", "after_s"}, both optional,
        checked here: ControlError 400 / 409)."""
        if stream_id not in self.rings:
            raise ControlError(409, f"stream {stream_id} gives no compressed packets (its frames come decoded): no "
                                    "clips of it")
        seconds = {"before_s": self.config.before_s, "after_s": self.config.after_s}
        where = f"POST /streams/{stream_id}/clips"
        if not isinstance(asked, dict) or set(asked) - set(seconds):
            raise ControlError(400, f'{where}: send {{"before_s": S, "after_s": S}} (both optional)')
        for key, value in asked.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_SECONDS:
                raise ControlError(400, f"{where}: {key} = {value!r}: seconds from 0 to {MAX_SECONDS:g}")
            seconds[key] = float(value)
        now = self.rings[stream_id].newest
        if now == float("-inf"):  # its source has not given a packet yet (connecting, or a first GOP on the way)
            raise ControlError(409, f"{where}: stream {stream_id} has no packets yet: ask again once it gives frames")
        return self.request(stream_id, now - seconds["before_s"], now + seconds["after_s"])

    # -- the clips' thread --------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self.cpu_s = time.thread_time()

    def _serve(self) -> None:
        while True:
            with self.cond:
                ready = self._ready()
                while not ready and not self.closing:
                    self.cond.wait(timeout=0.1)
                    ready = self._ready()
                if not ready and self.closing:
                    return
                for request in ready:
                    self.pending.remove(request)
            for request in ready:
                self._cut(request)
            self._drop_forgotten()

    def _cut_waiting(self, stream_id: int) -> None:
        """The stream's clock went back (NVDEC's looped file starting its next pass): the clips waiting for it
        take what its ring holds before it starts again (the source's thread), and the cutting thread cuts them
        (a source's thread never writes a file: its frames would wait)."""
        with self.cond:
            ring = self.rings.get(stream_id)
            if ring is None:
                return
            for request in self.pending:
                if request.stream == stream_id and request.packets is None:
                    request.packets = ring.between(request.start, request.end)
                    ring.unpin(id(request))
            self.cond.notify()

    def _drop_forgotten(self) -> None:
        """The rings of removed streams, once no clip waits for them (their memory back)."""
        with self.cond:
            waited = {r.stream for r in self.pending}
            for stream_id in [s for s, ring in self.rings.items() if ring.forget and s not in waited]:
                ring = self.rings.pop(stream_id)
                ring.close()
                self._forgotten_cpu_s += ring.cpu_s

    def _ready(self) -> list[_Request]:
        """Requests whose end the ring holds (or will never hold: the stream ended, it waited long enough, or
        the run is stopping)."""
        now = time.monotonic()
        return [r for r in self.pending
                if self.closing or r.packets is not None or r.stream not in self.rings
                or self.rings[r.stream].covers(r.end) or now - r.asked_at > WAIT_AFTER_END_S + (r.end - r.start)]

    def _cut(self, request: _Request) -> None:
        ring = self.rings.get(request.stream)
        packets = request.packets
        if packets is None:
            packets = ring.between(request.start, request.end) if ring is not None else []
        if ring is not None:
            ring.unpin(id(request))
        if not packets:
            self._fail(request, "its ring holds no packets of that time")
            return
        path = None
        while path is None or path.exists():  # a clip of an earlier run is never overwritten
            path = self.folder / f"stream{request.stream}-{packets[0].t:011.3f}-{next(self._names)}{SUFFIX}"
        size = sum(len(p.data) for p in packets)
        try:
            self.room.make(size + CLIP_OVERHEAD + 32 * len(packets))  # its index: an entry a packet
            if ring.opened is None:
                ring.opened = open_template(ring, packets)
            write_clip(path, ring.opened, ring.time_base, packets)
            self.room.wrote(path.stat().st_size)
        except Exception as exc:  # a full disk, a file gone: counted and said, serving goes on
            self._fail(request, str(exc)[:200])
            return
        self.written += 1
        shown = sorted(p.t for p in packets)
        self.deliver(ClipRecord(request.stream, str(path), round(shown[0], 6), round(shown[-1], 6),
                                [round(request.start, 6), round(request.end, 6)], request.events, size, len(packets)))

    def _fail(self, request: _Request, why: str) -> None:
        self.failed += 1
        if worth_logging(self.failed):
            log.warning("clip of stream %d [%.3f, %.3f] not written (#%d): %s", request.stream, request.start,
                        request.end, self.failed, why)

    def summary(self) -> dict:
        """cpu_s: what clips cost, the sum of rings_s (keeping packets, in the sources' threads: their CPU time,
        PacketRing.clock) and cutting_s (the cutting thread's CPU time)."""
        kept = sum(ring.cpu_s for ring in self.rings.values()) + self._forgotten_cpu_s
        return {"written": self.written, "failed": self.failed, "waiting": len(self.pending),
                "cpu_s": round(kept + self.cpu_s, 3), "rings_s": round(kept, 3), "cutting_s": round(self.cpu_s, 3)}

    def close(self) -> None:
        """Cut what is waiting with what the rings hold (bounded by CLOSE_WAIT_S), then stop."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        self.thread.join(timeout=CLOSE_WAIT_S)
        if not self.thread.is_alive():  # else it still writes with them: they go with the process
            for ring in list(self.rings.values()):
                ring.close()


def open_clips(config, bus, streams, closers: list) -> Clips | None:
    """The clips writer where [clips] folder is set (None elsewhere): the configured streams' rings attached, its
    close among the closers, the events it cuts clips around subscribed to."""
    if not config.clips.folder:
        return None
    clips = Clips(config.clips, bus.publish)
    closers.append(clips.close)
    clips.attach_all(streams)
    bus.subscribe(clips.on_event, types=config.clips.on)
    return clips
