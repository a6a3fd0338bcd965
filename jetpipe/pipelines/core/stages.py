"""The stages between the batcher and the sinks: the GPU stage, the post stage, the secondary stage.

The GPU stage submits each batch as it forms; the post stage collects each when the GPU is done with it
(reading its outputs in place while later batches run: the runtime holds that buffer set until it is
released), finishes it (the task's postprocessing, then the per-frame steps: steps.py; behind, it finishes the
batches already done on the GPU together, the steps once on all their frames) and emits its records;
with secondary models the secondary stage reads the crops of the finished batches while the post stage
finishes the next one (the batches' frames stay where the kernel read them until then), and emits. Each
stage is a loop its thread runs (gpu_loop, post_loop, secondary_loop); `finish`, `run_steps` and `emit` are the
seams.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

from jetpipe.pipelines.core.chain_gate import ChainGate
from jetpipe.pipelines.core.record import BatchJson, FrameRecord
from jetpipe.pipelines.core.secondary import frames_read
from jetpipe.pipelines.ingest.batcher import QueuedFrame
from jetpipe.tasks.detections import Detections, finish_detections

log = logging.getLogger(__name__)
IDLE_S = 0.05  # the post thread with no batch this long flushes what the steps held back (events)
GROUP_MAX = 2  # batches the post thread finishes together when it is behind: of the daemon's 4 buffer sets, 2
#                stay in flight on the GPU
_NOTHING = object()  # no batch taken from the queue (None there: the run's end)


@dataclass(frozen=True)
class FrameParts:
    """What every frame passes through, built once by the daemon and handed whole to the loops that move the
    frames (StageLoops) and the summary that counts them (service.summary.RunSummary)."""

    runtime: object      # runtime.api.Runtime
    batcher: object      # ingest.batcher.Batcher
    streams: object      # ingest.streams.Streams
    metrics: object      # counters.StreamCounters
    sinks: object        # outputs.sinks.SinkFanout: the drawing sinks are offered frames here
    bus: object          # bus.RecordBus: every record is published on it
    pool: object = None  # the post threads' executor (tasks finish a batch's frames across it)


class StageLoops:
    def __init__(self, parts: FrameParts, postprocess, task: str, steps: list, secondaries: list,
                 fail_timeout_s: float, on_failure, profile: bool = False):
        """postprocess: the task's (named `task`); on_failure(): every batch has failed for fail_timeout_s (stop
        the daemon; `failure` says why)."""
        runtime, self.postprocess, self.task = parts.runtime, postprocess, task
        self.runtime, self.batcher, self.streams, self.metrics = runtime, parts.batcher, parts.streams, parts.metrics
        self.sinks, self.publish, self.pool = parts.sinks, parts.bus.publish, parts.pool
        self.steps, self.secondaries = steps, secondaries
        self.fail_timeout_s, self.on_failure, self.profile = fail_timeout_s, on_failure, profile
        self.collected: queue.Queue = queue.Queue()  # submitted batches, bounded by the buffer-set semaphore
        # finished batches for the secondary stage: two may wait, read together (_read_secondaries)
        self.chained: queue.Queue = queue.Queue(maxsize=2)
        self.chain_gate = ChainGate()  # live frames wait in the batcher while the secondary is behind
        self.free_sets = threading.Semaphore(runtime.buffer_sets)
        self.failure: str | None = None       # why it stopped itself: every batch failed for fail_timeout_s
        self._failing_since: float | None = None  # the first failed batch after the last good one
        self.gpu_stage_ms: dict[str, list[float]] = {}
        # wall seconds of the post (and secondary) thread by phase: where a batch's time goes when a thread
        # is the limit; "handoff": the post thread waiting for the secondary thread to take a batch
        self.gpu_busy_s = 0.0  # the GPU's time on the batches (CUDA events), where the runtime measures it
        self.post_phase_s = dict.fromkeys(("wait_gpu", "finish", "handoff") if secondaries else
                                          ("wait_gpu", "finish", "records"), 0.0)
        self.secondary_phase_s = dict.fromkeys(("secondary", "records"), 0.0)
        self.secondary_reads = 0  # times the secondary thread read crops: fewer than batches where it caught up
        self.collecting_since: float | None = None  # the post thread waits for a batch's GPU work since then
        self.longest_batch_s = 0.0  # submit to collected, the longest yet (a slow CPU backend's run's end waits on)

    def reset_slot(self, slot: int) -> None:
        """A new stream takes `slot`: the steps and secondaries forget the stream it held."""
        for step in self.steps:
            step.reset(slot)
        for secondary in self.secondaries:
            secondary.forget(slot)

    # --- the threads' loops ----------------------------------------------------------------------
    def gpu_loop(self) -> None:
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
                self.fail(packets, exc)
                continue
            self.collected.put((ticket, packets, t_batch))

    def post_loop(self) -> None:
        waiting = _NOTHING  # a batch taken from the queue whose GPU work was not done: the next group's first
        while True:
            if waiting is _NOTHING:
                try:
                    waiting = self.collected.get(timeout=IDLE_S)
                except queue.Empty:
                    self._flush_steps()  # no batch for a while: what the steps held back goes out
                    continue
            if waiting is None:
                self._flush_steps()
                return
            group, waiting = _ready_group(self.collected, self.runtime, waiting)
            self._post(group)

    def _post(self, group: list) -> None:
        """A group of submitted batches collected and finished, the steps run on all their frames at once (a
        stream's frames in order), then each batch emitted or handed to the secondary stage."""
        finished = []
        for ticket, packets, t_batch in group:
            try:
                result, t_gpu = self._collect(ticket, packets, t_batch)
                finished.append((ticket, packets, t_batch, result, t_gpu, self.finish(result, packets)))
            except Exception as exc:
                self._give_up(ticket, packets, exc)
        if not finished:  # every batch of the group failed: fail_timeout_s's clock runs on
            return
        try:
            self.run_steps([(result, packets, results) for _, packets, _, result, _, results in finished])
        except Exception as exc:
            for ticket, packets, *_ in finished:
                self._give_up(ticket, packets, exc)
            return
        self._failing_since = None
        for ticket, packets, t_batch, result, t_gpu, results in finished:
            handed = False
            try:
                if self.secondaries:  # the secondary thread reads its crops, writes its records and releases it
                    t_handoff = time.perf_counter()
                    self.chained.put((ticket, result, packets, results, t_batch, t_gpu))
                    self.post_phase_s["handoff"] += time.perf_counter() - t_handoff
                    handed = True
                else:
                    self.emit(result, packets, results, t_batch, t_gpu, self.post_phase_s)
            except Exception as exc:
                self.fail(packets, exc)
            finally:
                if not handed:
                    self._release(ticket)

    def _give_up(self, ticket, packets, exc) -> None:
        self.fail(packets, exc)
        self._release(ticket)

    def _release(self, ticket) -> None:
        self.runtime.release(ticket)
        self.free_sets.release()
        if self.secondaries:
            self.chain_gate.lost()

    def _collect(self, ticket, packets: list[QueuedFrame], t_batch: float):
        """The batch's outputs once the GPU is done (waiting blocks, it does not spin), and when that was."""
        t_wait, self.collecting_since = time.perf_counter(), time.monotonic()
        try:
            result = self.runtime.collect(ticket, hold=True)
        finally:
            self.collecting_since = None
        self.post_phase_s["wait_gpu"] += time.perf_counter() - t_wait
        waited_s = time.monotonic() - t_batch  # submitted to collected
        self.longest_batch_s = max(self.longest_batch_s, waited_s)
        self.metrics.batches += 1
        if result.engine_ms is not None:  # the GPU's own time on the batch
            engine_s = result.engine_ms / 1e3
            self.gpu_busy_s += (result.engine_ms if result.busy_ms is None else result.busy_ms) / 1e3
        else:
            engine_s = waited_s
        self.batcher.record_batch(len(packets), engine_s)
        if self.profile:
            for stage, ms in self.runtime.stage_times(ticket).items():
                self.gpu_stage_ms.setdefault(stage, []).append(ms)
        return result, time.monotonic()

    def secondary_loop(self) -> None:
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
                    self.fail(packets, exc)
            for ticket, result, packets, found, t_batch, t_gpu in items:
                try:
                    if read:
                        self.emit(result, packets, found, t_batch, t_gpu, phase)
                except Exception as exc:
                    self.fail(packets, exc)
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
                frames += [packets[i].as_read() for i in result.frame_indices]  # finish() set where they were read
                streams += [self.streams.id_of(packets[i].stream) for i in result.frame_indices]
        if results:
            for stage in self.secondaries:
                stage.run(results, frames, streams)
        phase["secondary"] += time.perf_counter() - t_secondary
        self.secondary_reads += 1

    def _flush_steps(self) -> None:
        for step in self.steps:
            try:
                step.flush()
            except Exception:
                log.exception("the %s step failed", step.name)

    # --- the seams -------------------------------------------------------------------------------
    def finish(self, result, packets: list[QueuedFrame]) -> list[Detections]:
        """The task's finish of a collected batch: its frames' results."""
        t_finish = time.perf_counter()
        used = [packets[i] for i in result.frame_indices]
        sizes = [p.frame.size() for p in used]
        results = finish_detections(self.postprocess, result.outputs, result.letterboxes, sizes, self.pool,
                                    reduced=result.reduction is not None) if used else []
        if result.frame_addresses is not None:  # crops (looks, secondaries) are cut where the frames already are
            for packet, read in zip(used, frames_read(result, [p.frame for p in used])):
                packet.read = read
        self.post_phase_s["finish"] += time.perf_counter() - t_finish
        return results

    def run_steps(self, batches: list) -> None:
        """Each step on the frames of these finished batches ((result, packets, results) each), all at once and
        in order (a stream's frames reach this one thread in order)."""
        t_steps = time.perf_counter()
        used = [packets[i] for result, packets, _ in batches for i in result.frame_indices]
        results = [detections for *_, found in batches for detections in found]
        for step in self.steps:
            step.run(used, results)
        self.post_phase_s["finish"] += time.perf_counter() - t_steps

    def emit(self, result, packets: list[QueuedFrame], results: list[Detections], t_batch: float, t_gpu: float,
             phase: dict) -> None:
        """Records of a finished batch to the sinks (frames to those that draw them); its ring slots released."""
        t_records = time.perf_counter()
        used = [packets[i] for i in result.frame_indices]
        for index, reason in result.rejected:
            log.warning("frame %d of stream %d rejected: %s", packets[index].frame_no, packets[index].stream,
                        reason)
            self.metrics.count("failed", packets[index].stream)
        t_post = time.monotonic()
        batch_json = BatchJson(results)
        for place, (packet, res) in enumerate(zip(used, results)):
            latency = {"queue": (t_batch - packet.t_monotonic) * 1e3, "gpu": (t_gpu - t_batch) * 1e3,
                       "post": (t_post - t_gpu) * 1e3, "total": (t_post - packet.t_monotonic) * 1e3}
            self.metrics.record_result(packet.stream, latency)
            stream = self.streams.slots[packet.stream]  # in its slot until its frames are through
            record = FrameRecord(stream.id, stream.source.uri, packet.frame_no,
                                 None if packet.pts is None else round(packet.pts, 6), round(packet.t_capture, 6),
                                 round(time.time(), 6), {k: round(v, 3) for k, v in latency.items()}, self.task, res)
            record.batch_json = (batch_json, place)
            # a copy of the frame, before its ring slot is released; files: every frame, as inference
            self.sinks.offer(stream.id, packet.frame, record, self.runtime.frame_to_host, wait=not stream.source.live)
            self.publish(record)
        for packet in packets:
            packet.release()
        phase["records"] += time.perf_counter() - t_records

    def fail(self, packets, exc) -> None:
        """A batch that failed: its frames counted failed and released; failing for fail_timeout_s stops."""
        log.error("batch of %d frames failed: %s", len(packets), exc)
        for p in packets:
            p.release()
            self.metrics.count("failed", p.stream)
        now, limit = time.monotonic(), self.fail_timeout_s
        if self._failing_since is None:
            self._failing_since = now
        elif limit and now - self._failing_since >= limit and self.failure is None:
            # settings that passed start-up and fail every frame: stop with the reason, not run on at exit 0
            self.failure = f"every batch failed for {now - self._failing_since:.0f} s (fail_timeout_s {limit:g}); " \
                           f"the last: {str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}"
            log.error("stopping: %s", self.failure)
            self.on_failure()

    # --- the run's end ---------------------------------------------------------------------------
    def unfinished_s(self) -> float:
        """How long the post thread has waited for the batch it collects (0: not waiting). The GPU thread goes on
        beating while it waits for a free buffer set, so a hung batch shows here, not in the heartbeat."""
        since = self.collecting_since
        return 0.0 if since is None else time.monotonic() - since

    def end_post(self) -> None:
        """The GPU stage has returned: the post stage returns once it has collected what was submitted."""
        self.collected.put(None)

    def end_secondary(self) -> None:
        self.chained.put(None)

    def stats(self) -> dict:
        """The stages' part of the run's summary."""
        batches = self.metrics.batches
        return {
            "gpu_stage_ms": {k: _median(v) for k, v in self.gpu_stage_ms.items()},
            # the share of the run the GPU spent on batches: near 1, the GPU is what limits throughput
            "gpu_busy_s": self.gpu_busy_s,
            "post_thread_ms_per_batch": _per_batch(self.post_phase_s, batches),
            **({"secondary_thread_ms_per_batch": _per_batch(self.secondary_phase_s, batches),
                "secondary_reads": self.secondary_reads,
                "secondary_held_primary_s": round(self.chain_gate.held_s, 3)} if self.secondaries else {}),
            **({"secondary": {s.name: s.summary() for s in self.secondaries}} if self.secondaries else {}),
            **{key: value for step in self.steps for key, value in step.stats().items()},
        }


def _ready_group(collected: queue.Queue, runtime, first) -> tuple[list, object]:
    """The batch and those queued behind it whose GPU work is done, up to GROUP_MAX: a post thread that is behind
    finishes them together (the steps' per-pass work, the tracker's most, shared by more frames; it does not wait
    for the GPU to make a group). Also the first item that did not join, if one was taken (else _NOTHING)."""
    group = [first]
    while len(group) < GROUP_MAX:
        try:
            item = collected.get_nowait()
        except queue.Empty:
            return group, _NOTHING
        if item is None or not runtime.ready(item[0]):
            return group, item
        group.append(item)
    return group, _NOTHING


def _per_batch(phase_s: dict[str, float], batches: int) -> dict[str, float]:
    return {k: round(1e3 * v / max(1, batches), 3) for k, v in phase_s.items()}


def _median(values: list[float]) -> float:
    return round(float(sorted(values)[len(values) // 2]), 4) if values else 0.0
