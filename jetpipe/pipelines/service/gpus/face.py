"""The face of a daemon on several GPUs: it places the streams, starts a worker per GPU, hands the workers'
records to the sinks that take records, answers /metrics, /healthz, /streams, the preview and the control API
(routes.py) for all of them, and merges the summary (totals.py). It runs no model and touches no GPU (it asks
the driver how many there are and their names).

A worker that dies (killed, a CUDA error, out of memory) is said (which GPU, which streams, how it ended) and
started again on its GPU, its streams resuming there, up to MAX_RESTARTS times a worker; the other workers keep
serving meanwhile. The summary counts the restarts and the frames each ended worker had delivered; a worker
that stays dead makes the run fail (exit 1).

`workers_per_gpu` > 1 starts that many workers on each GPU, the streams placed across all of them: for where one
process's Python (its GIL) rather than the GPU is the limit, as with many busy cameras.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.core.drain import WriterWatch, end_writer
from jetpipe.pipelines.outputs.sinks import FRAME_SCHEMES, SinkFanout, open_sinks, scheme_of
from jetpipe.pipelines.quantiles import RunHistogram
from jetpipe.pipelines.service.closing import close_in_reverse
from jetpipe.pipelines.service.gpus import channel, evidence, plan, totals
from jetpipe.pipelines.service.gpus.pages import FacePages
from jetpipe.pipelines.service.gpus.routes import FaceRoutes
from jetpipe.pipelines.service.gpus.workers import WorkerProcess, worker_config
from jetpipe.pipelines.service.http.review import review_of
from jetpipe.pipelines.service.http.server import MetricsServer

log = logging.getLogger(__name__)

LEFT_BEHIND_S = 10.0  # beyond its drain's bound (stop_timeout_s) a worker told to stop has this long, then is killed
MAX_RESTARTS = 3  # a worker started again at most this often in a run (a fault that repeats is said)


class MultiGpuFace:
    def __init__(self, config):
        self.config = config
        self.stopping = threading.Event()
        self.stopped_at: float | None = None  # when the first stop came (the workers' ends are bounded from then)
        self.interrupted: dict | None = None
        self.failure: str | None = None  # the face's own (its sinks' writer given up on: drain.end_writer)
        self.closers: list = []
        gpus = plan.resolve(config.gpus, config, "--gpus")
        models = plan.models_of(gpus)
        self.alike = len(set(models.values())) <= 1  # else added streams are placed by each GPU's model rate
        if not self.alike:
            log.warning("the GPUs differ (%s): streams are placed at start-up as if they were alike, those added "
                        "later by the rate each GPU's worker measured its model at; a TensorRT engine "
                        "runs only on the GPU model it was built for (each worker checks it): convert on each model, "
                        "or serve the ONNX model", ", ".join(f"{g}: {name}" for g, name in models.items()))
        per_gpu = config.workers_per_gpu  # a number: run_pipeline resolved auto (workers_choice)
        gpu_of = plan.workers_of(gpus, per_gpu)
        evidence.check(config, len(gpu_of))  # each worker records, cuts clips and snapshots into a part of its own
        # each worker's place among its GPU's (channel.Job.k): from 1 where a GPU has several, else 0
        self.ks = [n % per_gpu + 1 if per_gpu > 1 else 0 for n in range(len(gpu_of))]
        rates = [plan.offered_rate(s) for s in config.sources]
        numbers = list(range(len(gpu_of)))
        placement = plan.place(rates, numbers, [s.gpu for s in config.sources], gpu_of=gpu_of)
        self.placed = plan.Placed(gpu_of, placement, rates)
        self.uris = [s.uri for s in config.sources]
        record_sinks = [u for u in config.sinks if scheme_of(u) not in FRAME_SCHEMES]
        self.sinks = SinkFanout(open_sinks(record_sinks, len(config.sources), 1))
        self.closers.append(self.sinks.close)
        self.workers: list[WorkerProcess] = []  # each worker now (a GPU's workers together)
        self.ended: list[WorkerProcess] = []    # workers that died and were replaced
        self.server = None
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        if self.config.workers_per_gpu > 1:
            log.info("%d workers on each GPU (workers_per_gpu): a process each, the streams placed across them",
                     self.config.workers_per_gpu)
            _say_mps()
        for number, (gpu, k) in enumerate(zip(self.placed.gpu_of, self.ks)):
            name = channel.worker_name(gpu, k)
            ids = [i for i, w in self.placed.worker_of.items() if w == number]
            if not ids and not self.config.control.enabled:
                log.warning("%s has no stream to serve: no worker there", name)
                continue
            log.info("%s serves stream(s) %s", name, ", ".join(map(str, ids)))
            self.workers.append(self._worker(number, ids, 0))
        for worker in self.workers:  # they build at once: an engine per worker
            worker.wait_ready()
        if self.config.metrics_listen:
            control = self.config.control
            routes = FaceRoutes(self, control.token) if control.enabled else None
            pages = FacePages(self)
            self.server = MetricsServer(self.config.metrics_listen, pages.render_metrics, pages.health, pages.pages,
                                        routes, hosts=tuple(self.config.metrics_hosts),
                                        review=review_of(self.config))  # every worker's part of the recording
            self.closers.append(self.server.close)
            gpus = len({w.gpu for w in self.workers})
            several = f" ({len(self.workers)} workers)" if len(self.workers) > gpus else ""
            log.info("metrics of %d GPU(s)%s on http://%s/metrics, streams on http://%s/streams", gpus, several,
                     self.server.address, self.server.address)

    def _worker(self, number: int, ids: list[int], restart: int, resume=None) -> WorkerProcess:
        """number: which worker (its GPU: placed.gpu_of); resume: where a dead worker's records ended
        (streams.Resume): the new one goes on from there."""
        part, drawn = worker_config(self.config, [self.config.sources[i] for i in ids],
                                    bool(self.config.metrics_listen), restart)
        evidence.share(part, number, len(self.placed.gpu_of))
        job = channel.Job(self.placed.gpu_of[number], part, ids, len(self.uris), -1, records=bool(self.sinks.sinks),
                          first_added=self.placed.next_added(number), stride=self.placed.stride, resume=resume,
                          worker=number, k=self.ks[number])
        worker = WorkerProcess(job, self.sinks.put, restart=restart, drawn=drawn)
        self.closers.append(worker.close)
        return worker

    def serving(self) -> list[WorkerProcess]:
        """The workers serving now (started, not dead)."""
        return [w for w in self.workers if w.hello is not None and w.alive()]

    def _replace(self, dead: WorkerProcess) -> None:
        """A worker that died: said; started again on its GPU where it has restarts left (its streams resume)."""
        log.error("%s %s: stream(s) %s are not served until it is started again; the other workers go on",
                  dead.who, dead.ended(), ", ".join(map(str, dead.ids)))
        if dead.restart >= MAX_RESTARTS:
            log.error("%s died %d times: not started again", dead.who, dead.restart + 1)
            dead.given_up = True
            return
        lost = sorted(i for i in self.placed.live if self.placed.worker_of[i] == dead.number and i not in dead.ids)
        if lost:  # added through the control API: the new worker serves the configured streams
            log.error("stream(s) %s added through the control API on %s are not restored: add them again",
                      ", ".join(map(str, lost)), dead.name)
            for stream in lost:
                self.placed.removed(stream)
        # its streams' frame numbers, track IDs and the rules' counts go on where its records ended
        worker = self._worker(dead.number, dead.ids, dead.restart + 1, dead.reached)
        self.workers[self.workers.index(dead)] = worker
        self.ended.append(dead)
        if self.stopping.is_set():
            worker.tell("stop")
        try:
            worker.wait_ready()
        except JetpipeError as exc:
            log.error("%s: not started again", exc)
            worker.given_up = True
            return
        log.info("%s started again (restart %d of %d): stream(s) %s resume", dead.who, worker.restart,
                 MAX_RESTARTS, ", ".join(map(str, dead.ids)))

    # --- the run ------------------------------------------------------------------------------------
    def stop(self) -> None:
        self.stopped_at = self.stopped_at or time.monotonic()
        self.stopping.set()
        for worker in self.workers:
            worker.tell("stop")

    def abort(self, signal_name: str) -> None:
        self.stopped_at = self.stopped_at or time.monotonic()
        self.stopping.set()
        self.interrupted = {"signal": signal_name}
        for worker in self.workers:
            worker.tell(f"abort {signal_name}")

    def run(self) -> dict:
        try:
            return self._run()
        finally:
            self.close()

    def _run(self) -> dict:
        started, cpu_started = time.monotonic(), time.process_time()
        writer = threading.Thread(target=self.sinks.run, name="sinks", daemon=True)
        writer.start()
        watch = WriterWatch(self.sinks)  # a sink blocked in a write would hold the workers' pipes, then their ends
        # a worker's reader too: an ended worker's last records, still in its pipe, may wait on a blocked sink
        while (any(w.alive() or w.reader.is_alive() for w in self.workers) or any(self._dead())) \
                and not self._overdue():
            watch.check(ending=self.stopping.is_set() or not any(w.alive() for w in self.workers))
            if self.config.duration and time.monotonic() - started >= self.config.duration:
                self.stop()  # the workers keep their own duration: this bounds their ends from now
            for worker in self._dead():
                if self.stopping.is_set():
                    worker.given_up = True  # a stop asked meanwhile: not started again
                else:
                    self._replace(worker)
            time.sleep(0.1)
        if self._overdue():  # its readers' puts must not wait on a writer blocked in a write
            self.sinks.give_up()
        for worker in self.workers:  # one still running past its bound is killed (said, and the run's failure)
            worker.join(0.0 if self._overdue() else None)
        seconds = time.monotonic() - started
        left_behind = end_writer(self, self.sinks, writer)  # bounded: a sink blocked in a write
        self.sinks.close()
        summary = self.summary(seconds, time.process_time() - cpu_started)
        if self.failure:
            summary["failure"] = "; ".join(f for f in (summary.get("failure"), self.failure) if f)
        return {**summary, "left_behind": left_behind} if left_behind else summary

    def _overdue(self) -> bool:
        """A stop came longer ago than the workers' drain bound (stop_timeout_s; 0: none) and LEFT_BEHIND_S."""
        bound = self.config.stop_timeout_s
        return bool(self.stopped_at and bound and time.monotonic() - self.stopped_at > bound + LEFT_BEHIND_S)

    def _dead(self) -> list[WorkerProcess]:
        """Workers that ended without their summary (killed, crashed) and are not yet replaced or given up."""
        return [w for w in self.workers if not w.alive() and w.summary is None and not w.given_up and
                not w.reader.is_alive()]

    def summary(self, seconds: float, cpu_s: float) -> dict:
        latency = RunHistogram()
        every = [*self.ended, *self.workers]
        for worker in every:
            latency.merge(worker.latency)
        summary = totals.merge([w.outcome() for w in every], seconds, latency, self.config.sinks, self.sinks, cpu_s)
        if self.interrupted is not None:
            dropped = sum(w.summary.get("interrupted", {}).get("queued_frames_dropped", 0)
                          for w in every if w.summary is not None)
            summary["interrupted"] = {**self.interrupted, "queued_frames_dropped": dropped}
        return summary

    def close(self) -> None:
        close_in_reverse(self.closers)


def _say_mps() -> None:
    """Whether the workers of a GPU share it through CUDA MPS: without it they take turns (measured on an H200,
    32 sparse cameras in two workers: p99 107 ms, against 42 in one process and 24 with MPS)."""
    if os.environ.get(plan.SIMULATED_ENV):
        return
    pipes = plan.mps_running()
    if pipes:
        log.info("CUDA MPS runs (its control socket in %s): the workers' kernels share each GPU side by side", pipes)
    else:
        log.warning("CUDA MPS is not running: the workers of a GPU take turns on it, which costs latency where the "
                    "GPU is busy; start it as the GPU's owner (nvidia-cuda-mps-control -d) before serving, or keep "
                    "--workers-per-gpu for where one process's CPU is the limit")
