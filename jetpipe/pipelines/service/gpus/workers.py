"""The face's side of each GPU's worker: its process, the lines it sends (read in a thread of their own), and
the configuration it is given (its share of the streams, the sinks that draw frames)."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import secrets
import subprocess
import sys
import threading
from pathlib import Path

import jetpipe
from jetpipe.errors import JetpipeError
from jetpipe.pipelines.config import EVENT_TYPES
from jetpipe.pipelines.ingest.streams import Resume
from jetpipe.pipelines.outputs.sinks import FRAME_SCHEMES, scheme_of
from jetpipe.pipelines.quantiles import RunHistogram
from jetpipe.pipelines.service.gpus import channel, totals

log = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # a worker builds its pipeline (an engine may be built) within this


class WorkerProcess:
    """One worker as the face sees it: its process, its lines read in a thread of their own. `gpu`: its GPU;
    `number`: its place among the face's workers (the placement's key); `k`: among its GPU's (channel.Job);
    `name` / `who`: how logs say it."""

    def __init__(self, job: channel.Job, on_record, restart: int = 0, drawn: list[int] = ()):
        """job: its part (its fd is filled in here); restart: how many workers of this GPU died before this one;
        drawn: where its frame sinks stand in the configuration's sinks (worker_config)."""
        gpu, ids = job.gpu, job.ids
        self.number, self.k = job.worker, job.k
        self.name, self.who = channel.worker_name(gpu, job.k), channel.worker_who(gpu, job.k)
        self.gpu, self.ids, self.on_record, self.restart, self.drawn = gpu, ids, on_record, restart, list(drawn)
        self.token = job.config.control.token  # its control API's (the face forwards the callers' requests)
        self.given_up = False  # it died and is not started again
        self.delivered = dict.fromkeys(ids, 0)  # frames' records received from it, per stream
        # where its records ended, for a worker started in its place (streams.Resume): begun where it began
        self.resumed_from = job.resume or Resume()
        self.reached = copy.deepcopy(self.resumed_from)
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
            self.process = subprocess.Popen([sys.executable, "-m", "jetpipe.pipelines.service.gpus.worker"],
                                            stdin=subprocess.PIPE, pass_fds=(write,), env=env, start_new_session=True)
        finally:
            os.close(write)
        self.lines = os.fdopen(read, "rb")
        self.reader = threading.Thread(target=self._read, name=f"worker-{self.number}", daemon=True)
        self.reader.start()
        channel.send_job(self.process.stdin, dataclasses.replace(job, fd=write))

    def _read(self) -> None:
        try:
            for line in self.lines:
                kind, what = channel.parse(line)
                if kind == "R":
                    if what.latency_ms is not None:  # a frame's
                        self.latency.add(what.latency_ms)
                        self.delivered[what.stream] = self.delivered.get(what.stream, 0) + 1
                    self._reach(what)
                    if what.record is not None:
                        self.on_record(what.record)
                elif kind == "H":
                    self.hello = what
                    self.ready.set()
                elif kind == "E":
                    self.error = what["error"]
                elif kind == "S":
                    self.summary = what
        finally:
            self.ready.set()  # an end before its hello: wait_ready says why

    def _reach(self, line: channel.Line) -> None:
        """What a record says of where the worker's streams are: their next frame number and track ID, and (an
        event's) its rule's counts so far."""
        reached, stream = self.reached, line.stream
        if line.frame is not None:
            reached.frames[stream] = max(reached.frames.get(stream, 0), line.frame + 1)
        if line.track is not None:
            reached.track_ids[stream] = max(reached.track_ids.get(stream, 1), line.track + 1)
        if line.record is not None and line.record.type in EVENT_TYPES:  # its counts: the rule's in this worker
            event = json.loads(line.record.text)
            reached.event_counts[event["rule"]] = event["counts"]

    def wait_ready(self) -> None:
        """Back once it serves; JetpipeError with its own line where it could not start."""
        self.ready.wait(START_TIMEOUT_S)
        if self.hello is None:
            why = self.error or f"its worker ended (exit code {self.process.poll()}) before serving: see above"
            raise JetpipeError(f"{self.name}: {why}")

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

    def outcome(self) -> totals.Outcome:
        """What the summary takes of it."""
        return totals.Outcome(self.gpu, self.summary, self.ids, self.ended(), self.delivered, self.restart,
                              self.drawn, self.resumed_from, self.reached, self.number, self.k)

    def join(self, timeout: float | None = None) -> None:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.error("%s did not stop: killed", self.who)
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


def worker_config(config, sources: list, listen: bool, restart: int = 0) -> tuple:
    """(a worker's configuration, where each of its frame sinks stands in config.sinks): its sources, the sinks
    that draw frames, its metrics on loopback (a free port) where the face serves them. A restarted worker
    (restart n > 0) draws into files of its own, `out-restartN.mp4` beside `out.mp4` (a sink never writes over
    the files of the worker before it); a `jpeg:` folder, which holds that worker's pictures under the same
    names, is left out and said."""
    part = copy.deepcopy(config)
    part.sources = [dataclasses.replace(s, gpu=None) for s in sources]
    frames = [i for i, u in enumerate(config.sinks) if scheme_of(u) in FRAME_SCHEMES]
    drawn = [i for i in frames if restarted(config.sinks[i], restart) is not None]
    if len(drawn) < len(frames):
        log.warning("the restarted worker draws no jpeg: pictures (its folder holds the earlier worker's under the "
                    "same names)")
    part.sinks = [restarted(config.sinks[i], restart) for i in drawn]
    part.metrics_listen, part.metrics_hosts, part.gpus = ("127.0.0.1:0" if listen else ""), [], None
    part.workers_per_gpu = 1
    part.control.token = secrets.token_hex(16)  # the face's alone: callers go through the face
    part.control.max_streams = config.control.max_streams or len(config.sources)  # each worker's slots
    return part, drawn


def restarted(uri: str, restart: int) -> str | None:
    """A frame sink's URI for the n-th restart of a worker: a video file of another name; None for a jpeg: sink."""
    if not restart:
        return uri
    if scheme_of(uri) != "video":
        return None
    head, sep, options = uri.partition("?")
    path = Path(head.split(":", 1)[1])
    return f"video:{path.with_name(f'{path.stem}-restart{restart}{path.suffix}')}{sep}{options}"
