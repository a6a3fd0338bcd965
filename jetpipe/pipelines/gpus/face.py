"""The face of a daemon on several GPUs: it places the streams, starts a worker per GPU, hands the workers'
records to the sinks that take records, answers /metrics, /healthz and /streams for all of them, and merges
the summary. It runs no model and touches no GPU (the placement asks the driver how many there are).

A worker that dies is said (which GPU, which streams, its exit code) and counted in the summary; the other
GPUs keep serving, and the run's exit status says it failed.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import jetpipe
from jetpipe.errors import JetpipeError
from jetpipe.pipelines.gpus import channel, plan, scrape, totals
from jetpipe.pipelines.http.server import MetricsServer
from jetpipe.pipelines.quantiles import RunHistogram
from jetpipe.pipelines.sinks import FRAME_SCHEMES, SinkFanout, open_sinks, scheme_of

log = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # a worker builds its pipeline (an engine may be built) within this
LEFT_BEHIND_S = 30.0  # after every worker was told to stop: one still running then is killed


class WorkerProcess:
    """One GPU's worker as the face sees it: its process, its lines read in a thread of their own."""

    def __init__(self, gpu: int, config, ids: list[int], total: int, on_record, records: bool):
        self.gpu, self.ids, self.on_record = gpu, ids, on_record
        self.hello: dict | None = None
        self.error: str | None = None
        self.summary: dict | None = None
        self.ready = threading.Event()
        self.latency = RunHistogram()  # this GPU's records' total latency (the summary's quantiles)
        read, write = os.pipe()
        root = str(Path(jetpipe.__file__).resolve().parents[1])
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu),
               "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        try:  # its own session: a terminal's Ctrl-C reaches the face, which tells the workers
            self.process = subprocess.Popen([sys.executable, "-m", "jetpipe.pipelines.gpus.worker"],
                                            stdin=subprocess.PIPE, pass_fds=(write,), env=env, start_new_session=True)
        finally:
            os.close(write)
        self.lines = os.fdopen(read, "rb")
        self.reader = threading.Thread(target=self._read, name=f"gpu-{gpu}", daemon=True)
        self.reader.start()
        channel.send_job(self.process.stdin, channel.Job(gpu, config, ids, total, write, records))

    def _read(self) -> None:
        try:
            for line in self.lines:
                kind, what = channel.parse(line)
                if kind == "R":
                    record, latency = what
                    if latency is not None:
                        self.latency.add(latency)
                    if record is not None:
                        self.on_record(record)
                elif kind == "H":
                    self.hello = what
                    self.ready.set()
                elif kind == "E":
                    self.error = what["error"]
                elif kind == "S":
                    self.summary = what
        finally:
            self.ready.set()  # an end before its hello: wait_ready says why

    def wait_ready(self) -> None:
        """Back once it serves; JetpipeError with its own line where it could not start."""
        self.ready.wait(START_TIMEOUT_S)
        if self.hello is None:
            why = self.error or f"its worker ended (exit code {self.process.poll()}) before serving: see above"
            raise JetpipeError(f"GPU {self.gpu}: {why}")

    def tell(self, line: str) -> None:
        try:
            self.process.stdin.write(line.encode() + b"\n")
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):  # it ended already
            pass

    def alive(self) -> bool:
        return self.process.poll() is None

    def ended(self) -> str:
        code = self.process.poll()
        return "ran to the end" if self.summary is not None else (
            f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}")

    def join(self, timeout: float | None = None) -> None:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.error("GPU %d's worker did not stop: killed", self.gpu)
            self.process.kill()
            self.process.wait()
        self.reader.join()

    def close(self) -> None:
        if self.alive():
            self.process.kill()
        self.join()
        for stream in (self.process.stdin, self.lines):
            try:
                stream.close()
            except OSError:
                pass


def worker_config(config, sources: list, listen: bool):
    """A worker's configuration: its sources, the sinks that draw frames, its metrics on loopback (a free port)
    where the face serves them."""
    part = copy.deepcopy(config)
    part.sources = [dataclasses.replace(s, gpu=None) for s in sources]
    part.sinks = [u for u in config.sinks if scheme_of(u) in FRAME_SCHEMES]
    part.metrics_listen, part.metrics_hosts, part.gpus = ("127.0.0.1:0" if listen else ""), [], None
    return part


class Face:
    def __init__(self, config):
        self.config = config
        self.stopping = threading.Event()
        self.interrupted: dict | None = None
        self.closers: list = []
        gpus = plan.resolve(config.gpus, config, "--gpus")
        rates = [plan.offered_rate(s) for s in config.sources]
        self.placement = plan.place(rates, gpus, [s.gpu for s in config.sources])
        self.uris = [s.uri for s in config.sources]
        record_sinks = [u for u in config.sinks if scheme_of(u) not in FRAME_SCHEMES]
        self.sinks = SinkFanout(open_sinks(record_sinks, len(config.sources), 1))
        self.closers.append(self.sinks.close)
        self.workers: list[WorkerProcess] = []
        self.server = None
        try:
            self._start(gpus)
        except BaseException:
            self.close()
            raise

    def _start(self, gpus: list[int]) -> None:
        for gpu in gpus:
            ids = [i for i, g in enumerate(self.placement) if g == gpu]
            if not ids:
                log.warning("GPU %d has no stream to serve: no worker there", gpu)
                continue
            log.info("GPU %d serves stream(s) %s", gpu, ", ".join(map(str, ids)))
            part = worker_config(self.config, [self.config.sources[i] for i in ids], bool(self.config.metrics_listen))
            self.workers.append(WorkerProcess(gpu, part, ids, len(self.uris), self.sinks.put,
                                              records=bool(self.sinks.sinks)))
            self.closers.append(self.workers[-1].close)
        for worker in self.workers:  # they build at once: an engine per GPU
            worker.wait_ready()
        if self.config.metrics_listen:
            self.server = MetricsServer(self.config.metrics_listen, self.render_metrics, self.health, self.pages,
                                        hosts=tuple(self.config.metrics_hosts))
            self.closers.append(self.server.close)
            log.info("metrics of %d GPU(s) on http://%s/metrics, streams on http://%s/streams", len(self.workers),
                     self.server.address, self.server.address)

    # --- http ---------------------------------------------------------------------------------------
    def render_metrics(self) -> str:
        texts = {}
        for worker in self.workers:
            status, text = scrape.fetch(worker.hello["address"], "/metrics") if worker.alive() else (0, "")
            if status == 200:
                texts[worker.gpu] = text
        return scrape.merge(texts)

    def health(self) -> tuple[bool, str]:
        if self.stopping.is_set():
            return False, "stopping"
        for worker in self.workers:
            if not worker.alive():
                return False, f"GPU {worker.gpu}'s worker {worker.ended()}"
            status, why = scrape.fetch(worker.hello["address"], "/healthz")
            if status != 200:
                return False, f"GPU {worker.gpu}: {why.strip()}"
        return True, "ok"

    def pages(self, path: str):
        if path != "/streams":
            return None
        gpu_of = {i: w for w in self.workers for i in w.ids}
        streams = [{"id": i, "uri": uri, "gpu": gpu_of[i].gpu, "worker": "serving" if gpu_of[i].alive()
                    else gpu_of[i].ended()} for i, uri in enumerate(self.uris) if i in gpu_of]
        return 200, json.dumps({"gpus": [w.gpu for w in self.workers], "streams": streams}), "application/json"

    # --- the run ------------------------------------------------------------------------------------
    def stop(self) -> None:
        self.stopping.set()
        for worker in self.workers:
            worker.tell("stop")

    def abort(self, signal_name: str) -> None:
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
        said: set[int] = set()
        while any(w.alive() for w in self.workers):
            for worker in self.workers:
                if not worker.alive() and worker.summary is None and worker.gpu not in said:
                    said.add(worker.gpu)
                    log.error("GPU %d's worker %s: stream(s) %s are no longer served; the other GPUs go on",
                              worker.gpu, worker.ended(), ", ".join(map(str, worker.ids)))
            time.sleep(0.1)
        for worker in self.workers:
            worker.join(LEFT_BEHIND_S)
        seconds = time.monotonic() - started
        self.sinks.finish()
        writer.join()
        self.sinks.close()
        return self.summary(seconds, time.process_time() - cpu_started)

    def summary(self, seconds: float, cpu_s: float) -> dict:
        latency = RunHistogram()
        for worker in self.workers:
            latency.merge(worker.latency)
        summary = totals.merge([(w.gpu, w.summary, w.ids, w.ended()) for w in self.workers], seconds, latency,
                               self.config.sinks, self.sinks, FRAME_SCHEMES, cpu_s)
        if self.interrupted is not None:
            dropped = sum(w.summary.get("interrupted", {}).get("queued_frames_dropped", 0)
                          for w in self.workers if w.summary is not None)
            summary["interrupted"] = {**self.interrupted, "queued_frames_dropped": dropped}
        return summary

    def close(self) -> None:
        for close in reversed(self.closers):
            try:
                close()
            except Exception as exc:
                log.warning("while closing: %s", exc)
        self.closers = []
