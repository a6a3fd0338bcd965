"""Per-stream counters, latency percentiles and histograms, and their Prometheus exposition (served by
http.server on /metrics)."""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np
from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from jetpipe.pipelines.quantiles import RunHistogram

STAGES = ("queue", "gpu", "post", "total")
COUNTERS = ("captured", "processed", "failed", "reconnects", "stalls")  # per stream
QUANTILES = (0.5, 0.9, 0.99)
RECENT_LATENCY = "jetpipe_recent_latency_seconds"
LATENCY_BUCKETS_S = (0.005, 0.01, 0.02, 0.033, 0.05, 0.067, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class StreamCounters:
    def __init__(self, streams: int, window: int = 2048, ids: list[int] | None = None):
        """ids: the configured streams' IDs where they are not 0, 1, ... (a GPU's worker: streams.Share)."""
        self.lock = threading.Lock()
        zeros = lambda: [0] * streams  # noqa: E731
        self.captured, self.processed, self.failed, self.reconnects = zeros(), zeros(), zeros(), zeros()
        self.stalls = zeros()  # live streams that went silent for their stall timeout
        self.latency = {stage: deque(maxlen=window) for stage in STAGES}  # the last results: live views
        self.run_latency = {stage: RunHistogram() for stage in STAGES}  # every result: the run's summary
        # results after the stop (a signal, --duration): the queued frames finished, apart from the run's, whose
        # quantiles they took over (an overloaded run's p99 of 2.8 s read 9-14 s)
        self.drain_latency = {stage: RunHistogram() for stage in STAGES}
        self.drain_started: float | None = None
        self.result_sum_ms = dict.fromkeys(STAGES, 0.0)  # every result's latency summed (the summary's _sum)
        self.recent = [deque(maxlen=window) for _ in range(streams)]  # result times, for fps
        self.stream_total = [deque(maxlen=window // 8) for _ in range(streams)]  # each stream's total latency
        self.first_result: list[float | None] = [None] * streams
        ids = list(ids or ()) + list(range(len(ids or ()), streams))
        self.labels: list[str | None] = [str(i) for i in ids[:streams]]  # each slot's stream ID; None: vacant
        self.batches = 0
        self.heartbeat = time.monotonic()
        self._gauges: dict[str, callable] = {}
        self._families: list = []  # callables yielding more metric families (the events' counters)
        # the exposition: this object's values (collect()), latency histograms and process metrics
        self._exposed = ([0] * streams, [0] * streams, [0] * streams, None)
        self.registry = CollectorRegistry()
        self.registry.register(self)
        ProcessCollector(registry=self.registry)
        self.latency_seconds = Histogram("jetpipe_latency_seconds", "Per-stage latency (capture to result).",
                                         ["stage"], buckets=LATENCY_BUCKETS_S, registry=self.registry)
        # each stage's child looked up once: labels() per result and stage was a third of record_result's time
        self._stage_seconds = {stage: self.latency_seconds.labels(stage) for stage in STAGES}


    def add_gauge(self, name: str, read) -> None:
        """A gauge /metrics reads from read() as it is scraped (None: left out that time)."""
        self._gauges[name] = read

    def add_families(self, families) -> None:
        """More metric families for /metrics: families() yields them as it is scraped (the sinks', the rules')."""
        self._families.append(families)
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
            histograms = self.run_latency if self.drain_started is None else self.drain_latency
            for stage, value in latencies.items():
                self.latency[stage].append(value)
                histograms[stage].add(value)
                self.result_sum_ms[stage] += value
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

    def start_drain(self) -> None:
        with self.lock:
            if self.drain_started is None:
                self.drain_started = time.monotonic()

    def drain(self) -> dict | None:
        """The frames finished after the stop: how many, over how long, their latency (None: none were)."""
        with self.lock:
            frames = self.drain_latency["total"].count
        if not frames:
            return None
        return {"frames": frames, "seconds": round(time.monotonic() - self.drain_started, 2),
                "latency_ms": {s: {str(q): round(v, 2) for q, v in self.percentiles(s, drain=True).items()}
                               for s in STAGES}}

    def percentiles(self, stage: str, drain: bool = False) -> dict[float, float]:
        """Latency percentiles of a stage over all streams and the whole run (within 1 %), and its maximum
        under the key "max"; drain: of the frames finished after the stop."""
        with self.lock:
            histogram = (self.drain_latency if drain else self.run_latency)[stage]
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

    def _recent_latency(self) -> Metric:
        """jetpipe_recent_latency_seconds: a summary per stage, its quantiles over the last results (what the status
        line shows), its _count and _sum over the run (a summary's quantile label on a gauge, and `_ms` in the name,
        failed `promtool check metrics`: it was jetpipe_latency_ms)."""
        family = Metric(RECENT_LATENCY, "Per-stage latency (capture to result): quantiles over the last results.",
                        "summary")
        with self.lock:
            totals = {s: (self.run_latency[s].count + self.drain_latency[s].count, self.result_sum_ms[s])
                      for s in STAGES}
        for stage in STAGES:
            for q, v in self.recent_percentiles(stage).items():
                family.add_sample(RECENT_LATENCY, {"stage": stage, "quantile": str(q)}, round(v / 1000.0, 6))
            count, total_ms = totals[stage]
            family.add_sample(f"{RECENT_LATENCY}_count", {"stage": stage}, count)
            family.add_sample(f"{RECENT_LATENCY}_sum", {"stage": stage}, round(total_ms / 1000.0, 6))
        return family

    def prometheus(self, drops: tuple[list[int], list[int]], depths: list[int],
                   decode_errors: list[int] | None = None) -> str:
        """The Prometheus text exposition, written by prometheus-client: these counters and gauges, the
        latency histograms, and the process collector (CPU seconds, resident memory, open files). drops: each
        stream's dropped frames, and of those the ones dropped catching up (Batcher.drop_counts)."""
        self._exposed = (*drops, depths, decode_errors)
        return generate_latest(self.registry).decode()

    def collect(self):
        """prometheus-client's collector protocol: the current per-stream values as metric families."""
        dropped, dropped_catching_up, depths, decode_errors = self._exposed
        with self.lock:
            counts = {name: list(getattr(self, name)) for name in COUNTERS}
            batches, labels = self.batches, list(self.labels)
        streams = len(labels)
        per_stream = [
            (CounterMetricFamily, "jetpipe_frames_captured", "Frames produced by the source.", counts["captured"]),
            (CounterMetricFamily, "jetpipe_frames_processed", "Frames with results.", counts["processed"]),
            (CounterMetricFamily, "jetpipe_frames_dropped", "Frames dropped when processing fell behind.", dropped),
            (CounterMetricFamily, "jetpipe_frames_dropped_catching_up", "Of those, the frames dropped while a live "
             "stream delivered faster than real time (a backlog at once: its connection's, a network stall's).",
             dropped_catching_up),
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
        yield self._recent_latency()
        yield CounterMetricFamily("jetpipe_batches", "Batches run.", value=batches)
        for name, read in self._gauges.items():
            value = read()
            if value is not None:
                yield GaugeMetricFamily(name, name.replace("_", " "), value=value)
        for families in self._families:
            yield from families()


def live_counts(stream, metrics, batcher) -> dict:
    """The counters of a stream in its slot now."""
    with metrics.lock:
        counts = {name: getattr(metrics, name)[stream.slot] for name in COUNTERS}
    return {**counts, "dropped": batcher.dropped[stream.slot],
            "dropped_catching_up": batcher.dropped_catching_up[stream.slot],
            "decode_errors": stream.source.decode_errors}
