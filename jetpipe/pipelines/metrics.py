"""Counters, latency percentiles and a Prometheus /metrics + /healthz endpoint (stdlib only)."""

from __future__ import annotations

import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

STAGES = ("queue", "gpu", "post", "total")
QUANTILES = (0.5, 0.9, 0.99)


class Metrics:
    def __init__(self, streams: int, window: int = 2048):
        self.lock = threading.Lock()
        zeros = lambda: [0] * streams  # noqa: E731
        self.captured, self.processed, self.failed, self.reconnects = zeros(), zeros(), zeros(), zeros()
        self.latency = {stage: deque(maxlen=window) for stage in STAGES}
        self.recent = [deque(maxlen=window) for _ in range(streams)]  # result times, for fps
        self.first_result: list[float | None] = [None] * streams
        self.batches = 0
        self.heartbeat = time.monotonic()
        self.gauges: dict[str, callable] = {}

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
        with self.lock:
            values = np.array(self.latency[stage]) if self.latency[stage] else None
        if values is None:
            return {}
        return {q: float(np.quantile(values, q)) for q in QUANTILES}

    def prometheus(self, dropped: list[int], depths: list[int], decode_errors: list[int] | None = None) -> str:
        lines = []

        def family(name, kind, help_text, samples):
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{labels} {value}" for labels, value in samples)

        per_stream = lambda values: [(f'{{stream="{i}"}}', v) for i, v in enumerate(values)]  # noqa: E731
        with self.lock:
            captured, processed = list(self.captured), list(self.processed)
            failed, reconnects = list(self.failed), list(self.reconnects)
        family("jetpipe_frames_captured_total", "counter", "Frames produced by the source.",
               per_stream(captured))
        family("jetpipe_frames_processed_total", "counter", "Frames with results.", per_stream(processed))
        family("jetpipe_frames_dropped_total", "counter", "Frames dropped when processing fell behind.",
               per_stream(dropped))
        family("jetpipe_frames_failed_total", "counter", "Frames lost to read or processing errors.",
               per_stream(failed))
        family("jetpipe_source_reconnects_total", "counter", "Source reconnect attempts.",
               per_stream(reconnects))
        family("jetpipe_decode_errors_total", "counter", "Decoder errors (corrupt data, truncated frames).",
               per_stream(decode_errors or [0] * len(captured)))
        family("jetpipe_stream_fps", "gauge", "Results per second over the last 5 s.",
               [(f'{{stream="{i}"}}', round(self.fps(i), 3)) for i in range(len(captured))])
        family("jetpipe_queue_depth", "gauge", "Frames waiting to be batched.", per_stream(depths))
        samples = []
        for stage in STAGES:
            for q, v in self.percentiles(stage).items():
                samples.append((f'{{stage="{stage}",quantile="{q}"}}', round(v, 3)))
        family("jetpipe_latency_ms", "summary", "Per-stage latency in milliseconds.", samples)
        family("jetpipe_batches_total", "counter", "Batches run.", [("", self.batches)])
        for name, read in self.gauges.items():
            value = read()
            if value is not None:
                family(name, "gauge", name.replace("_", " "), [("", value)])
        return "\n".join(lines) + "\n"


class MetricsServer:
    """/metrics and /healthz on host:port (127.0.0.1 unless configured otherwise)."""

    def __init__(self, listen: str, render, healthy):
        host, _, port = listen.rpartition(":")
        handler = _handler(render, healthy)
        self.server = ThreadingHTTPServer((host or "127.0.0.1", int(port)), handler)
        self.address = f"{self.server.server_address[0]}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="metrics", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(render, healthy):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path == "/metrics":
                self._reply(200, render(), "text/plain; version=0.0.4")
            elif self.path == "/healthz":
                ok, why = healthy()
                self._reply(200 if ok else 503, why + "\n", "text/plain")
            else:
                self._reply(404, "try /metrics or /healthz\n", "text/plain")

        def _reply(self, code, body, ctype):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    return Handler
