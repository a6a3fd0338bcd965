"""The summary of a run on several GPUs: the one-process summary's keys over every stream, by stream ID, and
each GPU's own summary under `gpus`. A stream whose worker died and was started again counts both workers'
frames: the first one's as far as the face knows them (the records it delivered); `worker_exits` says each death.

Counts are summed; the latency quantiles are those of every frame's record as the face received them (not
an average of the workers' quantiles, which would hide one GPU's tail).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from jetpipe.pipelines.ingest.streams import Resume
from jetpipe.pipelines.outputs.recording.parts import PART
from jetpipe.pipelines.outputs.sinks import FRAME_SCHEMES, scheme_of
from jetpipe.pipelines.service.gpus.channel import worker_name
from jetpipe.pipelines.service.summary import PER_STREAM

KEPT_APART = ("stream_ids", *PER_STREAM)  # each GPU's summary keeps the rest of its keys under "gpus"
EVIDENCE = ("recording", "clips", "snapshots")  # each worker's part of them (evidence.py): summed into the whole


@dataclass
class Outcome:
    """One worker of the run, as the summary takes it."""

    gpu: int
    summary: dict | None      # its own summary; None where it died
    ids: list[int]            # its configured streams' IDs
    ended: str                # how it ended
    delivered: dict           # the frames' records it delivered, per stream
    restart: int              # how many workers of its GPU died before it
    drawn: list[int]          # where its frame sinks stand in the configuration's sinks, in its own order
    resumed_from: Resume = field(default_factory=Resume)  # where its streams began (a restarted worker's go on)
    reached: Resume = field(default_factory=Resume)       # where its records ended, as the face received them
    number: int = -1          # its place among the face's workers (-1: its GPU's number stands for it)
    k: int = 0                # its place among its GPU's workers, from 1, where the GPU has several (channel.Job)

    @property
    def key(self) -> int:
        """Which worker it is (a restarted one has its predecessor's)."""
        return self.number if self.number >= 0 else self.gpu

    @property
    def said(self) -> str:
        return worker_name(self.gpu, self.k).lower()

    def died_with(self, stream: int) -> dict:
        """A dead worker's counts of a stream as far as the face knows them: the frames it numbered (as far as its
        records tell), those it delivered, and the rest dropped (by the latency budget, or with the worker)."""
        captured = max(0, self.reached.frames.get(stream, 0) - self.resumed_from.frames.get(stream, 0))
        processed = self.delivered.get(stream, 0)
        return {**dict.fromkeys(PER_STREAM, 0), "captured": max(captured, processed), "processed": processed,
                "dropped": max(0, captured - processed)}


def merge(workers: list[Outcome], face_s: float, latency, sink_uris: list[str], face_sinks,
          face_cpu_s: float) -> dict:
    """workers: every worker of the run, those that died and were replaced first; face_s: the face's run, from
    its workers ready to their ends; latency: the face's RunHistogram of the records' total latency;
    face_sinks: the SinkFanout of the sinks that take records; face_cpu_s: the face's own CPU time."""
    last = {w.key: w for w in workers}  # each worker's newest (its restarts replace it)
    counts: dict[int, dict] = {}
    for w in workers:
        # a summary's lists are by its stream IDs (added ones too); a worker that died: the frames it delivered
        streams = w.summary["stream_ids"] if w.summary is not None else sorted({*w.ids, *w.delivered})
        for k, stream in enumerate(streams):
            got = ({name: w.summary[name][k] for name in PER_STREAM} if w.summary is not None else
                   w.died_with(stream))
            counts[stream] = {name: counts.get(stream, {}).get(name, 0) + got[name] for name in PER_STREAM}
    ids = sorted(counts)
    per_stream = {name: [counts[i][name] for i in ids] for name in PER_STREAM}
    processed, dropped = sum(per_stream["processed"]), sum(per_stream["dropped"])
    done = [w for w in workers if w.summary is not None]
    exits = [{"gpu": w.gpu, **_worker_key(w), "restart": w.restart, "ended": w.ended,
              "frames_delivered": sum(w.delivered.values()),
              "frames_lost": sum(w.died_with(i)["dropped"] for i in w.ids)}
             for w in workers if w.summary is None]
    # the time served, as one process counts it (its drain said apart): the longest a worker served; the face's
    # own run adds the workers' drains and exits (at 96 streams, 2-3 s of 20: a tenth off the rate)
    seconds = max((w.summary["seconds"] for w in done), default=face_s)
    summary = {"seconds": round(seconds, 2), "face_seconds": round(face_s, 2),
               "backend": done[0].summary["backend"] if done else None,
               **per_stream,
               "throughput_fps": round(processed / max(seconds, 1e-9), 2),
               "overloaded": dropped - sum(per_stream["dropped_catching_up"]) > 0,
               "dropped_share": round(dropped / max(1, sum(per_stream["captured"])), 4),
               "latency_ms": {"total": {str(q): round(latency.quantile(q), 2)
                                        for q in (0.5, 0.9, 0.99) if latency.count}},
               "sink_failures": _sink_counts(sink_uris, done, face_sinks.failures(), "sink_failures"),
               "sink_frames_dropped": _sink_counts(sink_uris, done, face_sinks.dropped(), "sink_frames_dropped"),
               **({"delivery": delivery} if (delivery := face_sinks.deliveries()) else {}),
               # every process's: the workers' (their decode processes too) and the face's, also said apart
               "cpu_cores": round(sum(w.summary["cpu_cores"] for w in done) + face_cpu_s / max(face_s, 1e-9), 2),
               "face_cpu_cores": round(face_cpu_s / max(face_s, 1e-9), 3),
               **({"events": events} if (events := merged_events(workers)) else {}),
               **merged_evidence(done),
               **({"worker_exits": exits} if exits else {}),
               "gpus": [{"gpu": w.gpu, **_worker_key(w), "streams": w.ids, "ended": w.ended,
                         "restarts": w.restart,
                         **({k: v for k, v in w.summary.items() if k not in KEPT_APART} if w.summary else {})}
                        for _, w in sorted(last.items())]}
    failures = [f"{w.said}: {w.summary['failure']}" for w in last.values() if w.summary and w.summary.get("failure")]
    failures += [f"{w.said}: its worker {w.ended}" for w in last.values() if w.summary is None]
    if failures:
        summary["failure"] = "; ".join(failures)
    return summary


def _worker_key(w: Outcome) -> dict:
    """A worker's name where its GPU has several (`"worker": "GPU 0 worker 2"`); nothing where one a GPU."""
    return {"worker": worker_name(w.gpu, w.k)} if w.k else {}


def _sink_counts(uris: list[str], done: list[Outcome], face_counts: list[int], key: str) -> list[int]:
    """A count per sink in the order given: the face's for the sinks of records, the workers' sum for the frame
    sinks (each worker's list holds its frame sinks in the order `drawn` says, then its link to the face: a
    restarted worker has no jpeg: sink)."""
    counts = [0] * len(uris)
    for i, count in zip([i for i, u in enumerate(uris) if scheme_of(u) not in FRAME_SCHEMES], face_counts):
        counts[i] = count
    for w in done:
        for position, i in enumerate(w.drawn):
            counts[i] += w.summary[key][position]
    return counts


def merged_evidence(done: list[Outcome]) -> dict:
    """The recording's, the clips' and the snapshots' counts as one process says them, summed over the workers'
    parts (their budgets too: the shares add up to the whole); the folder the parts are in. Each worker's own
    stay under `gpus`."""
    merged = {}
    for key in EVIDENCE:
        parts = [w.summary[key] for w in done if w.summary.get(key)]
        if parts:
            merged[key] = _summed(parts)
            folder = Path(parts[0].get("folder", ""))
            if PART.fullmatch(folder.name):
                merged[key]["folder"] = str(folder.parent)
    return merged


def _summed(counts: list[dict]) -> dict:
    """Dicts of counts added key by key (nested ones too); a text is the first one's."""
    out: dict = {}
    for some in counts:
        for key, value in some.items():
            if isinstance(value, dict):
                out[key] = _summed([out.get(key, {}), value])
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                out[key] = round(out.get(key, 0) + value, 3) if isinstance(value, float) else out.get(key, 0) + value
            else:
                out.setdefault(key, value)
    return out


def merged_events(workers: list[Outcome]) -> dict | None:
    """The events of every GPU, as one process says them: each rule's counts summed over the GPUs (a GPU's
    newest worker counts on from the ones that died before it; where it died too, its records' last counts),
    the zones' occupancy now, the rules' CPU seconds. None where no worker has rules."""
    newest = {w.key: w for w in workers}
    counts: dict[str, dict[str, int]] = {}
    occupancy: dict[str, int] = {}
    for w in newest.values():
        said = w.summary.get("events") if w.summary is not None else None
        for rule, counted in (said["counts"] if said else w.reached.event_counts).items():
            mine = counts.setdefault(rule, {})
            for what, n in counted.items():
                mine[what] = mine.get(what, 0) + n
        for zone, n in (said["occupancy"] if said else {}).items():
            occupancy[zone] = occupancy.get(zone, 0) + n
    cpu_s = [w.summary["events"]["cpu_s"] for w in workers if w.summary is not None and "events" in w.summary]
    if not counts and not cpu_s:
        return None
    return {"counts": counts, "occupancy": occupancy, "cpu_s": round(sum(cpu_s), 3)}
