"""The video-stream daemon: the wiring of its rooms, one way from the sources to the sinks.

    ingest (sources, rings, capture) -> batcher -> stages (GPU, post + per-frame steps, secondary)
        -> records -> sinks (one fan-out) ; summary and http read what the others count

Pipeline builds them (each closed in reverse order by close()), runs their threads and waits for the end:
stop() (SIGTERM/SIGINT) stops the sources, the batcher drains what is queued, the stages finish what is in
flight, the sinks flush and close, and run() returns the summary. Queues are bounded: when the GPU falls
behind, frames are dropped at the batcher (counted), never accumulated. The only feedback against the flow
is the batcher's own measurement of the batches it cut.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from jetpipe import bundle as bundles
from jetpipe import lazy
from jetpipe.lazy import lazy_import
from jetpipe.pipelines.config import ConfigError, PipelineConfig
from jetpipe.pipelines.core.bus import RecordBus
from jetpipe.pipelines.core.drain import DrainBound, end_stages, end_writer, patience_s
from jetpipe.pipelines.core.events import rules
from jetpipe.pipelines.core.secondary import SecondaryStage
from jetpipe.pipelines.core.secondary import check as check_secondary
from jetpipe.pipelines.core.stages import FrameParts, StageLoops
from jetpipe.pipelines.core.steps import build_steps
from jetpipe.pipelines.core.tracking.appearance import Appearance
from jetpipe.pipelines.counters import StreamCounters
from jetpipe.pipelines.ingest.batcher import Batcher
from jetpipe.pipelines.ingest.intake import Ingest, frame_bound
from jetpipe.pipelines.ingest.streams import ControlError, Share, Streams
from jetpipe.pipelines.outputs.clips.writer import open_clips
from jetpipe.pipelines.outputs.preview import Preview
from jetpipe.pipelines.outputs.recording.process import open_recorder
from jetpipe.pipelines.outputs.sinks import SinkFanout, open_sinks
from jetpipe.pipelines.outputs.snapshots import Snapshots, jpeg_encoder
from jetpipe.pipelines.service.closing import close_in_reverse
from jetpipe.pipelines.service.http.control import Control
from jetpipe.pipelines.service.http.pages import PreviewPages
from jetpipe.pipelines.service.http.review import review_of
from jetpipe.pipelines.service.http.server import MetricsServer
from jetpipe.pipelines.service.offered import instance_options
from jetpipe.pipelines.service.summary import RunSummary
from jetpipe.runtime.open import open_runtime
from jetpipe.runtime.triton_backend import is_triton
from jetpipe.tasks import for_bundle

cv2 = lazy_import("cv2")
log = logging.getLogger(__name__)

BUFFER_SETS = 4  # 2 batches in flight on the GPU + 1 waiting for postprocessing + 1 being postprocessed
CHAINED_SETS = 1  # with secondaries: + 1 batch whose crops are being read (up to two more may wait in the
# handoff, holding sets the GPU stage would otherwise take: a secondary that is behind slows the primary)
HEALTH_SILENT_S = 10.0  # /healthz answers 503 when the GPU stage has been silent (or a batch unfinished) this long
STOP_GRACE_S = 4.0  # after stop(), sources still blocked (an RTSP connect inside OpenCV) are left behind
REMOVE_WAIT_S = 30.0  # DELETE /streams/ID answers when the stream's frames are through, or after this (202)


def shared_cpu_threads(secondaries: int, cores: int | None = None) -> int:
    """ONNX Runtime intra-op threads for each model of a pipeline on the CPU runtime. One model: 0 (ONNX
    Runtime's own, a thread a core). With secondaries, the primary (the GPU-stage thread) and the secondaries
    (one after another in the secondary thread) run at once: each gets half the cores. A session's threads
    over the whole machine, beside another's, cost more CPU than they save: PP-OCRv4 det on 2 cores, 2
    threads 212 ms and 359 ms of CPU a frame against 240 ms and 240 ms on 1 (docs/lab/benchmarks.md)."""
    if not secondaries:
        return 0
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // 2)


def stream_slots(config: PipelineConfig) -> int:
    """Streams served at once: the sources given, or the control API's max_streams (0: the sources given)."""
    if config.control.enabled:
        return config.control.max_streams or len(config.sources)
    return len(config.sources)


def check_frames_reach(runtime, stage) -> None:
    """A secondary cuts its crops where the primary read the frames: in GPU memory with the GPU runtime, which a
    secondary on the CPU path cannot read."""
    if runtime.device_frames and not stage.runtime.device_frames:
        raise ConfigError(f"secondary {stage.name!r} runs on the CPU path ({stage.runtime.backend_name}) and the "
                          "primary's frames are in GPU memory: run it on the GPU too (its backend, or "
                          "?preprocess=gpu for a Triton model)")


def _open_appearance(config: PipelineConfig, cpu_threads: int) -> Appearance | None:
    """--reid's model on the crops, run here like a secondary (a Triton primary's looks: on this machine)."""
    if not config.reid:
        return None
    backend = "auto" if is_triton(config.backend) else config.backend
    return Appearance(config.reid, backend, config.memory, config.max_frame_hw, cpu_threads)


def helper_processes_cpu(decoders, recorder) -> dict[str, float]:
    """The decode processes' and the recording process's CPU seconds: the run's too (cpu_cores counts them);
    decode_links: the serving process's threads that feed the decode processes (part of "process")."""
    cpu = {}
    if decoders is not None:
        cpu["decode_processes"], cpu["decode_links"] = decoders.cpu_seconds(), decoders.link_cpu_seconds()
    if recorder is not None:
        cpu["recording_process"] = recorder.process_cpu_s()
    return cpu


def evidence_for_added(clips, recorder, record_mode: str):
    """What a stream added while serving is prepared with: its packet ring before its first read (a clip and a
    recording may start at its first keyframe); None where neither clips nor recording are on."""
    if clips is None and recorder is None:
        return None

    def prepare(stream) -> None:
        if clips is not None:
            clips.attach(stream.id, stream.source, at_start=False)
        if recorder is not None:
            recorder.attach(stream.id, stream.source, stream.spec.record or record_mode, at_start=False)
    return prepare


def check_against_task(config: PipelineConfig, task, labels, classes: int | None = None) -> None:
    """What the configuration asks of the model's results: boxes to track, the classes rules and secondaries
    name (one line, ConfigError, before anything opens)."""
    if config.tracker != "none" and not task.boxes:
        raise ConfigError(f"tracker = {config.tracker!r} tracks detected boxes; task {task.name} has none: "
                          + ("zones and lines count tracked boxes: remove them" if config.zones or config.lines
                             else "use tracker = 'none'"))
    rules.check_against([*config.zones, *config.lines], stream_slots(config), labels, config.control.enabled,
                        "config", classes)
    for secondary in config.secondaries:
        check_secondary(secondary, task, labels, "config")
        if secondary.every_track and config.tracker == "none":
            raise ConfigError(f"config: secondary {secondary.label!r}: every_track = {secondary.every_track} "
                              "reuses a result while its track lives: add --tracker (botsort, bytetrack or iou)")


class Pipeline:
    def __init__(self, config: PipelineConfig, on_result=None, profile: bool = False, share: Share | None = None):
        """profile: time every batch's GPU stages with CUDA events (the summary's gpu_stage_ms); share: the part
        of a daemon's streams this process serves (a GPU's worker; None: all of them)."""

        self.config, self.share = config, share
        self.stop_event = threading.Event()
        self.interrupted: dict | None = None  # abort(): the second signal, and the queued frames it dropped
        self.left_behind: list[str] = []  # the stage threads given up on at the run's end (drain.StageJoin)
        self._cpu_lock = threading.Lock()
        self.on_result = on_result  # optional callback(record), e.g. for the demo's console output
        manifest = bundles.read_manifest(config.bundle)
        task, options = for_bundle(manifest, config.task)  # checked against the outputs before any frame
        self.task = task.name
        self.postprocess = task.postprocessor(options)
        self.labels = options.labels
        self.class_count = task.class_count(options)  # rules' class numbers are held to it
        check_against_task(config, task, options.labels, self.class_count)
        config.max_frame_hw = frame_bound(config)  # before the runtime allocates for it
        cpu_threads = shared_cpu_threads(len(config.secondaries))
        self.runtime = open_runtime(config.bundle, config.max_batch, config.backend, config.memory,
                                    max_frame_hw=config.max_frame_hw, reduction=self._reduction(), profile=profile,
                                    buffer_sets=BUFFER_SETS + (CHAINED_SETS if config.secondaries else 0),
                                    cpu_threads=cpu_threads, **instance_options(config))
        self.profile = profile
        self.thread_cpu_s: dict[str, float] = {}  # CPU seconds of each pipeline thread, at its end
        self.closers = [self.runtime.close]
        self.secondaries = []
        try:
            for secondary in config.secondaries:  # each registered as it opens: a later failure closes it
                self.secondaries.append(SecondaryStage(secondary, secondary.backend or config.backend, config.memory,
                                                       config.max_frame_hw, config.postprocess, cpu_threads))
                self.closers.append(self.secondaries[-1].close)
                check_frames_reach(self.runtime, self.secondaries[-1])
            self.appearance = _open_appearance(config, cpu_threads)  # botsort's looks (None: by motion only)
            self.closers += [self.appearance.close] if self.appearance is not None else []
            self._build()
        except BaseException:
            self.close()
            raise

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
        capacity = stream_slots(config)
        share = self.share
        self.streams = Streams(capacity) if share is None else Streams(capacity, share.ids, share.first_added,
                                                                        share.stride, share.resume)
        self.batcher = Batcher(capacity, runtime.max_batch, config.batch_timeout_ms / 1000, config.queue_depth,
                               budget_s=config.latency_budget_ms / 1000 or None,
                               batches_running=runtime.batches_running)
        if config.latency_budget_ms:  # planned from the model's time, measured now where the runtime can
            self.batcher.plan(runtime.engine_times((1, 2)))
        self.metrics = StreamCounters(capacity, ids=None if share is None else share.ids)
        self.ingest = Ingest(config, runtime, self.streams, self.batcher, self.metrics, self.stop_event,
                             self._start_thread, self._removed)
        self.closers.append(self.ingest.close)
        self.ingest.open_configured()
        # with the control API, files are numbered by stream ID from the start (streams come and go)
        numbered = max(2, capacity) if self.control else len(config.sources) if share is None else share.total
        self.jpeg = jpeg_encoder(config, runtime)  # the snapshots' and the jpeg: sinks'
        if self.jpeg is not None:
            self.closers.append(self.jpeg.close)  # after the sinks and the snapshots that use it
        sinks = open_sinks(config.sinks, numbered, runtime.max_batch, self.jpeg, None if share is None else share.ids)
        self.sinks = SinkFanout(sinks + ([share.forward] if share else []), self.on_result)
        self.closers.append(self.sinks.close)
        self.drain_bound = DrainBound(config.stop_timeout_s, self.batcher, self.sinks)
        self.pool = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="post")
        self.closers.append(self.pool.shutdown)
        self.bus = RecordBus()
        self.bus.subscribe(self.sinks.put)  # every record, first: an event reaches the sinks before its clip starts
        self.clips = open_clips(config, self.bus, self.streams.live(), self.closers)
        self.recorder = open_recorder(config, self.bus, self.streams.live(), self.closers)  # after the clips' rings
        self.snapshots = Snapshots(config.snapshots, self.jpeg, self.bus.publish) if config.snapshots.folder else None
        if self.snapshots is not None:  # before the steps: the events step keeps its frames for it
            self.closers.append(self.snapshots.close)
            self.bus.subscribe(self.snapshots.take, types=config.snapshots.on, frame=True)
        steps = build_steps(config, capacity, self.labels, self.streams.id_of, self.bus,
                            self.streams.first_track_ids(), self.streams.resume.event_counts, self.streams.moving,
                            self.runtime.frame_to_host, self.appearance)
        self.events = next((s for s in steps if s.name == "events"), None)
        parts = FrameParts(runtime, self.batcher, self.streams, self.metrics, self.sinks, self.bus, self.pool)
        self.stages = StageLoops(parts, self.postprocess, self.task, steps, self.secondaries, config.fail_timeout_s,
                                 self.stop, self.profile)
        evidence = (self.clips, self.snapshots, self.recorder)
        self.report = RunSummary(config, parts, self.stages, self.events, evidence, self.drain_bound)
        self.metrics.add_gauge("jetpipe_gpu_memory_free_bytes", self.runtime.gpu_free_memory)
        self.metrics.add_gauge("jetpipe_streams", lambda: len(self.streams.live()))
        self.metrics.add_families(self.sinks.metric_families)
        if self.events is not None:
            self.metrics.add_families(self.events.metric_families)
            self.sinks.show_scene(self.events.scene)
        if runtime.backend_name != "onnxruntime-cpu":
            # only drawing (sinks, preview) and postprocessing use OpenCV, each in a thread of its own; OpenCV's
            # pool of a thread a core in every call made them fight (4.6 cores, -60 % with 8 drawing threads)
            cv2.setNumThreads(1)
        else:  # the CPU runtime's preprocessing uses it: loaded at its first frame, it held the inference thread
            lazy.load(cv2)
        self.server, self.preview = None, None
        if config.metrics_listen:
            self._serve_http(capacity)

    def _removed(self, stream) -> None:
        """A removed stream's last frame reached the sinks: its outputs end, its clips' ring and recording go."""
        self.sinks.end_stream(stream.id)
        for evidence in (e for e in (self.clips, self.recorder) if e is not None):
            evidence.removed(stream.id)

    def _serve_http(self, capacity: int) -> None:
        """The metrics server: /metrics, /healthz, the preview page, and the control API where it is on."""
        config = self.config
        self.preview = Preview(capacity, self.runtime.max_batch)  # draws only while watched
        self.closers.append(self.preview.close)
        self.sinks.add_viewer(self.preview)
        control = Control(self, config.control) if self.control else None
        pages = PreviewPages(self.streams, self.metrics, self.batcher, self.preview)
        self.server = MetricsServer(config.metrics_listen, self._render_metrics, self._health, pages, control,
                                    hosts=tuple(config.metrics_hosts), review=review_of(config))
        self.closers.append(self.server.close)
        log.info("metrics on http://%s/metrics, live preview on http://%s/%s", self.server.address,
                 self.server.address, f", streams on http://{self.server.address}/streams (up to {capacity})"
                 if control else "")

    @property
    def sources(self) -> list:
        """The source of each stream in a slot now."""
        return [s.source for s in self.streams.live()]

    @property
    def decoders(self):
        return self.ingest.decoders

    @property
    def failure(self) -> str | None:
        """Why it stopped itself: every batch failed for fail_timeout_s."""
        return self.stages.failure

    def _render_metrics(self) -> str:
        return self.metrics.prometheus(self.batcher.drop_counts(), self.batcher.depths(), self.ingest.decode_errors())

    def _health(self) -> tuple[bool, str]:
        if self.stop_event.is_set():
            return False, "stopping"
        silent = max(time.monotonic() - self.metrics.heartbeat, self.stages.unfinished_s())  # a hung batch too
        if silent >= patience_s(self.stages, HEALTH_SILENT_S):
            return False, f"GPU stage silent for {silent:.0f} s"
        degraded = self.recorder.health() if self.recorder is not None else None  # serving goes on: 200
        return True, "ok" if degraded is None else f"degraded: {degraded}"

    # --- threads -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the sources (a blocked read or open is interrupted), then drain (see run(); bounded)."""
        self.stop_event.set()
        self.ingest.stop()
        self.drain_bound.start()

    def abort(self, signal_name: str) -> None:
        """A second stop (Ctrl-C or SIGTERM while draining): drop the queued frames and finish only the
        batches already on the GPU, then write the summary as usual."""
        self.stop()
        dropped = self.batcher.abort()
        self.sinks.cut_short()
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
        stages = self.stages
        gpu = self._thread(stages.gpu_loop, "gpu")
        post = self._thread(stages.post_loop, "post")
        chained = self._thread(stages.secondary_loop, "secondary") if self.secondaries else None
        writer = self._thread(self.sinks.run, "sinks")
        for t in (gpu, post, *([chained] if chained else []), writer):
            t.start()
        self.ingest.start()
        self._serve(started)
        self.batcher.close()  # sources are done: drain what is queued
        self.left_behind = end_stages(stages, gpu, post, chained, self.sinks)  # bounded: a hung GPU gives them up
        self.ingest.free_removed()  # streams whose removal was asked: their frames are through now
        # clips and pictures still waiting written (their records too, indexed by the recorder), then the recording
        for evidence in (self.clips, self.snapshots, self.recorder):
            if evidence is not None:
                evidence.close()
        self.left_behind += end_writer(stages, self.sinks, writer)  # bounded: a sink blocked in a write
        self.thread_cpu_s["process"] = time.process_time() - cpu_started
        self.thread_cpu_s.update(helper_processes_cpu(self.decoders, self.recorder))
        seconds = time.monotonic() - started
        self.sinks.close()  # before the summary: what fails while a sink finishes is counted
        self.drain_bound.cancel()
        summary = self.report.summary(seconds, self.thread_cpu_s, self.interrupted)
        return {**summary, "left_behind": self.left_behind} if self.left_behind else summary

    def _serve(self, started: float) -> None:
        """While sources capture (with the control API: until stopped, streams may be added at any time): stalls
        restarted, removed streams freed, the duration kept, the status said."""
        last_log, stopped_at = time.monotonic(), None
        while self.ingest.capturing() or (self.control and not self.stop_event.is_set()):
            self.ingest.capture.restart_stalled()
            self.ingest.free_removed()
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
                log.info(self.report.status_line())
                last_log = time.monotonic()
            self.report.say_overload()
            time.sleep(0.05)

    def _start_thread(self, target, role: str, *args, name: str | None = None) -> None:
        self._thread(target, role, *args, name=name).start()

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

    # --- the control API: streams added and removed while serving --------------------------------
    def list_streams(self) -> dict:
        return {"max_streams": self.streams.capacity, "streams": [self.report.describe(s) for s in self.streams.live()]}

    def describe_stream(self, stream_id: int) -> dict:
        stream = self.streams.find(stream_id)
        if stream is not None:
            return self.report.describe(stream)
        with self.streams.lock:
            retired = self.streams.retired.get(stream_id)
        if retired is None:
            raise ControlError(404, f"no stream {stream_id}: GET /streams lists them")
        return {"id": stream_id, **retired}

    def add_stream(self, spec) -> dict:
        """Serve one more source in a free slot (Ingest.add says what may refuse it)."""
        prepare = evidence_for_added(self.clips, self.recorder, self.config.record.mode)
        return self.report.describe(self.ingest.add(spec, self.stages.reset_slot, prepare))

    def request_clip(self, stream_id: int, asked) -> dict:
        """POST /streams/ID/clips: a clip of the stream around its newest frame (Clips.around_now)."""
        if self.clips is None:
            raise ControlError(409, "clips are off: serve with --clips DIR ([clips] folder)")
        if self.streams.find(stream_id) is None:
            raise ControlError(404, f"no stream {stream_id}: GET /streams lists them")
        return self.clips.around_now(stream_id, asked)

    def remove_stream(self, stream_id: int, wait_s: float = REMOVE_WAIT_S) -> tuple[int, dict]:
        """Stop a stream's source; its queued and in-flight frames finish and reach the sinks, then its slot is
        free. (200, the stream's final counters) once that is done, (202, ...) if it takes longer than wait_s."""
        stream = self.streams.find(stream_id)
        if stream is None:
            with self.streams.lock:
                gone = stream_id in self.streams.retired
            raise ControlError(404, f"stream {stream_id} was removed already" if gone else
                               f"no stream {stream_id}: GET /streams lists them")
        done = self.ingest.remove(stream, wait_s)
        return (200 if done else 202), self.describe_stream(stream_id)

    def status_line(self) -> str:
        return self.report.status_line()

    def close(self) -> None:
        if set(self.left_behind) - {"sinks"}:  # a free or a synchronize would wait for the stuck batch
            log.error("GPU memory and the sources are not freed (a stage was left behind): the process must end")
            return
        close_in_reverse(self.closers)
