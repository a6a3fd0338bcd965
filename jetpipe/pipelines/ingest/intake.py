"""Ingest: the streams' sources opened and placed in their slots, read into their rings, and taken out again.

Sources are opened at start-up (and by the control API while serving) by jetpipe.pipelines.ingest.sources, or by
the decode processes for NVDEC files where asked (decode_procs; their link to this process:
decoded_elsewhere). Every slot's rings are allocated at start-up (rings). A stream is read by capture.Capture
in a thread of its own or a shared one (capture.CaptureGroup). A stream removed stops its source; once its
queued and in-flight frames are through, its slot is free for the next.
"""

from __future__ import annotations

import logging

from jetpipe.errors import JetpipeError
from jetpipe.limits import MAX_SIDE
from jetpipe.pipelines.config import ConfigError
from jetpipe.pipelines.counters import live_counts
from jetpipe.pipelines.ingest import decode_choice, rings
from jetpipe.pipelines.ingest.capture import Capture, CaptureGroup, capture_threads
from jetpipe.pipelines.ingest.decode_procs import DecodeProcesses, RemoteNvdecSource
from jetpipe.pipelines.ingest.decoded_elsewhere import DecodedElsewhere
from jetpipe.pipelines.ingest.sources import open_source, probed_size
from jetpipe.pipelines.ingest.streams import ControlError, Stream
from jetpipe.runtime.nvdec import decodes_to_device, hardware_decoder
from jetpipe.uri import parse as parse_uri
from jetpipe.uri import synthetic_spec

log = logging.getLogger(__name__)


def frame_bound(config) -> tuple[int, int]:
    """The frame buffers' bound: max_frame_hw where it was set; else the default grown to the largest video file
    among the sources (probed: a portrait 1080x1920 or a 4K file no longer needs a setting). Cameras, streams
    and synthetic cameras are not probed: beyond the default they need max_frame_hw (--max-frame-size)."""
    height, width = config.max_frame_hw
    if config.max_frame_set:
        return height, width
    for spec in config.sources:
        size = probed_size(spec.uri)
        if size and (size[0] > height or size[1] > width):
            height, width = min(MAX_SIDE, max(height, size[0])), min(MAX_SIDE, max(width, size[1]))
    if (height, width) != tuple(config.max_frame_hw):
        log.info("frame buffers sized for %dx%d frames (the largest video file; max_frame_hw sets a bound)",
                 width, height)
    return height, width


class Ingest:
    def __init__(self, config, runtime, streams, batcher, metrics, stopping, start_thread, on_retired):
        """start_thread(target, role, *args, name=None): a started thread whose CPU the daemon counts under role;
        on_retired(stream): a stream left its slot, its frames all through (its sinks' outputs end)."""
        self.config, self.runtime, self.streams, self.batcher, self.metrics = config, runtime, streams, batcher, metrics
        self.stopping, self.start_thread, self.on_retired = stopping, start_thread, on_retired
        self.control = config.control.enabled  # streams come and go: spare slots get rings too
        self.capture = Capture(config, streams, batcher, metrics, stopping)
        self.opened: list = []  # the sources opened at start-up, closed with the rest at close()
        self.decoders = self._decode_processes(streams.capacity)
        self.capture_groups = [CaptureGroup(f"capture-{k}", batcher.room_condition(), batcher.has_room, stopping,
                                            lambda target, name: start_thread(target, "sources", name=name))
                               for k in range(min(streams.capacity, capture_threads(config.capture_threads)))]

    def open_configured(self) -> None:
        """The configured sources, opened and checked, each in its slot with its rings (those of the spare
        slots too)."""
        for i, spec in enumerate(self.config.sources):
            self.opened.append(self.open_source(spec, i))
            self.check_frame_size(self.opened[-1])
        rings.allocate(self.runtime, self.streams, self.config, self.opened, self.streams.capacity,
                       exact=not self.control)
        for i, (spec, source) in enumerate(zip(self.config.sources, self.opened)):
            self.streams.take(i, self.streams.choices[i][0], spec, source)
        for slot in range(len(self.opened), self.streams.capacity):
            self.metrics.labels[slot] = None  # spare: no stream yet

    def _decode_processes(self, capacity: int) -> DecodeProcesses | None:
        """The decode processes NVDEC files are decoded in (decode_processes; "auto": decode_choice), or None:
        none asked or chosen, or no NVDEC here. At most one a stream."""
        asked = self.config.decode_processes
        if not asked:
            return None
        if not decodes_to_device(self.runtime):
            if asked != decode_choice.AUTO:
                log.info("decode_processes = %d: no NVDEC here (the GPU runtime and PyNvVideoCodec on a discrete "
                         "GPU); sources are decoded in this process", asked)
            return None
        if asked == decode_choice.AUTO:
            asked = self._chosen_decode_processes()
            if not asked:
                return None
        return DecodeProcesses(min(asked, capacity), self.runtime.device, DecodedElsewhere(self.capture),
                               lambda target, name: self.start_thread(target, "sources", name=name),
                               streams=capacity, threads=self.config.decode_threads)

    def _chosen_decode_processes(self) -> int:
        """decode_processes = "auto": by the NVDEC files configured and the model's rate, measured now where
        they are enough to matter (said in the log; streams added later go where this put them)."""
        files = [spec for spec in self.config.sources if _decodable_elsewhere(spec)]
        engine_fps = self.runtime.max_batch_fps() if len(files) >= decode_choice.MIN_FILES else None
        choice = decode_choice.choose(len(files), sum(spec.realtime for spec in files), engine_fps,
                                      clips=bool(self.config.clips.folder))
        log.info("decode_processes auto: %s", choice.why)
        return choice.processes

    def open_source(self, spec, seed: int):
        uri = parse_uri(spec.uri)
        if uri.scheme == "synthetic":  # its size is in its URI: refused before it renders (8192x8192: 34 s, 4.8 GB)
            width, height, _, _ = synthetic_spec(uri)
            self._check_size(spec.uri, width, height)
        if self.decoders is not None and _decodable_elsewhere(spec):
            source = self.decoders.open(parse_uri(spec.uri), spec.loop, spec.realtime, self.config.frames)
            if not isinstance(source, str):
                return source
            log.warning("source %s: NVDEC cannot decode it (%s): decoding with FFmpeg", spec.uri, source)
            return open_source(spec.uri, spec.loop, seed=seed, realtime=spec.realtime,
                               streams=self.streams.capacity)
        return open_source(spec.uri, spec.loop, seed=seed, realtime=spec.realtime, decoder=spec.decoder,
                           hwaccel=spec.hwaccel, hardware=hardware_decoder(self.runtime),
                           streams=self.streams.capacity)

    def check_frame_size(self, source) -> None:
        if source.info is not None:
            self._check_size(source.uri, source.info.width, source.info.height)

    def _check_size(self, uri: str, width: int, height: int) -> None:
        max_h, max_w = self.config.max_frame_hw
        if height > max_h or width > max_w:
            raise ConfigError(f"source {uri}: frames are {width}x{height}, larger than max_frame_hw [{max_h}, "
                              f"{max_w}]: set [pipeline] max_frame_hw = [{max(height, max_h)}, {max(width, max_w)}] "
                              f"(--max-frame-size {max(height, max_h)}x{max(width, max_w)})")

    # --- capture ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Every stream in a slot now starts being read: those not started already (the control API listens
        from start-up, and starts a stream it adds at once: a second start was a second reader of its source)."""
        if self.decoders is not None:
            self.decoders.mark_cpu()
        with self.streams.lock:
            for stream in self.streams.live():
                if not stream.started:
                    self.start_capture(stream)

    def start_capture(self, stream: Stream) -> None:
        """A stream whose reads never block for long is read by a shared capture thread (the least loaded),
        any other by a thread of its own."""
        stream.started = True
        if isinstance(stream.source, RemoteNvdecSource):  # its frames come from a decode process
            self.batcher.room_waiter(stream.slot, self.decoders.waker(stream))
            self.decoders.start(stream)
            return
        if self.capture_groups and stream.source.shares_thread:
            group = min(self.capture_groups, key=len)
            stream.source.paced_by_caller = True
            self.batcher.room_waiter(stream.slot, group.room)
            group.add(stream, self.capture.steps(stream, shared=True))
            return
        self.batcher.room_waiter(stream.slot, None)
        self.start_thread(self.capture.run, "sources", stream)

    def capturing(self) -> bool:
        return any(s.capturing() for s in self.streams.live())

    def stop(self) -> None:
        """Every source's blocked read or open interrupted, every capture thread woken to see the stop. The
        results from now on are the drain's (the summary reports them apart from the run's)."""
        self.metrics.start_drain()
        for stream in self.streams.live():
            interrupt(stream)
        self.wake()

    def wake(self) -> None:
        for group in self.capture_groups:
            group.wake()
        if self.decoders is not None:
            self.decoders.wake()

    # --- streams added and removed while serving (the control API) -------------------------------
    def add(self, spec, reset_slot, prepare=None) -> Stream:
        """Serve one more source in a free slot (its rings allocated at start-up); reset_slot(slot): what the
        stages kept of the slot's last stream goes; prepare(stream): before its first read (the clips' ring
        takes its packets from the first). ControlError: the source cannot be opened or is too large
        (422), no free slot takes it (409), the daemon is stopping (503)."""
        if self.stopping.is_set():
            raise ControlError(503, "the daemon is stopping: no stream can be added")
        try:  # outside the lock: a file is probed now, a network stream only named
            source = self.open_source(spec, seed=self.streams.next_id)
        except JetpipeError as exc:
            raise ControlError(422, str(exc)) from None
        try:
            stream = self._place(spec, source, reset_slot, prepare)
        except BaseException:
            source.close()
            raise
        log.info("stream %d added: %s (slot %d)", stream.id, spec.uri, stream.slot)
        return stream

    def _place(self, spec, source, reset_slot, prepare=None) -> Stream:
        try:
            self.check_frame_size(source)
        except ConfigError as exc:
            raise ControlError(422, str(exc)) from None
        hw, device, fmt = rings.ring_need(source, self.config.max_frame_hw)
        with self.streams.lock:
            place = self.streams.ring_for(hw, device, fmt)
            if place is None and self.free_ended():
                place = self.streams.ring_for(hw, device, fmt)
            if place is None:
                raise ControlError(409, self._no_room(source, device, hw))
            if self.stopping.is_set():
                raise ControlError(503, "the daemon is stopping: no stream can be added")
            slot, ring = place
            self.metrics.assign(slot, str(self.streams.next_id))
            self.batcher.reset(slot)
            self.capture.last_frame[slot] = None
            reset_slot(slot)
            stream = self.streams.take(slot, ring, spec, source)
            if prepare is not None:
                prepare(stream)
            self.start_capture(stream)
        return stream

    def _no_room(self, source, device: bool, hw: tuple[int, int]) -> str:
        if len(self.streams.live()) == self.streams.capacity:
            return (f"all {self.streams.capacity} stream slots are taken (max_streams): remove a stream first "
                    "(DELETE /streams/ID), or restart with a larger [control] max_streams")
        return (f"no free stream slot takes {hw[1]}x{hw[0]} frames in {'device' if device else 'host'} memory "
                f"({source.describe()}); free slots take {self.streams.describe_free()}: choose another decoder, "
                "or restart with a larger max_frame_hw")

    def remove(self, stream: Stream, wait_s: float) -> bool:
        """Stop a stream's source; its queued and in-flight frames finish and reach the sinks, then its slot is
        free. True once that is done, False if it takes longer than wait_s."""
        stream.state = "stopping"
        stream.stop.set()
        interrupt(stream)
        self.wake()
        with self.streams.changed:
            return self.streams.changed.wait_for(lambda: stream.state == "removed", timeout=wait_s)

    def _drained(self, stream: Stream) -> bool:
        """Its capture ended and every frame it captured is through (its ring's slots all free again)."""
        return not stream.capturing() and self.streams.rings[stream.slot].in_use() == 0

    def free_removed(self) -> None:
        """Streams whose removal was asked and whose frames are all through leave their slots."""
        for stream in self.streams.live():
            if stream.state == "stopping" and self._drained(stream):
                self._retire(stream)

    def free_ended(self) -> bool:
        """A slot for a new stream: the longest-ended stream (its source ended; all its frames through)."""
        ended = [s for s in self.streams.live() if s.state == "ended" and self._drained(s)]
        if ended:
            self._retire(min(ended, key=lambda s: s.id))
        return bool(ended)

    def _retire(self, stream: Stream) -> None:
        counts = live_counts(stream, self.metrics, self.batcher)
        self.metrics.vacate(stream.slot)
        stream.source.close()
        self.on_retired(stream)  # its last frame was offered before its ring slot was released
        self.streams.free(stream, counts)
        log.info("stream %d removed (%s): %d captured, %d processed, %d dropped, %d failed", stream.id,
                 stream.spec.uri, counts["captured"], counts["processed"], counts["dropped"], counts["failed"])

    def decode_errors(self) -> list[int]:
        """Per slot (vacant: 0)."""
        return [s.source.decode_errors if s is not None else 0 for s in list(self.streams.slots)]

    def close(self) -> None:
        """Every source closed (those opened at start-up that never reached a slot too), then the decoders. A
        source whose capture thread is still in a read (left behind at a stop) stays open: FFmpeg's decoder
        closed under a decode aborted the whole process (SIGABRT, the CI machine under load)."""
        reading = {id(s.source) for s in self.streams.live() if s.capturing()}
        for source in [*self.opened, *(s.source for s in self.streams.live())]:
            if id(source) in reading:
                log.warning("source %s: its capture is still in a read: left open", source.uri)
                continue
            try:
                source.close()
            except Exception as exc:
                log.warning("while closing %s: %s", source.uri, exc)
        if self.decoders is not None:
            self.decoders.close()


def interrupt(stream: Stream) -> None:
    """Unblock a stream's read or open in progress (stopping, or its removal)."""
    try:
        stream.source.interrupt()
    except Exception as exc:
        log.warning("source %s: %s while stopping", stream.spec.uri, exc)


def _decodable_elsewhere(spec) -> bool:
    """A video file NVDEC may decode in a decode process (what it cannot take is then decoded here)."""
    if spec.decoder not in ("auto", "nvdec") or spec.hwaccel:
        return False
    uri = parse_uri(spec.uri)
    return uri.scheme == "file" and uri.path.is_file()
