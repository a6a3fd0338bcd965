"""The face of a daemon on several GPUs: it places the streams, starts a worker per GPU, hands the workers'
records to the sinks that take records, answers /metrics, /healthz, /streams, the preview and the control API
(routes.py) for all of them, and merges the summary (totals.py). It runs no model and touches no GPU (it asks
the driver how many there are and their names).

A worker that dies (killed, a CUDA error, out of memory) is said (which GPU, which streams, how it ended) and
started again on its GPU, its streams resuming there, up to MAX_RESTARTS times a GPU; the other GPUs keep
serving meanwhile. The summary counts the restarts and the frames each ended worker had delivered; a GPU
whose worker stays dead makes the run fail (exit 1).
"""

from __future__ import annotations

import logging
import threading
import time

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.outputs.sinks import FRAME_SCHEMES, SinkFanout, open_sinks, scheme_of
from jetpipe.pipelines.quantiles import RunHistogram
from jetpipe.pipelines.service.closing import close_in_reverse
from jetpipe.pipelines.service.gpus import channel, plan, totals
from jetpipe.pipelines.service.gpus.pages import FacePages
from jetpipe.pipelines.service.gpus.routes import FaceRoutes
from jetpipe.pipelines.service.gpus.workers import WorkerProcess, worker_config
from jetpipe.pipelines.service.http.server import MetricsServer

log = logging.getLogger(__name__)

LEFT_BEHIND_S = 10.0  # beyond its drain's bound (stop_timeout_s) a worker told to stop has this long, then is killed
MAX_RESTARTS = 3  # a GPU's worker started again at most this often in a run (a fault that repeats is said)


class MultiGpuFace:
    def __init__(self, config):
        self.config = config
        self.stopping = threading.Event()
        self.stopped_at: float | None = None  # when the first stop came (the workers' ends are bounded from then)
        self.interrupted: dict | None = None
        self.closers: list = []
        gpus = plan.resolve(config.gpus, config, "--gpus")
        models = plan.models_of(gpus)
        self.alike = len(set(models.values())) <= 1  # else added streams are placed by each GPU's model rate
        if not self.alike:
            log.warning("the GPUs differ (%s): streams are placed at start-up as if they were alike, those added "
                        "later by the rate each GPU's worker measured its model at; a TensorRT engine "
                        "runs only on the GPU model it was built for (each worker checks it): convert on each model, "
                        "or serve the ONNX model", ", ".join(f"{g}: {name}" for g, name in models.items()))
        rates = [plan.offered_rate(s) for s in config.sources]
        self.placed = plan.Placed(gpus, plan.place(rates, gpus, [s.gpu for s in config.sources]), rates)
        self.uris = [s.uri for s in config.sources]
        record_sinks = [u for u in config.sinks if scheme_of(u) not in FRAME_SCHEMES]
        self.sinks = SinkFanout(open_sinks(record_sinks, len(config.sources), 1))
        self.closers.append(self.sinks.close)
        self.workers: list[WorkerProcess] = []  # each GPU's worker now
        self.ended: list[WorkerProcess] = []    # workers that died and were replaced
        self.server = None
        try:
            self._start(gpus)
        except BaseException:
            self.close()
            raise

    def _start(self, gpus: list[int]) -> None:
        for gpu in gpus:
            ids = [i for i, g in self.placed.gpu_of.items() if g == gpu]
            if not ids and not self.config.control.enabled:
                log.warning("GPU %d has no stream to serve: no worker there", gpu)
                continue
            log.info("GPU %d serves stream(s) %s", gpu, ", ".join(map(str, ids)))
            self.workers.append(self._worker(gpu, ids, 0))
        for worker in self.workers:  # they build at once: an engine per GPU
            worker.wait_ready()
        if self.config.metrics_listen:
            control = self.config.control
            routes = FaceRoutes(self, control.token) if control.enabled else None
            pages = FacePages(self)
            self.server = MetricsServer(self.config.metrics_listen, pages.render_metrics, pages.health, pages.pages,
                                        routes, hosts=tuple(self.config.metrics_hosts))
            self.closers.append(self.server.close)
            log.info("metrics of %d GPU(s) on http://%s/metrics, streams on http://%s/streams", len(self.workers),
                     self.server.address, self.server.address)

    def _worker(self, gpu: int, ids: list[int], restart: int, resume=None) -> WorkerProcess:
        """resume: where a dead worker's records ended (streams.Resume): the new one goes on from there."""
        part, drawn = worker_config(self.config, [self.config.sources[i] for i in ids],
                                    bool(self.config.metrics_listen), restart)
        job = channel.Job(gpu, part, ids, len(self.uris), -1, records=bool(self.sinks.sinks),
                          first_added=self.placed.next_added(gpu), stride=self.placed.stride, resume=resume)
        worker = WorkerProcess(job, self.sinks.put, restart=restart, drawn=drawn)
        self.closers.append(worker.close)
        return worker

    def serving(self) -> list[WorkerProcess]:
        """The workers serving now (started, not dead)."""
        return [w for w in self.workers if w.hello is not None and w.alive()]

    def _replace(self, dead: WorkerProcess) -> None:
        """A worker that died: said; started again on its GPU where it has restarts left (its streams resume)."""
        log.error("GPU %d's worker %s: stream(s) %s are not served until it is started again; the other GPUs go on",
                  dead.gpu, dead.ended(), ", ".join(map(str, dead.ids)))
        if dead.restart >= MAX_RESTARTS:
            log.error("GPU %d's worker died %d times: not started again", dead.gpu, dead.restart + 1)
            dead.given_up = True
            return
        lost = sorted(i for i in self.placed.live if self.placed.gpu_of[i] == dead.gpu and i not in dead.ids)
        if lost:  # added through the control API: the new worker serves the configured streams
            log.error("stream(s) %s added through the control API on GPU %d are not restored: add them again",
                      ", ".join(map(str, lost)), dead.gpu)
            for stream in lost:
                self.placed.removed(stream)
        # its streams' frame numbers, track IDs and the rules' counts go on where its records ended
        worker = self._worker(dead.gpu, dead.ids, dead.restart + 1, dead.reached)
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
        log.info("GPU %d's worker started again (restart %d of %d): stream(s) %s resume", dead.gpu, worker.restart,
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
        while (any(w.alive() for w in self.workers) or any(self._dead())) and not self._overdue():
            if self.config.duration and time.monotonic() - started >= self.config.duration:
                self.stop()  # the workers keep their own duration: this bounds their ends from now
            for worker in self._dead():
                if self.stopping.is_set():
                    worker.given_up = True  # a stop asked meanwhile: not started again
                else:
                    self._replace(worker)
            time.sleep(0.1)
        for worker in self.workers:  # one still running past its bound is killed (said, and the run's failure)
            worker.join(0.0 if self._overdue() else None)
        seconds = time.monotonic() - started
        self.sinks.finish()
        writer.join()
        self.sinks.close()
        return self.summary(seconds, time.process_time() - cpu_started)

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
