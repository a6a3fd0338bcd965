"""The summary of a run on several GPUs: the one-process summary's keys over every stream, by stream ID, and
each GPU's own summary under `gpus`.

Counts are summed; the latency quantiles are those of every frame's record as the face received them (not
an average of the workers' quantiles, which would hide one GPU's tail).
"""

from __future__ import annotations

from jetpipe.pipelines.summary import PER_STREAM

KEPT_APART = ("stream_ids", *PER_STREAM)  # each GPU's summary keeps the rest of its keys under "gpus"


def merge(workers: list, seconds: float, latency, sink_uris: list[str], face_sinks, frame_schemes,
          face_cpu_s: float) -> dict:
    """workers: (gpu, its summary or None where it died, its IDs, how it ended); latency: the face's RunHistogram
    of the records' total latency; face_sinks: the SinkFanout of the sinks that take records; face_cpu_s: the
    face's own CPU time."""
    by_id: dict[int, dict] = {}
    per_gpu = []
    for gpu, summary, ids, ended in workers:
        if summary is None:
            per_gpu.append({"gpu": gpu, "streams": ids, "ended": ended})
            continue
        for k, stream in enumerate(summary["stream_ids"]):
            by_id[stream] = {name: summary[name][k] for name in PER_STREAM}
        per_gpu.append({"gpu": gpu, "streams": ids, "ended": ended,
                        **{k: v for k, v in summary.items() if k not in KEPT_APART}})
    ids = sorted({i for _, _, worker_ids, _ in workers for i in worker_ids})
    lost = {name: 0 for name in PER_STREAM}
    per_stream = {name: [by_id.get(i, lost)[name] for i in ids] for name in PER_STREAM}
    processed, dropped = sum(per_stream["processed"]), sum(per_stream["dropped"])
    done = [s for _, s, _, _ in workers if s is not None]
    summary = {"seconds": round(seconds, 2), "backend": done[0]["backend"] if done else None,
               **per_stream,
               "throughput_fps": round(processed / max(seconds, 1e-9), 2),
               "overloaded": dropped > 0,
               "dropped_share": round(dropped / max(1, sum(per_stream["captured"])), 4),
               "latency_ms": {"total": {str(q): round(latency.quantile(q), 2)
                                        for q in (0.5, 0.9, 0.99) if latency.count}},
               "sink_failures": _sink_counts(sink_uris, done, face_sinks.failures(), "sink_failures", frame_schemes),
               "sink_frames_dropped": _sink_counts(sink_uris, done, face_sinks.dropped(), "sink_frames_dropped",
                                                   frame_schemes),
               **({"delivery": delivery} if (delivery := face_sinks.deliveries()) else {}),
               # every process's: the workers' (their decode processes too) and the face's, also said apart
               "cpu_cores": round(sum(s["cpu_cores"] for s in done) + face_cpu_s / max(seconds, 1e-9), 2),
               "face_cpu_cores": round(face_cpu_s / max(seconds, 1e-9), 3),
               "gpus": per_gpu}
    failures = [f"gpu {g}: {s['failure']}" for g, s, _, _ in workers if s is not None and s.get("failure")]
    failures += [f"gpu {g}: its worker {ended}" for g, s, _, ended in workers if s is None]
    if failures:
        summary["failure"] = "; ".join(failures)
    return summary


def _sink_counts(uris: list[str], done: list[dict], face_counts: list[int], key: str, frame_schemes) -> list[int]:
    """A count per sink in the order given: the face's for the record sinks, the workers' sum for the frame sinks
    (each worker's list holds its frame sinks in the same order, then its link to the face)."""
    counts, face, frames = [], iter(face_counts), 0
    for uri in uris:
        if uri.split(":", 1)[0].lower() in frame_schemes:
            counts.append(sum(s[key][frames] for s in done))
            frames += 1
        else:
            counts.append(next(face))
    return counts
