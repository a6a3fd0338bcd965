"""`jetpipe calibrate latency`: per-stage latency and throughput against batch size.

GPU: CUDA events around each stage (frame upload, preprocessing kernel,
inference, output download) plus wall clock for postprocessing and the whole
call; CPU: wall clock per stage. Warm-up first; p50/p90/p99 of each.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jetpipe import bundle as bundles
from jetpipe.calibration import reports
from jetpipe.errors import JetpipeError
from jetpipe.frames import frame_shape
from jetpipe.pipelines.ingest.sources import SyntheticCamera
from jetpipe.runtime.api import Frame
from jetpipe.runtime.open import open_runtime
from jetpipe.runtime.probe import probe_gpu
from jetpipe.tasks import for_bundle
from jetpipe.uri import parse as parse_uri


@dataclass
class LatencyOptions:
    bundle: Path
    report: Path
    batches: tuple[int, ...] = (1, 2, 4, 8)
    iterations: int = 100
    warmup: int = 10
    source: str = "synthetic://1920x1080/nv12"
    backend: str = "auto"
    memory: str = "auto"
    progress: bool = True
    force: bool = False  # replace an existing report


def _rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _frames(uri: str, count: int):
    """`count` frames from a synthetic source spec (allocated before timing)."""

    if parse_uri(uri).scheme != "synthetic":
        raise JetpipeError(f"--source {uri!r}: latency runs use synthetic://WxH/FORMAT frames")
    camera = SyntheticCamera.from_uri(uri)
    camera.fps = 0  # no pacing: frames are made before timing
    info = camera.open()
    frames = []
    for _ in range(count):
        slot = np.empty(frame_shape(info.format, info.height, info.width), np.uint8)
        camera.read_into(slot)
        frames.append(Frame(slot, info.format))
    return frames


def _stats(values) -> dict:
    arr = np.asarray(values, dtype=np.float64)
    return {"p50": float(np.percentile(arr, 50)), "p90": float(np.percentile(arr, 90)),
            "p99": float(np.percentile(arr, 99)), "mean": float(arr.mean()), "count": int(arr.size)}


MAX_ITERATIONS = 100_000


def run_latency(opts: LatencyOptions) -> dict:
    if not opts.batches or min(opts.batches) < 1:
        raise JetpipeError(f"--batch {','.join(map(str, opts.batches))}: batch sizes must be >= 1")
    if not 1 <= opts.iterations <= MAX_ITERATIONS:
        raise JetpipeError(f"--iterations must be from 1 to {MAX_ITERATIONS}")
    if not 0 <= opts.warmup <= MAX_ITERATIONS:
        raise JetpipeError(f"--warmup {opts.warmup}: from 0 to {MAX_ITERATIONS} runs")
    reports.check_destination(opts.report, opts.force, opts.bundle)
    manifest = bundles.load(opts.bundle)
    if max(opts.batches) > manifest["batch"]["max"]:
        raise JetpipeError(f"--batch {max(opts.batches)} exceeds the bundle's max batch {manifest['batch']['max']}")
    task, options = for_bundle(manifest)
    frames = _frames(opts.source, max(opts.batches))
    rss_before = _rss_mb()
    runtime = open_runtime(opts.bundle, max(opts.batches), opts.backend, opts.memory, profile=True)
    try:
        post = task.postprocessor(options)
        rows = [_measure(runtime, post, frames[:b], opts) for b in opts.batches]
        device = runtime.describe()
    finally:
        runtime.close()
    report = {"bundle": str(opts.bundle), "precision": manifest["precision"], "backend": runtime.backend_name,
              "memory": runtime.memory, "source": opts.source, "iterations": opts.iterations,
              "warmup": opts.warmup, "device": device, "rss_mb": {"before": rss_before, "after": _rss_mb()},
              "versions": manifest["versions"] | _versions(), "batches": rows}
    reports.write(opts.report, report, latency_markdown(report), _plots(rows))
    return report


def _measure(runtime, post, frames, opts: LatencyOptions) -> dict:
    sizes = [f.size() for f in frames]
    stages, totals, posts = {}, [], []
    for i in range(opts.warmup + opts.iterations):
        start = time.perf_counter()
        ticket = runtime.submit(frames)
        result = runtime.collect(ticket)
        collected = time.perf_counter()
        post(result.outputs, result.letterboxes, sizes)
        end = time.perf_counter()
        if i < opts.warmup:
            continue
        for stage, ms in runtime.stage_times(ticket).items():
            stages.setdefault(stage, []).append(ms)
        posts.append((end - collected) * 1e3)
        totals.append((end - start) * 1e3)
    stages["postprocess"] = posts
    row = {"batch": len(frames), "stages_ms": {k: _stats(v) for k, v in stages.items()},
           "total_ms": _stats(totals)}
    row["throughput_fps"] = len(frames) * 1000.0 / row["total_ms"]["p50"]
    return row


def _versions() -> dict:
    import onnxruntime

    out = {"onnxruntime_runtime": onnxruntime.__version__}
    pycuda = probe_gpu().pycuda
    if pycuda:
        out["pycuda"] = pycuda
    return out


def _plots(rows) -> dict:
    x = [r["batch"] for r in rows]
    stage_names = list(rows[0]["stages_ms"])
    return {
        "latency_vs_batch.png": reports.line_chart(
            x, {q: [r["total_ms"][q] for r in rows] for q in ("p50", "p90", "p99")},
            "end-to-end latency per batch", "batch size", "ms"),
        "stages.png": reports.stacked_bars(x, {s: [r["stages_ms"][s]["p50"] for r in rows] for s in stage_names},
                                           "p50 time per stage", "batch size", "ms"),
        "throughput_vs_batch.png": reports.line_chart(x, {"frames/s": [r["throughput_fps"] for r in rows]},
                                                      "throughput", "batch size", "frames/s"),
    }


def latency_markdown(report: dict) -> str:
    d = report["device"]
    device = f"{d['name']} (sm {d['compute_capability']})" if d["kind"] == "gpu" else f"CPU {d['name']}"
    stages = list(report["batches"][0]["stages_ms"])
    lines = [f"# Latency: {report['bundle']} ({report['precision']})", "",
             f"{device}, backend {report['backend']}, frames {report['source']} ({report['memory']} memory), "
             f"{report['iterations']} iterations after {report['warmup']} warm-up.", "",
             "| batch | " + " | ".join(f"{s} p50" for s in stages) + " | total p50 | p90 | p99 | frames/s |",
             "|---" * (len(stages) + 5) + "|"]
    for r in report["batches"]:
        cells = [f"{r['stages_ms'][s]['p50']:.3f}" for s in stages]
        t = r["total_ms"]
        lines.append(f"| {r['batch']} | " + " | ".join(cells) +
                     f" | {t['p50']:.3f} | {t['p90']:.3f} | {t['p99']:.3f} | {r['throughput_fps']:.1f} |")
    lines += ["", "(ms; GPU stages from CUDA events, CPU stages and totals from the wall clock)", "",
              "![latency](latency_vs_batch.png) ![stages](stages.png) ![throughput](throughput_vs_batch.png)"]
    return "\n".join(lines) + "\n"
