"""The video-stream daemon: sources -> batcher -> runtime -> postprocess -> sinks.

Threads: capture (each source read into its ring: a thread per source, or for sources whose reads never
block for long, a few threads each reading several in turn: pipelines.capture), one GPU stage (submits each
batch as it forms), one postprocess stage (collects each batch as the GPU
finishes it and reads its outputs in place while later batches run: the runtime
holds that buffer set until it is released), with secondary models one secondary
stage (reads the crops of a batch while the postprocess stage finishes the next
one; the batch's frames stay where the kernel read them until it is done), one
sink writer. Queues are
bounded: when the GPU falls behind, frames are dropped at the batcher (counted),
never accumulated. stop() (SIGTERM/SIGINT) stops the sources, drains queued and
in-flight batches, flushes and closes the sinks.
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from jetpipe import bundle as bundles
from jetpipe.errors import JetpipeError
from jetpipe.lazy import lazy_import
from jetpipe.pipelines import preview
from jetpipe.pipelines.batcher import Batcher, Packet
from jetpipe.pipelines.capture import ROOM, CaptureGroup, capture_threads
from jetpipe.pipelines.chain_gate import ChainGate
from jetpipe.pipelines.config import ConfigError, PipelineConfig
from jetpipe.pipelines.control import Control
from jetpipe.pipelines.decode_procs import LIVE_CREDITS, DecodeProcesses, RemoteNvdecSource
from jetpipe.pipelines.metrics import COUNTERS, Metrics, MetricsServer
from jetpipe.pipelines.preview import Preview
from jetpipe.pipelines.secondary import SecondaryStage, frames_read
from jetpipe.pipelines.secondary import check as check_secondary
from jetpipe.pipelines.sinks import SinkFanout, open_sinks
from jetpipe.pipelines.sources import EndOfStream, open_source
from jetpipe.pipelines.streams import ControlError, Stream, Streams
from jetpipe.pipelines.tracking import Tracker
from jetpipe.runtime.ring import slot_bytes
from jetpipe.runtime.runtime import open_runtime
from jetpipe.tasks import for_bundle
from jetpipe.uri import parse as parse_uri

cv2 = lazy_import("cv2")
log = logging.getLogger(__name__)

BUFFER_SETS = 4  # 2 batches in flight on the GPU + 1 waiting for postprocessing + 1 being postprocessed
CHAINED_SETS = 1  # with secondaries: + 1 batch whose crops are being read (up to two more may wait in the
# handoff, holding sets the GPU stage would otherwise take: a secondary that is behind slows the primary)
STALL_MIN_S = 5.0  # a live stream is stalled after max(this, 10 frame periods) without a frame
STOP_GRACE_S = 4.0  # after stop(), sources still blocked (an RTSP connect inside OpenCV) are left behind
OVERLOAD_LOG_S = 60.0  # the overload warning, at most this often
REMOVE_WAIT_S = 30.0  # DELETE /streams/ID answers when the stream's frames are through, or after this (202)


def shared_cpu_threads(secondaries: int, cores: int | None = None) -> int:
    """ONNX Runtime intra-op threads for each model of a pipeline on the CPU runtime. One model: 0 (ONNX
    Runtime's own, a thread a core). With secondaries, the primary (the GPU-stage thread) and the secondaries
    (one after another in the secondary thread) run at once: each gets half the cores. A session's threads
    over the whole machine, beside another's, cost more CPU than they save: PP-OCRv4 det on 2 cores, 2
    threads 212 ms and 359 ms of CPU a frame against 240 ms and 240 ms on 1 (docs/benchmarks.md)."""
    if not secondaries:
        return 0
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // 2)


class Pipeline:
    def __init__(self, config: PipelineConfig, on_result=None, profile: bool = False):
        """profile: time every batch's GPU stages with CUDA events (the summary's gpu_stage_ms)."""

        self.config = config
        self.stop_event = threading.Event()
        self.interrupted: dict | None = None  # abort(): the second signal, and the queued frames it dropped
        self.failure: str | None = None       # why it stopped itself: every batch failed for fail_timeout_s
        self._failing_since: float | None = None  # the first failed batch after the last good one
        self._cpu_lock = threading.Lock()
        self.on_result = on_result  # optional callback(record), e.g. for the demo's console output
        manifest = bundles.read_manifest(config.bundle)
        task, options = for_bundle(manifest, config.task)  # checked against the outputs before any frame
        self.task = task.name
        self.postprocess = task.postprocessor(options)
        if config.tracker != "none" and not task.boxes:
            raise ConfigError(f"tracker = {config.tracker!r} tracks detected boxes; task {self.task} has none: "
                              "use tracker = 'none'")
        for secondary in config.secondaries:
            check_secondary(secondary, task, options.labels, "config")
            if secondary.every_track and config.tracker == "none":
                raise ConfigError(f"config: secondary {secondary.label!r}: every_track = {secondary.every_track} "
                                  "reuses a result while its track lives: add --tracker (bytetrack or iou)")
        buffer_sets = BUFFER_SETS + (CHAINED_SETS if config.secondaries else 0)
        cpu_threads = shared_cpu_threads(len(config.secondaries))
        self.runtime = open_runtime(config.bundle, config.max_batch, config.backend, config.memory,
                                    max_frame_hw=config.max_frame_hw, buffer_sets=buffer_sets,
                                    reduction=self._reduction(), profile=profile, cpu_threads=cpu_threads)
        self.profile = profile
        self.gpu_stage_ms: dict[str, list[float]] = {}
        # wall seconds of the post (and secondary) thread by phase: where a batch's time goes when a thread
        # is the limit; "handoff": the post thread waiting for the secondary thread to take a batch
        self.gpu_busy_s = 0.0  # the GPU's time on the batches (CUDA events), where the runtime measures it
        self.post_phase_s = dict.fromkeys(("wait_gpu", "finish", "handoff") if config.secondaries else
                                          ("wait_gpu", "finish", "records"), 0.0)
        self.secondary_phase_s = dict.fromkeys(("secondary", "records"), 0.0)
        self.secondary_reads = 0  # times the secondary thread read crops: fewer than batches where it caught up
        self.thread_cpu_s: dict[str, float] = {}  # CPU seconds of each pipeline thread, at its end
        self.closers = [self.runtime.close]
        self.secondaries = []
        try:
            for secondary in config.secondaries:  # each registered as it opens: a later failure closes it
                self.secondaries.append(SecondaryStage(secondary, secondary.backend or config.backend, config.memory,
                                                       config.max_frame_hw, config.postprocess, cpu_threads))
                self.closers.append(self.secondaries[-1].close)
                self._check_frames_reach(self.secondaries[-1])
            self._build()
        except BaseException:
            self.close()
            raise

    def _check_frames_reach(self, stage) -> None:
        """A secondary cuts its crops where the primary read the frames: in GPU memory with the GPU runtime,
        which a secondary on the CPU path cannot read."""
        if self.runtime.device_frames and not stage.runtime.device_frames:
            raise ConfigError(f"secondary {stage.name!r} runs on the CPU path ({stage.runtime.backend_name}) and the "
                              "primary's frames are in GPU memory: run it on the GPU too (its backend, or "
                              "?preprocess=gpu for a Triton model)")

    def _reduction(self):
        """What the GPU runtime should reduce on the device (None: postprocess on the CPU)."""
        where = self.config.postprocess
        reduction = None if where == "cpu" else self.postprocess.reduction(required=where == "gpu")
        if where == "gpu" and reduction is None:
            raise ConfigError(f"postprocess = 'gpu': task {self.task} has no GPU postprocessing; use auto or cpu")
        return reduction

    def _build(self) -> None:
        config, runtime = self.config, self.runtime
        log.info("postprocessing %s on the %s", self.task, "GPU" if runtime.reduction else "CPU")
        self.control = config.control.enabled
        capacity = (config.control.max_streams or len(config.sources)) if self.control else len(config.sources)
        self.streams = Streams(capacity)
        self.closers.append(self._close_sources)
        self.decoders = self._decode_processes(capacity)
        sources = []
        for i, s in enumerate(config.sources):
            sources.append(self._open_source(s, i))
            self.closers.append(sources[-1].close)
            self._check_frame_size(sources[-1])
        self.trackers = [self._tracker() for _ in range(capacity)]
        self._last_frame: list[float | None] = [None] * capacity  # when each stream last gave a frame
        self._allocate_rings(sources, capacity)
        for i, (spec, source) in enumerate(zip(config.sources, sources)):
            self.streams.take(i, self.streams.choices[i][0], spec, source)
        # with the control API, files are numbered by stream ID from the start (streams come and go)
        numbered = max(2, capacity) if self.control else len(config.sources)
        self.sinks = SinkFanout(open_sinks(config.sinks, numbered, self.runtime.max_batch), self.on_result)
        self.closers.append(self.sinks.close)
        self.batcher = Batcher(capacity, runtime.max_batch, config.batch_timeout_ms / 1000, config.queue_depth,
                               budget_s=config.latency_budget_ms / 1000 or None)
        self.capture_groups = [CaptureGroup(f"capture-{k}", self.batcher.room_condition(), self.batcher.has_room,
                                            self.stop_event, self._start_thread)
                               for k in range(min(capacity, capture_threads(config.capture_threads)))]
        self.metrics = Metrics(capacity)
        for slot in range(len(sources), capacity):
            self.metrics.labels[slot] = None  # spare: no stream yet
        self.collected: queue.Queue = queue.Queue()  # submitted batches, bounded by the buffer-set semaphore
        # finished batches for the secondary stage: two may wait, read together (_read_secondaries)
        self.chained: queue.Queue = queue.Queue(maxsize=2)
        self.chain_gate = ChainGate()  # live frames wait in the batcher while the secondary is behind
        self.free_sets = threading.Semaphore(runtime.buffer_sets)
        self.pool = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="post")
        self.closers.append(self.pool.shutdown)
        self.metrics.gauges["jetpipe_gpu_memory_free_bytes"] = self.runtime.gpu_free_memory
        self.metrics.gauges["jetpipe_streams"] = lambda: len(self.streams.live())
        if runtime.backend_name != "onnxruntime-cpu":
            # on the CPU only drawing (sinks, preview) and postprocessing use OpenCV, each in a thread of its
            # own; OpenCV's pool of a thread per core inside every call made them fight (measured: 4.6 cores
            # and -60 % saturated throughput with 8 drawing threads on a 16-core machine)
            cv2.setNumThreads(1)
        self.server, self.preview = None, None
        if config.metrics_listen:
            self.preview = Preview(capacity, runtime.max_batch)  # draws only while watched
            self.closers.append(self.preview.close)
            self.sinks.add_viewer(self.preview)
            control = Control(self, config.control) if self.control else None
            self.server = MetricsServer(config.metrics_listen, self._render_metrics, self._health, self._pages,
                                        control, hosts=tuple(config.metrics_hosts))
            self.closers.append(self.server.close)
            log.info("metrics on http://%s/metrics, live preview on http://%s/%s", self.server.address,
                     self.server.address, f", streams on http://{self.server.address}/streams (up to {capacity})"
                     if control else "")

    @property
    def sources(self) -> list:
        """The source of each stream in a slot now."""
        return [s.source for s in self.streams.live()]

    def _decode_processes(self, capacity: int) -> DecodeProcesses | None:
        """The decode processes NVDEC files are decoded in (decode_processes), or None: none asked, or no NVDEC
        here. At most one a stream."""
        asked = self.config.decode_processes
        if not asked:
            return None
        if not self.runtime.decodes_to_device:
            log.info("decode_processes = %d: no NVDEC here (the GPU runtime and PyNvVideoCodec on a discrete GPU); "
                     "sources are decoded in this process", asked)
            return None
        decoders = DecodeProcesses(min(asked, capacity), self.runtime.device, _DecodedElsewhere(self),
                                   self._start_thread, streams=capacity, threads=self.config.decode_threads)
        self.closers.append(decoders.close)
        return decoders

    def _open_source(self, spec, seed: int):
        if self.decoders is not None and _decodable_elsewhere(spec):
            source = self.decoders.open(parse_uri(spec.uri), spec.loop, spec.realtime, self.config.frames)
            if not isinstance(source, str):
                return source
            log.warning("source %s: NVDEC cannot decode it (%s): decoding with FFmpeg", spec.uri, source)
            return open_source(spec.uri, spec.loop, seed=seed, realtime=spec.realtime,
                               streams=self.streams.capacity)
        return open_source(spec.uri, spec.loop, seed=seed, realtime=spec.realtime, decoder=spec.decoder,
                           hwaccel=spec.hwaccel, hardware=self.runtime.hardware_decoder,
                           streams=self.streams.capacity)

    def _tracker(self):
        return Tracker(self.config.tracker) if self.config.tracker != "none" else None

    def _allocate_rings(self, sources: list, capacity: int) -> None:
        """Every slot's frame rings, now: one per source given (its frame size and memory), and for each spare
        slot of the control API a host ring of max_frame_hw, and a device ring too where NVDEC decodes into
        GPU memory (a stream added later takes whichever its decoder writes). Rings of one frame size share a
        pool for the frames their batches hold (ring.FrameRing.share)."""
        runtime, config = self.runtime, self.config
        own = own_slots(config.queue_depth)
        # a source whose format is known now (a file, probed) gets slots of its frame's size (NV12: half of BGR);
        # not with the control API, where a slot a stream leaves may be taken by any stream up to its size
        wanted = [[self._ring_need(src, exact=not self.control)] for src in sources]
        spare = [(tuple(config.max_frame_hw), False, None)] + \
            ([(tuple(config.max_frame_hw), True, None)] if runtime.decodes_to_device else [])
        wanted += [spare] * (capacity - len(sources))
        sharing = Counter(spec for rings in wanted for spec in rings)
        pooled = {spec: shared_slots(streams, config.queue_depth, runtime.max_batch, runtime.buffer_sets)
                  for spec, streams in sharing.items()}
        _check_ring_memory([own * slot_bytes(*spec) for rings in wanted for spec in rings], own,
                           [count * slot_bytes(*spec) for spec, count in pooled.items()], sum(pooled.values()))
        pools = {spec: runtime.frame_ring(count, spec[0], device=spec[1], fmt=spec[2])
                 for spec, count in pooled.items()}
        for slot, rings in enumerate(wanted):
            self.streams.choices[slot] = [runtime.frame_ring(own, hw, device=device, fmt=fmt)
                                          for hw, device, fmt in rings]
            for ring, spec in zip(self.streams.choices[slot], rings):
                ring.share(pools[spec])

    def _pages(self, path: str):
        """The preview page, its frames and counters (None: not a page here)."""
        live = self.streams.live()
        if path in ("/", "/index.html"):
            return 200, preview.page([(s.id, s.spec.uri) for s in live]), "text/html; charset=utf-8"
        if path == "/stats.json":
            shown = [(s.slot, s.id, s.spec.uri) for s in live]
            return 200, preview.stats_json(self.metrics, self.batcher.dropped, shown), "application/json"
        if path.startswith("/preview/") and path.endswith(".jpg"):
            stream = path[len("/preview/"):-len(".jpg")]
            if not stream.isdigit() or all(s.id != int(stream) for s in live):
                return None
            jpeg = self.preview.jpeg(int(stream))
            return (200, jpeg, "image/jpeg") if jpeg else (503, "no frame drawn yet\n", "text/plain")
        return None

    def _close_sources(self) -> None:
        for stream in self.streams.live():
            stream.source.close()

    def _check_frame_size(self, source) -> None:
        info, (max_h, max_w) = source.info, self.config.max_frame_hw
        if info is not None and (info.height > max_h or info.width > max_w):
            raise ConfigError(f"source {source.uri}: frames are {info.width}x{info.height}, larger than "
                              f"max_frame_hw [{max_h}, {max_w}]: set [pipeline] max_frame_hw = "
                              f"[{max(info.height, max_h)}, {max(info.width, max_w)}]")

    def _ring_need(self, source, exact: bool = True) -> tuple[tuple[int, int], bool, str | None]:
        """What a ring for this source must hold: frames of its size (max_frame_hw while unknown), in device
        memory or not, of its format where it is known now and `exact` (else any format: slot_bytes)."""
        info = source.info
        hw = (info.height, info.width) if info is not None else tuple(self.config.max_frame_hw)
        return hw, source.memory == "device", info.format if exact and info is not None else None

    def _render_metrics(self) -> str:
        return self.metrics.prometheus(self.batcher.dropped, self.batcher.depths(), self._decode_errors())

    def _decode_errors(self) -> list[int]:
        """Per slot (vacant: 0)."""
        slots = self.streams.slots
        return [s.source.decode_errors if s is not None else 0 for s in list(slots)]

    def _health(self) -> tuple[bool, str]:
        if self.stop_event.is_set():
            return False, "stopping"
        stale = time.monotonic() - self.metrics.heartbeat
        return (True, "ok") if stale < 10 else (False, f"GPU stage silent for {stale:.0f} s")

    # --- threads -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the sources (a blocked read or open is interrupted), then drain (see run())."""
        self.stop_event.set()
        for stream in self.streams.live():
            self._interrupt(stream)
        for group in self.capture_groups:
            group.wake()
        if self.decoders is not None:
            self.decoders.wake()

    @staticmethod
    def _interrupt(stream: Stream) -> None:
        try:
            stream.source.interrupt()
        except Exception as exc:
            log.warning("source %s: %s while stopping", stream.spec.uri, exc)

    def abort(self, signal_name: str) -> None:
        """A second stop (Ctrl-C or SIGTERM while draining): drop the queued frames and finish only the
        batches already on the GPU, then write the summary as usual."""
        self.stop()
        dropped = self.batcher.abort()
        if self.interrupted is None:
            self.interrupted = {"signal": signal_name, "queued_frames_dropped": 0}
        self.interrupted["queued_frames_dropped"] += dropped
        log.warning("%s again: %d queued frame(s) dropped, finishing the batches in flight", signal_name, dropped)

    def run(self) -> dict:
        """Run until stopped (signal, duration, frame limit, or every finite source ended); always closes."""
        # What start-up made lives as long as the run: frozen, the cyclic collector's passes (which records' many
        # small lists set off) no longer walk it (pose's finishing on the CPU machine: 1.30 ms a batch, 1.03 frozen,
        # 0.72 with no collector at all).
        gc.freeze()
        try:
            return self._run()
        finally:
            gc.unfreeze()
            self.close()

    def _run(self) -> dict:
        started, cpu_started = time.monotonic(), time.process_time()
        gpu = self._thread(self._gpu_stage, "gpu")
        post = self._thread(self._post_stage, "post")
        chained = self._thread(self._secondary_stage, "secondary") if self.secondaries else None
        writer = self._thread(self.sinks.run, "sinks")
        for t in (gpu, post, *([chained] if chained else []), writer):
            t.start()
        if self.decoders is not None:
            self.decoders.mark_cpu()
        with self.streams.lock:
            for stream in self.streams.live():
                self._start_capture(stream)
        last_log, stopped_at = time.monotonic(), None
        self._overload_said = (0, -OVERLOAD_LOG_S)  # drops counted when last said, and when
        # with the control API the daemon serves until stopped (streams may be added at any time)
        while self._capturing() or (self.control and not self.stop_event.is_set()):
            self._restart_stalled()
            self._free_removed()
            if self.config.duration and time.monotonic() - started >= self.config.duration:
                self.stop()
            if self.stop_event.is_set():
                stopped_at = stopped_at or time.monotonic()
                if time.monotonic() - stopped_at > STOP_GRACE_S:
                    stuck = [s.spec.uri for s in self.streams.live() if s.capturing()]
                    log.warning("source(s) %s did not stop within %.0f s: left behind", ", ".join(stuck),
                                STOP_GRACE_S)
                    break
            if time.monotonic() - last_log >= self.config.log_every_s:
                log.info(self.status_line())
                last_log = time.monotonic()
            self._say_overload()
            time.sleep(0.05)
        self.batcher.close()  # sources are done: drain what is queued
        gpu.join()
        self.collected.put(None)
        post.join()
        if chained is not None:
            self.chained.put(None)
            chained.join()
        self._free_removed()  # streams whose removal was asked: their frames are through now
        self.sinks.finish()
        writer.join()
        self.thread_cpu_s["process"] = time.process_time() - cpu_started
        if self.decoders is not None:  # their CPU is the run's too (cpu_cores counts it)
            self.thread_cpu_s["decode_processes"] = self.decoders.cpu_seconds()
            self.thread_cpu_s["decode_links"] = self.decoders.link_cpu_seconds()  # part of "process"
        seconds = time.monotonic() - started
        self.sinks.close()  # before the summary: what fails while a sink finishes is counted
        return self.summary(seconds)

    def _capturing(self) -> bool:
        return any(s.capturing() for s in self.streams.live())

    def _start_capture(self, stream: Stream) -> None:
        """A stream whose reads never block for long is read by a shared capture thread (the least loaded),
        any other by a thread of its own."""
        stream.started = True
        if isinstance(stream.source, RemoteNvdecSource):  # its frames come from a decode process
            self.batcher.room_waiter(stream.slot, self.decoders.waker(stream))
            self.decoders.start(stream)
            return
        if self.capture_groups and getattr(stream.source, "shares_thread", False):
            group = min(self.capture_groups, key=len)
            stream.source.paced_by_caller = True
            self.batcher.room_waiter(stream.slot, group.room)
            group.add(stream, self._capture_steps(stream, shared=True))
            return
        self.batcher.room_waiter(stream.slot, None)
        self._thread(self._capture, "sources", stream).start()

    def _restart_stalled(self) -> None:
        """A live stream connected but silent for its stall timeout (a camera that stopped sending) is a
        failure: logged, counted, and its connection ended so that capture reconnects."""
        now = time.monotonic()
        for stream in self.streams.live():
            slot, source = stream.slot, stream.source
            last = self._last_frame[slot]
            if last is None or not source.live or now - last < self._stall_timeout(source):
                continue
            self._last_frame[slot] = None  # once per stall: the next frame (or reconnect) arms it again
            self.metrics.count("stalls", slot)
            restart = getattr(source, "restart", None)
            log.warning("source %d (%s): no frame for %.1f s%s", stream.id, source.uri, now - last,
                        "; reconnecting" if restart else "; this source cannot be restarted")
            if restart is not None:
                restart()

    def _stall_timeout(self, source) -> float:
        if self.config.stall_timeout_s:
            return self.config.stall_timeout_s
        fps = source.info.fps if source.info is not None and source.info.fps else 0.0
        return max(STALL_MIN_S, 10 / fps if fps > 0 else 0.0)

    def _start_thread(self, target, name: str) -> None:
        self._thread(target, "sources", name=name).start()

    def _thread(self, target, role: str, *args, name: str | None = None) -> threading.Thread:
        """A pipeline thread that adds its CPU time to thread_cpu_s[role] when it ends."""
        def run():
            try:
                target(*args)
            finally:
                with self._cpu_lock:
                    self.thread_cpu_s[role] = self.thread_cpu_s.get(role, 0.0) + time.thread_time()

        name = name or (f"{role}-{getattr(args[0], 'id', args[0])}" if args else role)
        return threading.Thread(target=run, name=name, daemon=True)

    def _capture(self, handle: Stream) -> None:
        """A stream's capture in a thread of its own: its steps, sleeping where they ask to."""
        for wait in self._capture_steps(handle, shared=False):
            if wait > 0:
                handle.stop.wait(wait)

    def _capture_steps(self, handle: Stream, shared: bool):
        """Read the stream into its ring, a frame a step; yield when the next step should run: in seconds, or
        capture.ROOM (shared only: once its queue has room). A source in a shared thread is paced here (its
        due_in()) and never waits inside a step; in a thread of its own it waits where it reads."""
        try:
            yield from self._capture_loop(handle, shared)
        finally:
            handle.done.set()

    def _capture_loop(self, handle: Stream, shared: bool):
        stream, source, ring, config = handle.slot, handle.source, self.streams.rings[handle.slot], self.config
        backoff, frame_no, info = 0.5, 0, None
        running = lambda: not (self.stop_event.is_set() or handle.stop.is_set())  # noqa: E731
        while running() and not (config.frames and frame_no >= config.frames):
            slot = None
            try:
                if info is None:
                    # the stall timer runs during the open too: a camera that accepts the connection and sends
                    # nothing would otherwise hold this stream in open() until serve is stopped
                    self._last_frame[stream] = time.monotonic()
                    info = source.open()
                    backoff = 0.5
                    self._last_frame[stream] = time.monotonic()
                if shared:
                    due = source.due_in()
                    if due > 0:
                        yield due
                        continue
                    if not source.live and not self.batcher.has_room(stream):  # files wait for room
                        yield ROOM
                        continue
                slot = self._free_slot(stream, source.live)
                if slot is None:  # every slot is in flight on the GPU: wait briefly
                    yield 0.001
                    continue
                view = ring.view(slot, info.format, info.height, info.width)
                pts = source.read_into(view)
                # files wait for room (every frame is processed); cameras push out their oldest frame
                self._queue_frame(stream, ring, slot, info, frame_no, pts, source.live, wait=not source.live)
                frame_no += 1
                if shared:
                    yield 0.0
            except EndOfStream:
                if slot is not None:
                    ring.release(slot)
                log.info("source %d (%s) ended after %d frames, %d decode error(s)", handle.id, source.describe(),
                         frame_no, source.decode_errors)
                source.close()
                handle.state = "ended" if handle.state == "running" else handle.state
                return
            except Exception as exc:  # disconnect, decode error, device gone: back off and reconnect
                if slot is not None:
                    ring.release(slot)
                if not running():  # stop() or a removal interrupted it: an end, not a failure
                    break
                source.close()
                self.metrics.count("failed", stream)
                self.metrics.count("reconnects", stream)
                log.warning("source %d (%s): %s; reconnecting in %.1f s", handle.id, source.describe(), exc,
                            backoff)
                info = None
                yield backoff
                backoff = min(backoff * 2, config.reconnect_max_s)
        # stopped, removed or at its frame limit: the source stays open until its frames are through and is
        # closed then (_retire, or close() after the drain). Closing a hardware decoder frees its memory with
        # the GIL held, ~10 ms each: at a stop every stream's at once stalled the batches still draining
        # (32 NVDEC streams: the last batches waited 350 ms, the whole process frozen)

    def _queue_frame(self, stream: int, ring, slot: int, info, frame_no: int, pts: float | None, live: bool,
                     wait: bool) -> None:
        """A frame its source wrote into ring slot `slot`, captured now, to the batcher (wait: for room)."""
        t_capture = time.time()
        frame = ring.frame(slot, info.format, info.height, info.width, info.standard, info.range)
        self.batcher.put(Packet(stream, frame_no, t_capture, frame, _releaser(ring, slot), pts=pts, live=live),
                         wait=wait)
        self.metrics.count("captured", stream)
        self._last_frame[stream] = time.monotonic()

    def _free_slot(self, stream: int, live: bool):
        ring = self.streams.rings[stream]
        slot = ring.acquire()
        if slot is None and live and self.batcher.drop_oldest(stream):
            slot = ring.acquire()
        return slot

    def _gpu_stage(self) -> None:
        """Submit batches as they form; the post stage collects each when the GPU is done with it, so a
        finished batch never waits for the next one to form (a batch period of latency at real time)."""
        while True:
            self.metrics.beat()
            # a buffer set the postprocess stage has released, before the batch is taken: frames wait for it in
            # the batcher (where a full batch forms and those past the latency budget are shed), not in a batch
            if not self.free_sets.acquire(timeout=0.1):
                continue
            if self.secondaries and not self.chain_gate.wait_open(0.1):
                self.free_sets.release()
                continue
            packets = self.batcher.next_batch()
            if not packets:
                self.free_sets.release()
                if packets is None:
                    break
                continue
            if self.secondaries:
                self.chain_gate.cut(any(p.live for p in packets))
            t_batch = time.monotonic()
            try:
                ticket = self.runtime.submit([p.frame for p in packets])
            except Exception as exc:
                self.free_sets.release()
                if self.secondaries:
                    self.chain_gate.lost()
                self._fail(packets, exc)
                continue
            self.collected.put((ticket, packets, t_batch))

    def _fail(self, packets, exc) -> None:
        log.error("batch of %d frames failed: %s", len(packets), exc)
        for p in packets:
            p.release()
            self.metrics.count("failed", p.stream)
        now, limit = time.monotonic(), self.config.fail_timeout_s
        if self._failing_since is None:
            self._failing_since = now
        elif limit and now - self._failing_since >= limit and self.failure is None:
            # settings that passed start-up and fail every frame: stop with the reason, not run on at exit 0
            self.failure = f"every batch failed for {now - self._failing_since:.0f} s (fail_timeout_s {limit:g}); " \
                           f"the last: {str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}"
            log.error("stopping: %s", self.failure)
            self.stop()

    def _post_stage(self) -> None:
        while True:
            item = self.collected.get()
            if item is None:
                return
            ticket, packets, t_batch = item
            handed = False
            try:
                t_wait = time.perf_counter()
                result = self.runtime.collect(ticket, hold=True)  # waits for the GPU (blocking, not spinning)
                self.post_phase_s["wait_gpu"] += time.perf_counter() - t_wait
                self.metrics.batches += 1
                if result.engine_ms is not None:  # the GPU's own time on the batch
                    engine_s = result.engine_ms / 1e3
                    self.gpu_busy_s += (result.engine_ms if result.busy_ms is None else result.busy_ms) / 1e3
                else:
                    engine_s = time.monotonic() - t_batch
                self.batcher.record_batch(len(packets), engine_s)
                if self.profile:
                    for stage, ms in self.runtime.stage_times(ticket).items():
                        self.gpu_stage_ms.setdefault(stage, []).append(ms)
                t_gpu = time.monotonic()
                results = self._finish(result, packets)
                self._failing_since = None
                if self.secondaries:  # the secondary thread reads its crops, writes its records and releases it
                    t_handoff = time.perf_counter()
                    self.chained.put((ticket, result, packets, results, t_batch, t_gpu))
                    self.post_phase_s["handoff"] += time.perf_counter() - t_handoff
                    handed = True
                else:
                    self._emit(result, packets, results, t_batch, t_gpu, self.post_phase_s)
            except Exception as exc:
                self._fail(packets, exc)
            finally:
                if not handed:
                    self.runtime.release(ticket)
                    self.free_sets.release()
                    if self.secondaries:
                        self.chain_gate.lost()

    def _secondary_stage(self) -> None:
        """The secondaries on the finished batches, while the post thread finishes the next one: the batches'
        frames are still where the primary's kernel read them (their buffer sets are held until here)."""
        phase, ending = self.secondary_phase_s, False
        while not ending:
            items = [self.chained.get()]
            while items[-1] is not None and not self.chained.empty():
                items.append(self.chained.get_nowait())  # this thread is the only reader
            ending = items[-1] is None
            items = items[:-1] if ending else items
            if not items:
                break
            self.chain_gate.taken(len(items))
            read = True
            try:
                self._read_secondaries(items, phase)
            except Exception as exc:
                read = False
                for _, _, packets, *_ in items:
                    self._fail(packets, exc)
            for ticket, result, packets, found, t_batch, t_gpu in items:
                try:
                    if read:
                        self._emit(result, packets, found, t_batch, t_gpu, phase)
                except Exception as exc:
                    self._fail(packets, exc)
                finally:
                    self.runtime.release(ticket)
                    self.free_sets.release()
            self.chain_gate.read()

    def _read_secondaries(self, items: list, phase: dict) -> None:
        """The secondaries on the crops of every batch that waited for this thread, together: behind, it catches
        up with fuller recognizer runs (a batch's crops fall into 3-4 width groups; run batch by batch, the
        H100's real-time OCR spent 16-20 ms a batch of 4-8 frames, as long as the batches came)."""
        t_secondary = time.perf_counter()
        results, frames, streams = [], [], []
        for _, result, packets, found, _, _ in items:
            if found:
                results += found
                frames += frames_read(result, [packets[i].frame for i in result.frame_indices])
                streams += [self.streams.id_of(packets[i].stream) for i in result.frame_indices]
        if results:
            for stage in self.secondaries:
                stage.run(results, frames, streams)
        phase["secondary"] += time.perf_counter() - t_secondary
        self.secondary_reads += 1

    def _finish(self, result, packets: list[Packet]) -> list[dict]:
        """The primary's results of a collected batch (its task's finish, then each stream's tracker)."""
        t_finish = time.perf_counter()
        used = [packets[i] for i in result.frame_indices]
        sizes = [_frame_hw(p.frame) for p in used]
        finish = self.postprocess.reduced if result.reduction else self.postprocess
        results = finish(result.outputs, result.letterboxes, sizes, pool=self.pool) if used else []
        for packet, res in zip(used, results):
            tracker = self.trackers[packet.stream]
            if tracker is not None:  # frames of a stream reach this one thread in order
                res["track_ids"] = tracker.update(res["boxes"], res["scores"])
        self.post_phase_s["finish"] += time.perf_counter() - t_finish
        return results

    def _emit(self, result, packets: list[Packet], results: list[dict], t_batch: float, t_gpu: float,
              phase: dict) -> None:
        """Records of a finished batch to the frame sinks and the writer; the batch's ring slots released."""
        t_records = time.perf_counter()
        used = [packets[i] for i in result.frame_indices]
        for index, reason in result.rejected:
            log.warning("frame %d of stream %d rejected: %s", packets[index].frame_no, packets[index].stream,
                        reason)
            self.metrics.count("failed", packets[index].stream)
        t_post = time.monotonic()
        for packet, res in zip(used, results):
            latency = {"queue": (t_batch - packet.t_monotonic) * 1e3, "gpu": (t_gpu - t_batch) * 1e3,
                       "post": (t_post - t_gpu) * 1e3, "total": (t_post - packet.t_monotonic) * 1e3}
            self.metrics.record_result(packet.stream, latency)
            stream = self.streams.slots[packet.stream]  # in its slot until its frames are through
            record = {"stream": stream.id, "source": stream.source.uri, "frame": packet.frame_no,
                      "pts": None if packet.pts is None else round(packet.pts, 6),
                      "t_capture": round(packet.t_capture, 6), "t_result": round(time.time(), 6),
                      "latency_ms": {k: round(v, 3) for k, v in latency.items()},
                      "task": self.task, "results": res}
            # a copy of the frame, before its ring slot is released; files: every frame, as inference
            self.sinks.offer(stream.id, packet.frame, record, self.runtime.frame_to_host, wait=not stream.source.live)
            self.sinks.put(record)
        for packet in packets:
            packet.release()
        phase["records"] += time.perf_counter() - t_records

    # --- the control API: streams added and removed while serving --------------------------------
    def list_streams(self) -> dict:
        return {"max_streams": self.streams.capacity, "streams": [self._describe(s) for s in self.streams.live()]}

    def describe_stream(self, stream_id: int) -> dict:
        stream = self.streams.find(stream_id)
        if stream is not None:
            return self._describe(stream)
        with self.streams.lock:
            retired = self.streams.retired.get(stream_id)
        if retired is None:
            raise ControlError(404, f"no stream {stream_id}: GET /streams lists them")
        return {"id": stream_id, **retired}

    def add_stream(self, spec) -> dict:
        """Serve one more source in a free slot (its rings allocated at start-up). ControlError: the source
        cannot be opened or is too large (422), no free slot takes it (409), the daemon is stopping (503)."""
        if self.stop_event.is_set():
            raise ControlError(503, "the daemon is stopping: no stream can be added")
        try:  # outside the lock: a file is probed now, a network stream only named
            source = self._open_source(spec, seed=self.streams.next_id)
        except JetpipeError as exc:
            raise ControlError(422, str(exc)) from None
        try:
            stream = self._place(spec, source)
        except BaseException:
            source.close()
            raise
        log.info("stream %d added: %s (slot %d)", stream.id, spec.uri, stream.slot)
        return self._describe(stream)

    def _place(self, spec, source) -> Stream:
        try:
            self._check_frame_size(source)
        except ConfigError as exc:
            raise ControlError(422, str(exc)) from None
        hw, device, fmt = self._ring_need(source)
        with self.streams.lock:
            place = self.streams.ring_for(hw, device, fmt)
            if place is None and self._free_ended():
                place = self.streams.ring_for(hw, device, fmt)
            if place is None:
                raise ControlError(409, self._no_room(source, device, hw))
            if self.stop_event.is_set():
                raise ControlError(503, "the daemon is stopping: no stream can be added")
            slot, ring = place
            self.metrics.assign(slot, str(self.streams.next_id))
            self.batcher.reset(slot)
            self.trackers[slot], self._last_frame[slot] = self._tracker(), None
            for secondary in self.secondaries:  # the new tracker numbers from 1: the old stream's tracks go
                secondary.forget(slot)
            stream = self.streams.take(slot, ring, spec, source)
            self._start_capture(stream)
        return stream

    def _no_room(self, source, device: bool, hw: tuple[int, int]) -> str:
        live = self.streams.live()
        if len(live) == self.streams.capacity:
            return (f"all {self.streams.capacity} stream slots are taken (max_streams): remove a stream first "
                    "(DELETE /streams/ID), or restart with a larger [control] max_streams")
        return (f"no free stream slot takes {hw[1]}x{hw[0]} frames in {'device' if device else 'host'} memory "
                f"({source.describe()}); free slots take {self.streams.describe_free()}: choose another decoder, "
                "or restart with a larger max_frame_hw")

    def remove_stream(self, stream_id: int, wait_s: float = REMOVE_WAIT_S) -> tuple[int, dict]:
        """Stop a stream's source; its queued and in-flight frames finish and reach the sinks, then its slot is
        free. (200, the stream's final counters) once that is done, (202, ...) if it takes longer than wait_s."""
        stream = self.streams.find(stream_id)
        if stream is None:
            with self.streams.lock:
                gone = stream_id in self.streams.retired
            raise ControlError(404, f"stream {stream_id} was removed already" if gone else
                               f"no stream {stream_id}: GET /streams lists them")
        stream.state = "stopping"
        stream.stop.set()
        self._interrupt(stream)
        for group in self.capture_groups:
            group.wake()
        if self.decoders is not None:
            self.decoders.wake()
        with self.streams.changed:
            done = self.streams.changed.wait_for(lambda: stream.state == "removed", timeout=wait_s)
        return (200 if done else 202), self.describe_stream(stream_id)

    def _drained(self, stream: Stream) -> bool:
        """Its capture ended and every frame it captured is through (its ring's slots all free again)."""
        ring = self.streams.rings[stream.slot]
        return not stream.capturing() and ring.in_use() == 0

    def _free_removed(self) -> None:
        """Streams whose removal was asked and whose frames are all through leave their slots."""
        for stream in self.streams.live():
            if stream.state == "stopping" and self._drained(stream):
                self._retire(stream)

    def _free_ended(self) -> bool:
        """A slot for a new stream: the longest-ended stream (its source ended; all its frames through)."""
        ended = [s for s in self.streams.live() if s.state == "ended" and self._drained(s)]
        if ended:
            self._retire(min(ended, key=lambda s: s.id))
        return bool(ended)

    def _retire(self, stream: Stream) -> None:
        counts = self._live_counts(stream)
        self.metrics.vacate(stream.slot)
        stream.source.close()
        self.sinks.end_stream(stream.id)  # its last frame was offered before its ring slot was released
        self.streams.free(stream, counts)
        log.info("stream %d removed (%s): %d captured, %d processed, %d dropped, %d failed", stream.id,
                 stream.spec.uri, counts["captured"], counts["processed"], counts["dropped"], counts["failed"])

    def _live_counts(self, stream: Stream) -> dict:
        m, slot = self.metrics, stream.slot
        with m.lock:
            counts = {name: getattr(m, name)[slot] for name in COUNTERS}
        return {**counts, "dropped": self.batcher.dropped[slot], "decode_errors": stream.source.decode_errors}

    def _describe(self, stream: Stream) -> dict:
        return {"id": stream.id, "uri": stream.spec.uri, "state": stream.state,
                "fps": round(self.metrics.fps(stream.slot), 2), **self._live_counts(stream)}

    def _stream_counts(self) -> list[dict]:
        """Every stream's counters by ID: those in slots now, and those removed as they were then."""
        with self.streams.lock:
            live = {s.id: s for s in self.streams.live()}
            retired = dict(self.streams.retired)
        return [retired[i] if i in retired else {"uri": live[i].spec.uri, "state": live[i].state,
                                                 **self._live_counts(live[i])}
                for i in sorted([*live, *retired])]

    # --- reporting -------------------------------------------------------------------------------
    def _totals(self) -> dict[str, int]:
        """Each counter summed over every stream, removed ones included."""
        counts = self._stream_counts()
        return {name: sum(c[name] for c in counts) for name in (*COUNTERS, "dropped")}

    def _say_overload(self) -> None:
        """A warning (at most once a minute) while live streams drop frames: the offered rate is more than the
        pipeline processes, and the drops keep its latency bounded (a file waits instead)."""
        totals, now = self._totals(), time.monotonic()
        dropped, said, at = totals["dropped"], *self._overload_said
        if dropped > said and now - at >= OVERLOAD_LOG_S:
            captured = max(1, totals["captured"])
            log.warning("overloaded: %d frame(s) dropped so far (%.1f %% of those captured): the streams offer more "
                        "than the pipeline processes; the oldest queued frames go so that latency stays bounded "
                        "(fewer streams, a lower rate or a lighter model would keep them)", dropped,
                        100 * dropped / captured)
            self._overload_said = (dropped, now)

    def status_line(self) -> str:
        m = self.metrics
        fps = " ".join(f"{m.fps(s.slot):.1f}" for s in self.streams.live())
        p = m.recent_percentiles("total")
        lat = f"recent p50 {p[0.5]:.0f} ms p99 {p[0.99]:.0f} ms" if p else "no results yet"
        total = self._totals()
        return (f"fps per stream [{fps}], processed {total['processed']}, "
                f"dropped {total['dropped']}, failed {total['failed']}, latency {lat}")

    def summary(self, seconds: float) -> dict:
        m, counts = self.metrics, self._stream_counts()
        per_stream = {name: [c[name] for c in counts] for name in (*COUNTERS, "dropped", "decode_errors")}
        processed, dropped = sum(per_stream["processed"]), sum(per_stream["dropped"])
        return {"seconds": round(seconds, 2), "backend": self.runtime.backend_name,
                # by stream ID (= the records' "stream"): with the control API removed streams too
                **{name: per_stream[name] for name in ("captured", "processed", "dropped", "failed", "reconnects",
                                                       "stalls", "decode_errors")},
                **({"streams": [{"uri": c["uri"], "state": c["state"]} for c in counts]} if self.control else {}),
                "batches": m.batches,
                **({"latency_budget_ms": self.config.latency_budget_ms} if self.config.latency_budget_ms else {}),
                "throughput_fps": round(processed / max(seconds, 1e-9), 2),
                # live streams dropped frames because processing fell behind (files wait instead)
                "overloaded": dropped > 0,
                "dropped_share": round(dropped / max(1, sum(per_stream["captured"])), 4),
                "latency_ms": {s: {str(q): round(v, 2) for q, v in m.percentiles(s).items()}
                               for s in ("queue", "gpu", "post", "total")},
                "sink_failures": self.sinks.failures(),
                "sink_frames_dropped": self.sinks.dropped(),
                "postprocess": "gpu" if self.runtime.reduction else "cpu",
                "d2h_bytes_per_frame": round(self.runtime.output_bytes_downloaded / max(1, processed)),
                "cpu_seconds": {k: round(v, 3) for k, v in self.thread_cpu_s.items()},
                "cpu_cores": round(sum(self.thread_cpu_s.get(k, 0.0) for k in ("process", "decode_processes"))
                                   / max(seconds, 1e-9), 2),
                "gpu_stage_ms": {k: _median(v) for k, v in self.gpu_stage_ms.items()},
                # the share of the run the GPU spent on batches: near 1, the GPU is what limits throughput
                **({"gpu_busy_share": round(self.gpu_busy_s / max(seconds, 1e-9), 3)} if self.gpu_busy_s else {}),
                "post_thread_ms_per_batch": _per_batch(self.post_phase_s, m.batches),
                **({"secondary_thread_ms_per_batch": _per_batch(self.secondary_phase_s, m.batches),
                    "secondary_reads": self.secondary_reads,
                    "secondary_held_primary_s": round(self.chain_gate.held_s, 3)} if self.secondaries else {}),
                **({"secondary": {s.name: s.summary() for s in self.secondaries}} if self.secondaries else {}),
                **({"interrupted": dict(self.interrupted)} if self.interrupted else {}),
                **({"failure": self.failure} if self.failure else {})}

    def close(self) -> None:
        for close in reversed(self.closers):
            try:
                close()
            except Exception as exc:
                log.warning("while closing: %s", exc)
        self.closers = []


def available_memory() -> int | None:
    """Bytes of memory the kernel says are available (MemAvailable), None where it does not say."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def own_slots(queue_depth: int) -> int:
    """Frame slots a stream's own ring holds: its queue, one being written and one spare."""
    return queue_depth + 2


def shared_slots(streams: int, queue_depth: int, max_batch: int, buffer_sets: int) -> int:
    """Frame slots the rings of `streams` streams of one size share: the frames the batches hold while their
    buffer sets are in use (on the GPU, waiting for or in postprocessing, crops being read). At most
    buffer_sets x max_batch, whatever the streams; and as a batch takes a stream's frames from its queue, at
    most queue_depth of one stream's a batch (one stream alone: the 4 x min(queue_depth, max_batch) slots a
    ring held before the pool, 22 a stream in all at depth 4; 64 streams at batch 32 share 128 instead of
    64 x 16)."""
    return min(buffer_sets * max_batch, streams * buffer_sets * min(queue_depth, max_batch))


def _check_ring_memory(ring_bytes: list[int], own: int, pool_bytes: list[int], pooled: int) -> None:
    """The frame rings fit in the memory available (a Jetson shares it with the GPU): checked before any is
    allocated, instead of the OOM killer ending the daemon half-started."""
    available, need = available_memory(), sum(ring_bytes) + sum(pool_bytes)
    if available is not None and need > 0.8 * available:
        raise ConfigError(f"the frame rings would take {_size(need)} ({len(ring_bytes)} stream(s) x {own} "
                          f"slots: queue_depth + 2, and {pooled} shared by the batches in flight: buffer sets x "
                          f"max_batch at most), more than 80 % of the {_size(available)} available: lower "
                          "queue_depth or max_frame_hw")


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def _per_batch(phase_s: dict[str, float], batches: int) -> dict[str, float]:
    return {k: round(1e3 * v / max(1, batches), 3) for k, v in phase_s.items()}


def _median(values: list[float]) -> float:
    return round(float(sorted(values)[len(values) // 2]), 4) if values else 0.0


def _decodable_elsewhere(spec) -> bool:
    """A video file NVDEC may decode in a decode process (what it cannot take is then decoded here)."""
    if spec.decoder not in ("auto", "nvdec") or spec.hwaccel:
        return False
    uri = parse_uri(spec.uri)
    return uri.scheme == "file" and uri.path.is_file()


class _DecodedElsewhere:
    """What the decode processes' links (pipelines.decode_procs) ask of the daemon, for a stream (its Stream):
    the capture loop's part, for frames a decode process wrote into the stream's ring."""

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline

    def credits_wanted(self, handle: Stream, held: int) -> int:
        """Slots to hand the process now: a live stream one being decoded and the next (its oldest queued
        frame is dropped for a slot when behind); a file as many as its queue has room for."""
        if handle.source.live:
            return max(0, LIVE_CREDITS - held)
        return max(0, self.pipeline.batcher.depth - len(self.pipeline.batcher.queues[handle.slot]) - held)

    def acquire(self, handle: Stream) -> int | None:
        return self.pipeline._free_slot(handle.slot, handle.source.live)

    def slot_address(self, handle: Stream, slot: int) -> int:
        """The slot's device allocation (its base address: a device ring allocates each slot on its own)."""
        info = handle.source.info
        return self.pipeline.streams.rings[handle.slot].view(slot, info.format, info.height, info.width).address

    def deliver(self, handle: Stream, slot: int, pts: float | None, frame_no: int) -> None:
        # never waits: a file's credits were its queue's room
        self.pipeline._queue_frame(handle.slot, self.pipeline.streams.rings[handle.slot], slot, handle.source.info,
                                   frame_no, pts, handle.source.live, wait=False)

    def release(self, handle: Stream, slot: int) -> None:
        self.pipeline.streams.rings[handle.slot].release(slot)

    def ended(self, handle: Stream, how: str, why: str, frames: int) -> None:
        """The process is done with the stream: at its end, its frame limit, its removal, or (failed) gone."""
        source = handle.source
        if how == "failed":
            self.pipeline.metrics.count("failed", handle.slot)
            log.error("source %d (%s): %s", handle.id, source.describe(), why)
        elif how == "ended":
            log.info("source %d (%s) ended after %d frames, %d decode error(s)", handle.id, source.describe(),
                     frames, source.decode_errors)
        if how in ("ended", "failed") and handle.state == "running":
            handle.state = "ended"
        handle.done.set()

    def failed(self, handle: Stream, why: str, backoff: float) -> None:
        """A read failed in the process; it opens the stream again after `backoff`."""
        self.pipeline.metrics.count("failed", handle.slot)
        self.pipeline.metrics.count("reconnects", handle.slot)
        log.warning("source %d (%s): %s; reconnecting in %.1f s", handle.id, handle.source.describe(), why, backoff)

    def stopping(self, handle: Stream) -> bool:
        return self.pipeline.stop_event.is_set() or handle.stop.is_set()


def _releaser(ring, slot):
    return lambda: ring.release(slot)


def _frame_hw(frame) -> tuple[int, int]:
    return frame.size()
