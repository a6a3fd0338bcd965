"""The summary of a run on several GPUs: the one-process summary's keys over every stream, by stream ID, and
each GPU's own summary under `gpus`. A stream whose worker died and was started again counts both workers'
frames: the first one's as far as the face knows them (the records it delivered); `worker_exits` says each death.

Counts are summed; the latency quantiles are those of every frame's record as the face received them (not
an average of the workers' quantiles, which would hide one GPU's tail).
"""

from __future__ import annotations

from jetpipe.pipelines.summary import PER_STREAM

KEPT_APART = ("stream_ids", *PER_STREAM)  # each GPU's summary keeps the rest of its keys under "gpus"


def merge(workers: list, seconds: float, latency, sink_uris: list[str], face_sinks, frame_schemes,
          face_cpu_s: float) -> dict:
    """workers: each worker of the run's outcome() (gpu, its summary or None where it died, its IDs, how it ended,
    the frames' records it delivered per stream, its restart number), those that died and were replaced first;
    latency: the face's RunHistogram of the records' total latency; face_sinks: the SinkFanout of the sinks that
    take records; face_cpu_s: the face's own CPU time."""
    last = {gpu: (summary, ids, ended) for gpu, summary, ids, ended, _, _ in workers}  # each GPU's newest
    counts: dict[int, dict] = {}
    for _, summary, ids, _, delivered, _ in workers:
        # a summary's lists are by its stream IDs (added ones too); a worker that died: the frames it delivered
        streams = summary["stream_ids"] if summary is not None else sorted({*ids, *delivered})
        for k, stream in enumerate(streams):
            got = ({name: summary[name][k] for name in PER_STREAM} if summary is not None else
                   {**dict.fromkeys(PER_STREAM, 0), "processed": delivered.get(stream, 0)})
            counts[stream] = {name: counts.get(stream, {}).get(name, 0) + got[name] for name in PER_STREAM}
    ids = sorted(counts)
    per_stream = {name: [counts[i][name] for i in ids] for name in PER_STREAM}
    processed, dropped = sum(per_stream["processed"]), sum(per_stream["dropped"])
    done = [w[1] for w in workers if w[1] is not None]
    exits = [{"gpu": gpu, "restart": restart, "ended": ended, "frames_delivered": sum(delivered.values())}
             for gpu, summary, _, ended, delivered, restart in workers if summary is None]
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
               **({"worker_exits": exits} if exits else {}),
               "gpus": [{"gpu": gpu, "streams": ids, "ended": ended,
                         "restarts": sum(1 for w in workers if w[0] == gpu) - 1,
                         **({k: v for k, v in s.items() if k not in KEPT_APART} if s is not None else {})}
                        for gpu, (s, ids, ended) in sorted(last.items())]}
    failures = [f"gpu {g}: {s['failure']}" for g, (s, _, _) in last.items() if s is not None and s.get("failure")]
    failures += [f"gpu {g}: its worker {ended}" for g, (s, _, ended) in last.items() if s is None]
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
