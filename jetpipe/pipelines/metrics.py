"""Counters, latency percentiles and histograms, and a /metrics (prometheus-client's exposition) +
/healthz endpoint."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from jetpipe.errors import JetpipeError
from jetpipe.pipelines import http_guard
from jetpipe.pipelines.quantiles import RunHistogram
from jetpipe.uri import is_loopback

log = logging.getLogger(__name__)

STAGES = ("queue", "gpu", "post", "total")
COUNTERS = ("captured", "processed", "failed", "reconnects", "stalls")  # per stream
QUANTILES = (0.5, 0.9, 0.99)
LATENCY_BUCKETS_S = (0.005, 0.01, 0.02, 0.033, 0.05, 0.067, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class Metrics:
    def __init__(self, streams: int, window: int = 2048):
        self.lock = threading.Lock()
        zeros = lambda: [0] * streams  # noqa: E731
        self.captured, self.processed, self.failed, self.reconnects = zeros(), zeros(), zeros(), zeros()
        self.stalls = zeros()  # live streams that went silent for their stall timeout
        self.latency = {stage: deque(maxlen=window) for stage in STAGES}  # the last results: live views
        self.run_latency = {stage: RunHistogram() for stage in STAGES}  # every result: the run's summary
        self.recent = [deque(maxlen=window) for _ in range(streams)]  # result times, for fps
        self.stream_total = [deque(maxlen=window // 8) for _ in range(streams)]  # each stream's total latency
        self.first_result: list[float | None] = [None] * streams
        self.labels: list[str | None] = [str(i) for i in range(streams)]  # each slot's stream ID; None: vacant
        self.batches = 0
        self.heartbeat = time.monotonic()
        self.gauges: dict[str, callable] = {}
        # the exposition: this object's values (collect()), latency histograms and process metrics
        self._exposed = ([0] * streams, [0] * streams, None)
        self.registry = CollectorRegistry()
        self.registry.register(self)
        ProcessCollector(registry=self.registry)
        self.latency_seconds = Histogram("jetpipe_latency_seconds", "Per-stage latency (capture to result).",
                                         ["stage"], buckets=LATENCY_BUCKETS_S, registry=self.registry)
        # each stage's child looked up once: labels() per result and stage was a third of record_result's time
        self._stage_seconds = {stage: self.latency_seconds.labels(stage) for stage in STAGES}

    def count(self, name: str, stream: int, n: int = 1) -> None:
        with self.lock:
            getattr(self, name)[stream] += n

    def record_result(self, stream: int, latencies: dict[str, float]) -> None:
        now = time.monotonic()
        with self.lock:
            self.processed[stream] += 1
            self.recent[stream].append(now)
            if self.first_result[stream] is None:
                self.first_result[stream] = now
            for stage, value in latencies.items():
                self.latency[stage].append(value)
                self.run_latency[stage].add(value)
            if "total" in latencies:
                self.stream_total[stream].append(latencies["total"])
        for stage, value in latencies.items():
            child = self._stage_seconds.get(stage) or self.latency_seconds.labels(stage)
            child.observe(value / 1000.0)

    def assign(self, slot: int, label: str) -> None:
        """A new stream in `slot` (added while serving): its counters start from zero under its own label."""
        with self.lock:
            for name in COUNTERS:
                getattr(self, name)[slot] = 0
            self.recent[slot].clear()
            self.stream_total[slot].clear()
            self.first_result[slot] = None
            self.labels[slot] = label

    def vacate(self, slot: int) -> None:
        """The stream in `slot` is gone: the slot is no longer exposed (assign() zeroes it for the next)."""
        with self.lock:
            self.labels[slot] = None

    def beat(self) -> None:
        self.heartbeat = time.monotonic()

    def fps(self, stream: int, window_s: float = 5.0) -> float:
        """Results per second over the last window_s (or since the stream's first result, at least 1 s):
        a batch delivers a stream's frames at one instant, so frame spacing says nothing of the rate."""
        now = time.monotonic()
        with self.lock:
            times = self.recent[stream]
            count = sum(1 for t in times if now - t <= window_s)
            first = self.first_result[stream]
        if first is None:
            return 0.0
        return count / min(window_s, max(now - first, 1.0))

    def percentiles(self, stage: str) -> dict[float, float]:
        """Latency percentiles of a stage over all streams and the whole run (within 1 %), and its maximum
        under the key "max"."""
        with self.lock:
            histogram = self.run_latency[stage]
            if not histogram.count:
                return {}
            return {**{q: histogram.quantile(q) for q in QUANTILES}, "max": histogram.max}

    def recent_percentiles(self, stage: str) -> dict[float, float]:
        """Latency percentiles of a stage over all streams' last results (the live status line, /metrics)."""
        return self._quantiles(self.latency[stage])

    def stream_percentiles(self, stream: int) -> dict[float, float]:
        """Total latency percentiles of one stream."""
        return self._quantiles(self.stream_total[stream])

    def _quantiles(self, recent: deque) -> dict[float, float]:
        with self.lock:
            values = np.array(recent) if recent else None
        if values is None:
            return {}
        return {q: float(np.quantile(values, q)) for q in QUANTILES}

    def prometheus(self, dropped: list[int], depths: list[int], decode_errors: list[int] | None = None) -> str:
        """The Prometheus text exposition, written by prometheus-client: these counters and gauges, the
        latency histograms, and the process collector (CPU seconds, resident memory, open files)."""
        self._exposed = (dropped, depths, decode_errors)
        return generate_latest(self.registry).decode()

    def collect(self):
        """prometheus-client's collector protocol: the current per-stream values as metric families."""
        dropped, depths, decode_errors = self._exposed
        with self.lock:
            counts = {name: list(getattr(self, name)) for name in COUNTERS}
            batches, labels = self.batches, list(self.labels)
        streams = len(labels)
        per_stream = [
            (CounterMetricFamily, "jetpipe_frames_captured", "Frames produced by the source.", counts["captured"]),
            (CounterMetricFamily, "jetpipe_frames_processed", "Frames with results.", counts["processed"]),
            (CounterMetricFamily, "jetpipe_frames_dropped", "Frames dropped when processing fell behind.", dropped),
            (CounterMetricFamily, "jetpipe_frames_failed", "Frames lost to read or processing errors.",
             counts["failed"]),
            (CounterMetricFamily, "jetpipe_source_reconnects", "Source reconnect attempts.", counts["reconnects"]),
            (CounterMetricFamily, "jetpipe_source_stalls", "Live streams connected but silent for their stall "
             "timeout (then reconnected).", counts["stalls"]),
            (CounterMetricFamily, "jetpipe_decode_errors", "Decoder errors (corrupt data, truncated frames).",
             decode_errors or [0] * streams),
            (GaugeMetricFamily, "jetpipe_stream_fps", "Results per second over the last 5 s.",
             [round(self.fps(i), 3) for i in range(streams)]),
            (GaugeMetricFamily, "jetpipe_queue_depth", "Frames waiting to be batched.", depths),
        ]
        for kind, name, text, values in per_stream:
            family = kind(name, text, labels=["stream"])
            for label, value in zip(labels, values):
                if label is not None:  # a vacant slot (the control API's spare capacity) is no stream
                    family.add_metric([label], value)
            yield family
        quantiles = GaugeMetricFamily("jetpipe_latency_ms", "Per-stage latency percentiles over the last "
                                      "results, milliseconds.", labels=["stage", "quantile"])
        for stage in STAGES:
            for q, v in self.recent_percentiles(stage).items():
                quantiles.add_metric([stage, str(q)], round(v, 3))
        yield quantiles
        yield CounterMetricFamily("jetpipe_batches", "Batches run.", value=batches)
        for name, read in self.gauges.items():
            value = read()
            if value is not None:
                yield GaugeMetricFamily(name, name.replace("_", " "), value=value)


class MetricsServer:
    """/metrics and /healthz on host:port (127.0.0.1 unless configured otherwise); `pages(path)` may answer
    other paths with (status, body bytes, content type), or None (404); `control` (control.Control) answers
    /streams and /streams/ID. Every request passes http_guard's checks first: a Host this server is meant to
    be reached by (`hosts`: names beyond the defaults; "*" any), and for a mutating call a JSON body and no
    other site's Origin."""

    def __init__(self, listen: str, render, healthy, pages=None, control=None, hosts: tuple[str, ...] = ()):
        host, _, port = listen.rpartition(":")
        names = (*http_guard.default_host_names(listen), *(h.lower() for h in hosts))
        handler = _handler(render, healthy, pages or (lambda path: None), control,
                           _HostCheck(names, is_loopback(listen)))
        try:
            self.server = _Server((host or "127.0.0.1", int(port)), handler)
        except OSError as exc:  # in use (a second daemon on the default port), a host this machine is not
            raise JetpipeError(f"metrics listen = {listen!r}: cannot listen there ({exc.strerror or exc}): choose "
                               "another HOST:PORT (--metrics), or '' to turn the metrics server off") from None
        self.server.daemon_threads = True  # a DELETE waiting for its stream's frames never holds up the exit
        self.address = f"{self.server.server_address[0]}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="metrics", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


MAX_BODY = 64 * 1024  # bytes of a control request's body (a source spec)
REQUEST_TIMEOUT_S = 10.0  # a request's headers and body arrive within this, or the connection is closed


class _HostCheck:
    def __init__(self, names: tuple[str, ...], loopback_only: bool):
        self.names, self.loopback_only = names, loopback_only

    def allows(self, host_header: str | None) -> bool:
        return host_header is not None and http_guard.allowed_host(host_header, self.names, self.loopback_only)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """A client that went away or was too slow is no error of ours: one debug line, no traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            log.debug("metrics server: client %s: %s", client_address[0], error)
        else:
            log.exception("metrics server: a request from %s failed", client_address[0])


def _handler(render, healthy, pages, control, hosts: _HostCheck):
    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S  # the socket's: a silent client does not hold a thread for ever

        def do_GET(self):  # noqa: N802 (http.server's name)
            if not self._guarded("GET"):
                return
            path = self.path.split("?", 1)[0]
            if self.path == "/metrics":
                self._reply(200, render(), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                ok, why = healthy()
                self._reply(200 if ok else 503, why + "\n", "text/plain")
            elif control is not None and control.handles(path):
                self._control("GET", path, b"")
            elif (answer := pages(path)) is not None:
                self._reply(*answer)
            else:
                self._reply(404, "try /, /metrics or /healthz\n", "text/plain")

        def do_POST(self):  # noqa: N802
            self._write_method("POST")

        def do_DELETE(self):  # noqa: N802
            self._write_method("DELETE")

        def _guarded(self, method: str) -> bool:
            """The checks before any answer (http_guard): False when a refusal was sent."""
            host = self.headers.get("Host")
            if not hosts.allows(host):
                self.close_connection = True
                self._reply(421, f"Host {str(host)[:80]!r} is not a name this server answers to: use its IP address "
                                 "or add the name with --metrics-host NAME ([metrics] hosts)\n", "text/plain")
                return False
            why = http_guard.cross_site(method, self.headers.get("Origin"), self.headers.get("Sec-Fetch-Site"), host)
            if why:
                self.close_connection = True
                self._reply(403, f"refused: a request from another site ({why})\n", "text/plain")
                return False
            return True

        def _write_method(self, method: str) -> None:
            if not self._guarded(method):
                return
            path = self.path.split("?", 1)[0]
            if control is None or not control.handles(path):
                self._reply(404 if control is None else 405,
                            "no control API here (serve --control turns it on)\n" if control is None
                            else f"{method} is for /streams\n", "text/plain")
                return
            length = self.headers.get("Content-Length", "0")
            if not length.isdigit() or int(length) > MAX_BODY:  # refused unread: nothing of it is kept
                self.close_connection = True
                self._reply(413, f"a body of at most {MAX_BODY} bytes with its Content-Length\n", "text/plain")
                return
            if int(length) and not http_guard.is_json(self.headers.get("Content-Type")):
                self.close_connection = True  # unread: a browser sends text/plain cross-site without asking
                self._reply(415, "send the body as JSON with Content-Type: application/json\n", "text/plain")
                return
            body = self._read_body(int(length))
            if body is not None:
                self._control(method, path, body)

        def _read_body(self, length: int) -> bytes | None:
            """The body, read within REQUEST_TIMEOUT_S in all (a client trickling it byte by byte is cut off);
            None when it did not come (answered 408, or the client went away)."""
            deadline = time.monotonic() + REQUEST_TIMEOUT_S
            chunks, left = [], length
            try:
                while left:
                    self.connection.settimeout(max(0.001, deadline - time.monotonic()))
                    chunk = self.rfile.read1(left)
                    if not chunk:
                        raise ConnectionResetError("the client closed the connection mid-body")
                    chunks.append(chunk)
                    left -= len(chunk)
            except TimeoutError:
                self.close_connection = True
                self._reply(408, f"the body did not arrive within {REQUEST_TIMEOUT_S:g} s\n", "text/plain")
                return None
            except ConnectionError:
                self.close_connection = True
                return None
            return b"".join(chunks)

        def _control(self, method: str, path: str, body: bytes) -> None:
            status, text, ctype = control.handle(method, path, self.headers.get("Authorization", ""), body)
            extra = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
            self._reply(status, text, ctype, extra)

        def _reply(self, code, body, ctype, headers=None):
            data = body if isinstance(body, bytes) else body.encode()
            try:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("X-Content-Type-Options", "nosniff")
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)
            except (ConnectionError, TimeoutError):  # the client left before the answer: nothing to tell it
                self.close_connection = True

        def log_message(self, *args):
            pass

    return Handler
