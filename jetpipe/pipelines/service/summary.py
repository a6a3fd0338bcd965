"""What the daemon says of its run: each stream's counters, the live status line, the overload warning and
the summary printed at the end. It reads the other rooms' counters and changes nothing."""

from __future__ import annotations

import logging
import time

from jetpipe.pipelines.counters import COUNTERS, live_counts

log = logging.getLogger(__name__)

OVERLOAD_LOG_S = 60.0  # the overload warning, at most this often
BUSY = 0.8  # a share of the time this high: the GPU (its batches) or the post thread (its work) sets the rate
SHARE_WINDOW_S = 5.0  # the busy shares the warning says are those of the last window this long
# dropped_catching_up: of `dropped`, those of a backlog coming at once (batcher.catching_up)
PER_STREAM = ("captured", "processed", "dropped", "dropped_catching_up", "failed", "reconnects", "stalls",
              "decode_errors")


class RunSummary:
    def __init__(self, config, parts, stages, events=None, evidence=(None, None, None), drain_bound=None):
        """parts: core.stages.FrameParts; stages: its StageLoops; evidence: (clips, snapshots, recorder), each
        None where it is off."""
        self.config, self.streams, self.metrics, self.batcher = config, parts.streams, parts.metrics, parts.batcher
        self.runtime, self.sinks, self.stages, self.control = parts.runtime, parts.sinks, stages, config.control.enabled
        # events.EventStep, clips.writer.Clips, snapshots.Snapshots, recording.recorder.Recorder: where asked for
        self.events = events
        self.clips, self.snapshots, self.recorder = evidence
        self.drain_bound = drain_bound  # drain.DrainBound: where a stop's drain was cut short
        self._overload_said = (0, -OVERLOAD_LOG_S)  # drops counted when last said, and when
        self._backlog_said = (0, -OVERLOAD_LOG_S)  # the same of the drops of backlogs coming at once
        # the window's start: when, the GPU's busy seconds, the post thread's, the drops then; the last whole
        # window's busy shares (GPU: None where not measured)
        self._window = (time.monotonic(), 0.0, 0.0, 0)
        self._shares: tuple[float | None, float] = (None, 0.0)
        self._cpu_limit_said = False

    def live_counts(self, stream) -> dict:
        return live_counts(stream, self.metrics, self.batcher)

    def describe(self, stream) -> dict:
        """A stream as the control API shows it."""
        return {"id": stream.id, "uri": stream.spec.uri, "state": stream.state,
                "fps": round(self.metrics.fps(stream.slot), 2), **self.live_counts(stream)}

    def stream_counts(self) -> list[dict]:
        """Every stream's counters in the order of stream_ids(): those in slots now, and those removed as they
        were then."""
        with self.streams.lock:
            live = {s.id: s for s in self.streams.live()}
            retired = dict(self.streams.retired)
        return [retired[i] if i in retired else {"uri": live[i].spec.uri, "state": live[i].state,
                                                 **self.live_counts(live[i])}
                for i in _by_id(live, retired)]

    def stream_ids(self) -> list[int]:
        """The IDs the summary's per-stream lists follow (a GPU's worker tells the face which is which)."""
        with self.streams.lock:
            return _by_id({s.id: s for s in self.streams.live()}, self.streams.retired)

    def totals(self) -> dict[str, int]:
        """Each counter summed over every stream, removed ones included."""
        counts = self.stream_counts()
        return {name: sum(c[name] for c in counts) for name in (*COUNTERS, "dropped", "dropped_catching_up")}

    def say_overload(self) -> None:
        """A warning (at most once a minute) while live streams drop frames: the offered rate is more than the
        pipeline processes, and the drops keep its latency bounded (a file waits instead). It says how busy the
        GPU and the post thread were (limit_said); a window that drops frames because this process's CPU is the
        limit is said at once, the first time. The drops of a stream catching up (its frames delivered at more
        than twice real time: a backlog) are not an overload: said apart (say_backlog_drops)."""
        totals, now = self.totals(), time.monotonic()
        self.say_backlog_drops(totals["dropped_catching_up"], now)
        dropped, said, at = totals["dropped"] - totals["dropped_catching_up"], *self._overload_said
        dropping = self._roll_window(now, dropped)
        gpu, post = self._shares
        cpu_bound = dropping and cpu_is_the_limit(gpu, post)
        if (dropped > said and now - at >= OVERLOAD_LOG_S) or (cpu_bound and not self._cpu_limit_said):
            captured = max(1, totals["captured"])
            log.warning("overloaded: %d frame(s) dropped so far (%.1f %% of those captured): the streams offer more "
                        "than the pipeline processes; the oldest queued frames go so that latency stays bounded; %s",
                        dropped, 100 * dropped / captured, limit_said(gpu, post))
            self._overload_said = (dropped, now)
            self._cpu_limit_said = self._cpu_limit_said or cpu_bound

    def say_backlog_drops(self, dropped: int, now: float) -> None:
        """At most once a minute, where more frames were dropped while live streams caught up: why, and that it
        is not an overload."""
        said, at = self._backlog_said
        if dropped > said and now - at >= OVERLOAD_LOG_S:
            log.info("%d frame(s) dropped while live streams caught up: frames a camera sent while it was being "
                     "opened (its connection, its first frame decoded) or held up by the network came at once, more "
                     "than its queue of %d holds, and the newest were kept; not an overload", dropped,
                     self.batcher.depth)
            self._backlog_said = (dropped, now)

    def _roll_window(self, now: float, dropped: int) -> bool:
        """Every SHARE_WINDOW_S: the window's busy shares kept; True where that window dropped frames."""
        since, gpu_then, post_then, dropped_then = self._window
        if now - since < SHARE_WINDOW_S:
            return False
        gpu_s, post_s = self.stages.gpu_busy_s, _post_busy_s(self.stages.post_phase_s)
        span = now - since
        self._shares = ((gpu_s - gpu_then) / span if gpu_s else None, (post_s - post_then) / span)
        self._window = (now, gpu_s, post_s, dropped)
        return dropped > dropped_then

    def status_line(self) -> str:
        m = self.metrics
        fps = " ".join(f"{m.fps(s.slot):.1f}" for s in self.streams.live())
        p = m.recent_percentiles("total")
        lat = f"recent p50 {p[0.5]:.0f} ms p99 {p[0.99]:.0f} ms" if p else "no results yet"
        total = self.totals()
        return (f"fps per stream [{fps}], processed {total['processed']}, "
                f"dropped {total['dropped']}, failed {total['failed']}, latency {lat}")

    def summary(self, seconds: float, cpu_s: dict[str, float], interrupted: dict | None) -> dict:
        self.say_overload()  # drops after the serving loop's last look (every 50 ms) are said too, not lost
        m, counts, stages = self.metrics, self.stream_counts(), self.stages.stats()
        per_stream = {name: [c[name] for c in counts] for name in PER_STREAM}
        processed, dropped = sum(per_stream["processed"]), sum(per_stream["dropped"])
        overload_dropped = dropped - sum(per_stream["dropped_catching_up"])
        failure, gpu_busy_s = self.stages.failure, stages.pop("gpu_busy_s")
        return {"seconds": round(seconds, 2), "backend": self.runtime.backend_name,
                # by stream ID (= the records' "stream"): with the control API removed streams too
                **per_stream,
                **({"streams": [{"uri": c["uri"], "state": c["state"]} for c in counts]} if self.control else {}),
                "batches": m.batches,
                # partial batches held past their timeout while the GPU had two unfinished (frames joined them)
                "batches_held": self.batcher.held,
                **({"latency_budget_ms": self.config.latency_budget_ms} if self.config.latency_budget_ms else {}),
                "throughput_fps": round(processed / max(seconds, 1e-9), 2),
                # live streams dropped frames because processing fell behind (files wait instead); not those
                # dropped while a backlog came at once (dropped_catching_up)
                "overloaded": overload_dropped > 0,
                "dropped_share": round(dropped / max(1, sum(per_stream["captured"])), 4),
                # the run's: the frames finished after a stop (signal, --duration) are the drain's, reported apart
                **({"drain": drain} if (drain := m.drain()) else {}),
                **({"drain_cut_short": cut} if (cut := self.drain_bound and self.drain_bound.cut) else {}),
                "latency_ms": {s: {str(q): round(v, 2) for q, v in m.percentiles(s).items()}
                               for s in ("queue", "gpu", "post", "total")},
                "sink_failures": self.sinks.failures(),
                "sink_frames_dropped": self.sinks.dropped(),
                **({"delivery": delivery} if (delivery := self.sinks.deliveries()) else {}),
                "postprocess": "gpu" if self.runtime.reduction else "cpu",
                "d2h_bytes_per_frame": round(self.runtime.output_bytes_downloaded / max(1, processed)),
                "cpu_seconds": {k: round(v, 3) for k, v in cpu_s.items()},
                "cpu_cores": round(sum(cpu_s.get(k, 0.0) for k in ("process", "decode_processes", "recording_process"))
                                   / max(seconds, 1e-9), 2),
                "gpu_stage_ms": stages.pop("gpu_stage_ms"),
                # the share of the run the GPU spent on batches: near 1, the GPU is what limits throughput
                **({"gpu_busy_share": round(gpu_busy_s / max(seconds, 1e-9), 3)} if gpu_busy_s else {}),
                # its share of the run the post thread worked (not waiting for the GPU): near 1, this process's
                # Python sets the rate (the overload warning says which)
                "post_thread_busy_share": round(_post_busy_s(self.stages.post_phase_s) / max(seconds, 1e-9), 3),
                **stages,
                **({"events": self.events.summary()} if self.events is not None else {}),
                **({"clips": self.clips.summary()} if self.clips is not None else {}),
                **({"snapshots": self.snapshots.summary()} if self.snapshots is not None else {}),
                **({"recording": self.recorder.summary()} if self.recorder is not None else {}),
                **({"interrupted": dict(interrupted)} if interrupted else {}),
                **({"failure": failure} if failure else {})}


def limit_said(gpu: float | None, post: float) -> str:
    """What kept the frames, by the shares of the time the GPU (None: not measured, e.g. the CPU runtime) and
    the post thread (finishing, tracking, rules, records: Python under this process's one GIL) were busy."""
    if gpu is None:
        return "fewer streams, a lower rate or a lighter model would keep them"
    if cpu_is_the_limit(gpu, post):
        return (f"the post thread was busy {100 * post:.0f} % of the time and the GPU {100 * gpu:.0f} %: this "
                "process's CPU is the limit, not the GPU (--workers-per-gpu 2 or more serves the streams in several "
                "processes, best under CUDA MPS; fewer objects a frame or fewer rules cost less)")
    return (f"the GPU was busy {100 * gpu:.0f} % of the time, the post thread {100 * post:.0f} % (fewer streams, a "
            "lower rate or a lighter model would keep them)")


def cpu_is_the_limit(gpu: float | None, post: float) -> bool:
    """The post thread busy and the GPU (measured) not: this process's Python, not the GPU, sets the rate."""
    return gpu is not None and post >= BUSY and gpu < BUSY


def _post_busy_s(phase_s: dict[str, float]) -> float:
    """The post thread's seconds at work: its phases but the wait for the GPU's results."""
    return sum(v for k, v in phase_s.items() if k != "wait_gpu")


def _by_id(live: dict, retired: dict) -> list[int]:
    return sorted([*live, *retired])
