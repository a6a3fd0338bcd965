#!/usr/bin/env python3
"""A light detector at the decoder's limit (issue 27), side by side in one run.

  python scripts/bench_light.py MODEL.onnx [--streams 32,64] [--seconds 20] [--max-batch 32] [--json out.json]

MODEL: a small detector, e.g. the YOLOv8n at 320x320 that the registry's `nudenet` 3.4.2 ships (320n.onnx,
real weights, Ultralytics metadata: converted as detection-yolo). A 1080p30 H.264 file (testsrc2, 10 s) is
encoded with ffmpeg; for each stream count N, each in a process of its own (CPU time and memory its own):

  decode  PyNvVideoCodec alone: N threads, each demuxing the file and decoding it on NVDEC as fast as it goes,
          looping (a new demuxer into the same decoder), frames left in device memory. The ceiling.
  serve   `jetpipe serve`'s pipeline: N NVDEC sources on the same file, looping, saturated (every frame
          processed: copied into the device ring, batched, preprocessed, inferred, postprocessed on the GPU);
          once per --capture-threads value (default 0: the pipeline's default; 256: a thread per stream) and
          per --decode-processes value (default 0,1: decoded in the serving process, then in 1 process of its
          own, the frames written into the serving process's ring slots by CUDA IPC; CPU cores count its CPU).
And once, the model alone at max batch (ONNX Runtime CUDA, replayed from a CUDA graph): the GPU's ceiling.

Reported per row: frames/s, % of the decode ceiling, CPU cores (process CPU time / wall), peak RSS, GPU memory
the process added (nvidia-smi memory.used mid-run minus before start), and for serve the share of the run
the GPU spent on its batches (near 1: GPU-bound); per stream: the RSS and GPU memory
added going from the smallest to the largest N, divided by the streams added.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root), str(root / "scripts")]

from children import last_json  # noqa: E402


def gpu_memory_used_mib() -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return float(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


class MemorySampler:
    """nvidia-smi's memory.used before start-up, and once mid-run (the run's steady state)."""

    def __init__(self, seconds: float):
        self.before, self.during = gpu_memory_used_mib(), None
        self.threads = None  # Python threads mid-run
        self._seconds = seconds

    def start(self) -> None:
        def sample():
            time.sleep(self._seconds * 0.6)
            self.threads = threading.active_count() - 1  # not this one
            self.during = gpu_memory_used_mib()
        threading.Thread(target=sample, daemon=True).start()

    def added_mib(self) -> float | None:
        return None if self.before is None or self.during is None else self.during - self.before


def decode_child(args) -> None:
    """PyNvVideoCodec alone on N streams; prints one JSON line."""
    import PyNvVideoCodec as nvc

    memory, clip = MemorySampler(args.seconds), str(args.clip)
    counts, ready = [0] * args.streams, threading.Barrier(args.streams + 1)
    stop: list[float] = [float("inf")]

    def decode(i: int) -> None:
        try:
            demuxer = nvc.CreateDemuxer(filename=clip)
            decoder = nvc.CreateDecoder(gpuid=0, codec=demuxer.GetNvCodecId(), usedevicememory=True)
            packets = iter(demuxer)
            while not decoder.Decode(next(packets)):  # the first picture out: decoder set up, not timed
                pass
        except BaseException:
            ready.abort()  # the others and the main thread stop waiting: this child fails with the reason
            raise
        ready.wait()
        while time.monotonic() < stop[0]:
            packet = next(packets, None)
            if packet is None or packet.bsl == 0:  # the end (or its flush packet): loop, as jetpipe's source does
                packets = iter(nvc.CreateDemuxer(filename=clip))
                continue
            counts[i] += len(decoder.Decode(packet))

    threads = [threading.Thread(target=decode, args=(i,), daemon=True) for i in range(args.streams)]
    for t in threads:
        t.start()
    ready.wait()  # a decoder that failed to start breaks the barrier: this child fails, said why
    before, wall = os.times(), time.perf_counter()
    stop[0] = time.monotonic() + args.seconds
    memory.start()
    for t in threads:
        t.join()
    after, wall = os.times(), time.perf_counter() - wall
    frames = sum(counts)
    print(json.dumps({"what": "decode", "streams": args.streams, "fps": frames / wall, "frames": frames,
                      "seconds": wall, "cpu_cores": _cpu(before, after) / wall, "rss_mb": _rss_mb(),
                      "gpu_memory_added_mib": memory.added_mib()}), flush=True)


def serve_child(args) -> None:
    """jetpipe's pipeline on N NVDEC streams, saturated; prints one JSON line."""
    from jetpipe.pipelines.config import ClipsConfig, PipelineConfig, SourceConfig, validate
    from jetpipe.pipelines.service.daemon import Pipeline

    memory = MemorySampler(args.seconds)
    if float(args.switch_ms) > 0:
        sys.setswitchinterval(float(args.switch_ms) / 1000)
    sources = [SourceConfig(str(args.clip), loop=True, decoder="nvdec") for _ in range(args.streams)]
    clips_folder = tempfile.mkdtemp(prefix="bench-light-clips-") if args.clips == "on" else ""
    config = validate(PipelineConfig(bundle=Path(args.bundle), sources=sources, duration=args.seconds,
                                     clips=ClipsConfig(folder=clips_folder),  # no rules: rings kept, none cut
                                     max_batch=args.max_batch, metrics_listen="", log_every_s=1e9, queue_depth=4,
                                     capture_threads=int(args.capture_threads),
                                     decode_processes=_processes(args.decode_processes),
                                     decode_threads=int(args.decode_threads)))
    pipeline = Pipeline(config)  # start-up (allocation, warm-up, decoders opened) is not timed
    paths = sorted({s.describe().rsplit("(", 1)[-1].rstrip(")") for s in pipeline.sources})
    stacks = StackSampler() if os.environ.get("BENCH_STACKS") else None
    census = thread_cpu_by_id()
    before, wall = os.times(), time.perf_counter()
    memory.start()
    summary = pipeline.run()
    after, wall = os.times(), time.perf_counter() - wall
    if clips_folder:
        os.rmdir(clips_folder)  # rings only: no clip was cut into it
    census = thread_census(census)
    # the decode processes' CPU over the run, as they said it (their start-up, in os.times()'s children, is not)
    cpu = _cpu(before, after, children=False) + summary["cpu_seconds"].get("decode_processes", 0.0)
    hot = stacks.report() if stacks is not None else None
    processed = sum(summary["processed"])
    total = summary["latency_ms"]["total"]
    print(json.dumps({"what": "serve", "streams": args.streams, "capture_threads": int(args.capture_threads),
                      "decode_processes": _processes(args.decode_processes),
                      "decoded_elsewhere": "decode_processes" in summary["cpu_seconds"],
                      "clips": args.clips, "clips_summary": summary.get("clips"),
                      "decode_threads": int(args.decode_threads),
                      "switch_ms": sys.getswitchinterval() * 1000,
                      "threads": memory.threads, "paths": paths, "fps": processed / wall,
                      "frames": processed, "dropped": sum(summary["dropped"]), "failed": sum(summary["failed"]),
                      "batches": summary["batches"], "seconds": wall, "cpu_cores": cpu / wall,
                      "rss_mb": _rss_mb(), "gpu_memory_added_mib": memory.added_mib(),
                      "p50_ms": total.get("0.5"), "p99_ms": total.get("0.99"),
                      "thread_cpu_s": summary.get("cpu_seconds"), "gpu_busy_share": summary.get("gpu_busy_share"),
                      "latency_ms": summary["latency_ms"],
                      "post_thread_ms_per_batch": summary.get("post_thread_ms_per_batch"),
                      "threads_alive_cpu_s": census,
                      **({"stacks": hot} if hot else {})}), flush=True)


def thread_cpu_by_id() -> dict[int, float]:
    from jetpipe.pipelines.ingest.decode_procs import thread_cpu_seconds

    return {int(task): thread_cpu_seconds(int(task)) for task in os.listdir("/proc/self/task")}


def thread_census(before: dict[int, float]) -> dict[str, float]:
    """CPU seconds since `before` (thread_cpu_by_id()) of this process's threads alive now, by Python thread
    name; threads Python did not start (ONNX Runtime's, the CUDA driver's) summed as "native". The pipeline's
    own threads that end with the run are in its summary's cpu_seconds instead."""
    named = {t.native_id: t.name for t in threading.enumerate()}
    census: dict[str, float] = {}
    for task, cpu in thread_cpu_by_id().items():
        name = named.get(task, "native")
        census[name] = round(census.get(name, 0.0) + cpu - before.get(task, 0.0), 3)
    return census


class StackSampler:
    """BENCH_STACKS=1: where the pipeline's threads are, sampled every 5 ms (the innermost jetpipe line of each
    thread, and the call it is in), the 25 most frequent in the row's JSON: what holds a saturated run."""

    def __init__(self):
        from collections import Counter

        self.counts, self._stop = Counter(), threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(0.005):
            for ident, frame in sys._current_frames().items():
                if ident != me:
                    self.counts[self._where(frame)] += 1

    @staticmethod
    def _where(frame) -> str:
        inner = frame
        while frame is not None:
            if "jetpipe" in frame.f_code.co_filename:
                return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name} " \
                       f"<- {inner.f_code.co_name}"
            frame = frame.f_back
        return f"{Path(inner.f_code.co_filename).name}:{inner.f_lineno} {inner.f_code.co_name}"

    def report(self) -> list[str]:
        self._stop.set()
        total = sum(self.counts.values()) or 1
        return [f"{100 * n / total:5.1f} %  {where}" for where, n in self.counts.most_common(25)]


def _cpu(before, after, children: bool = True) -> float:
    fields = ("user", "system", "children_user", "children_system") if children else ("user", "system")
    return sum(getattr(after, k) - getattr(before, k) for k in fields)


def _rss_mb() -> float:
    """Peak RSS of this process (not of the decode processes: a spawned child's peak counts the parent's pages
    it was forked with before its exec)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(what: str, clip: Path, streams: int, seconds: float, bundle: Path, max_batch: int,
              capture_threads: int = 0, switch_ms: float = 0.0, decode_processes: int | str = 0,
              decode_threads: int = 0, clips: str = "off") -> dict:
    argv = [sys.executable, __file__, what, "--clip", str(clip), "--streams", str(streams), "--seconds",
            str(seconds), "--bundle", str(bundle), "--max-batch", str(max_batch), "--capture-threads",
            str(capture_threads), "--switch-ms", str(switch_ms), "--decode-processes", str(decode_processes),
            "--decode-threads", str(decode_threads), "--clips", clips]
    return last_json(argv, {"what": what, "streams": streams}, timeout=900)


def _processes(text: str) -> int | str:
    """serve's decode_processes: a count, or auto (serve's default: decode_choice)."""
    return text if text == "auto" else int(text)


def convert(model: Path, out: Path, max_batch: int) -> Path:
    subprocess.run([sys.executable, "-m", "jetpipe", "convert", str(model), "-o", str(out), "--max-batch",
                    str(max_batch), "--engine", "never", "--quiet"], check=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("what", nargs="?", default="run", help=argparse.SUPPRESS)
    parser.add_argument("model", nargs="?", type=Path)
    parser.add_argument("--streams", default="32,64")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--capture-threads", default="0", help="serve's capture_threads, one row each (0: default)")
    parser.add_argument("--decode-processes", default="0,1", help="serve's decode_processes, one row each (0: decode "
                        "in the serving process; auto: serve's default; default 0,1: both, side by side)")
    parser.add_argument("--decode-threads", default="0", help="serve's decode_threads for the rows with decode "
                        "processes, one row each (0: serve's default, a thread a stream, 4 at most), e.g. 0,8")
    parser.add_argument("--switch-ms", default="0", help="serve's Python switch interval in ms, one row each "
                        "(0: the interpreter's, 5 ms)")
    parser.add_argument("--clips", default="off", help="clips' packet rings kept (on) or not (off), one row each, "
                        "e.g. off,on; no rules, so no clip is cut: what keeping every stream's packets costs")
    parser.add_argument("--clip", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--bundle", type=Path, help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    if argv and argv[0] in ("decode", "serve", "engine"):
        args = parser.parse_args(argv)
        args.streams = int(args.streams)
        if args.what == "engine":
            print(json.dumps(engine_fps(args.bundle, args.max_batch)), flush=True)
            return
        (decode_child if args.what == "decode" else serve_child)(args)
        return
    args = parser.parse_args(["run", *argv])
    if args.model is None:
        parser.error("give the model: scripts/bench_light.py MODEL.onnx")
    if not set(args.clips.split(",")) <= {"off", "on"}:
        parser.error(f"--clips {args.clips}: give off, on or off,on")
    run_all(args)


def engine_fps(bundle: Path, batch: int) -> dict:
    """The model alone at `batch` (ONNX Runtime CUDA, I/O on the device, replayed from a CUDA graph as the
    pipeline runs it): the GPU's ceiling for the pipeline, decoding and preprocessing aside."""
    from bench_runtime import bare_backend

    from jetpipe import bundle as bundle_io

    sample = (3, *bundle_io.read_manifest(bundle)["input_size"])
    ms = bare_backend(str(bundle / "model.onnx"), sample, batch, 300, cuda_graph=True)
    return {"what": "engine", "batch": batch, "fps": batch * 1000 / ms, "ms_per_batch": ms}


def run_all(args) -> None:
    from bench_video import encode

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        clip = encode(Path(tmp), "h264", 10)
        bundle = convert(args.model, Path(tmp) / "bundle", args.max_batch)
        engine = run_child("engine", clip, 0, 0, bundle, args.max_batch)  # a process of its own, as the others
        print(json.dumps(engine), flush=True)
        for n in (int(v) for v in args.streams.split(",")):
            ceiling = run_child("decode", clip, n, args.seconds, bundle, args.max_batch)
            rows.append(ceiling)
            print(json.dumps(rows[-1]), flush=True)
            variants = [(int(t), float(ms), _processes(dp), int(dt), c) for t in args.capture_threads.split(",")
                        for ms in args.switch_ms.split(",") for dp in args.decode_processes.split(",")
                        for dt in (args.decode_threads.split(",") if dp != "0" else ["0"])
                        for c in args.clips.split(",")]
            for threads, switch_ms, processes, decode_threads, clips in variants:
                rows.append(run_child("serve", clip, n, args.seconds, bundle, args.max_batch, threads, switch_ms,
                                      processes, decode_threads, clips))
                if "fps" in rows[-1] and "fps" in ceiling:
                    rows[-1]["pct_of_decode"] = 100 * rows[-1]["fps"] / ceiling["fps"]
                print(json.dumps(rows[-1]), flush=True)
    report(rows, args)
    if "fps" in engine:
        print(f"engine alone at batch {engine['batch']}: {engine['fps']:.0f} frames/s ({engine['ms_per_batch']:.2f} ms "
              "a batch, CUDA graph)")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model.name, "max_batch": args.max_batch,
                                         "seconds": args.seconds, "engine": engine, "rows": rows}, indent=2))


def report(rows: list[dict], args) -> None:
    print(f"\n{args.model.name}, 1080p30 H.264, {args.seconds:g} s a row, max batch {args.max_batch}")
    print("| streams | what | capture threads, switch ms, decode processes (threads) | frames/s | % of decode "
          "| CPU cores | RSS MB | GPU MiB added | dropped | p99 ms | GPU busy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['streams']} | {r['what']} | error: {r['error'][:100]} |")
            continue
        pct = f"{r['pct_of_decode']:.0f} %" if "pct_of_decode" in r else ""
        gpu = r.get("gpu_memory_added_mib")
        threads = f" ({r['decode_threads']})" if r.get("decode_threads") else ""
        clips = ", clips" if r.get("clips") == "on" else ""
        print(f"| {r['streams']} | {r['what']} | {r.get('capture_threads', '')}, {r.get('switch_ms', 0):g}, "
              f"{r.get('decode_processes', '')}{threads}{clips} "
              f"| {r['fps']:.0f} | {pct} "
              f"| {r['cpu_cores']:.2f} | {r['rss_mb']:.0f} | "
              f"{gpu if gpu is not None else 'n/a'} | {r.get('dropped', '')} | {r.get('p99_ms') or ''} | "
              f"{r.get('gpu_busy_share') or ''} |")
    first = int(args.capture_threads.split(",")[0])
    first_processes = _processes(args.decode_processes.split(",")[0])  # a count, or auto
    r0_ms = next((r["switch_ms"] for r in rows if r["what"] == "serve" and "switch_ms" in r), 5)
    first_clips = args.clips.split(",")[0]
    for what in ("decode", "serve"):  # serve: the first variant's rows only
        ok = sorted((r for r in rows if r["what"] == what and "error" not in r and
                     r.get("capture_threads", first) == first and r.get("switch_ms", 5) == r0_ms and
                     r.get("decode_processes", first_processes) == first_processes and
                     r.get("clips", first_clips) == first_clips),
                    key=lambda r: r["streams"])
        if len(ok) >= 2 and ok[-1]["streams"] > ok[0]["streams"]:
            added = ok[-1]["streams"] - ok[0]["streams"]
            rss = (ok[-1]["rss_mb"] - ok[0]["rss_mb"]) / added
            gpu = [r.get("gpu_memory_added_mib") for r in (ok[0], ok[-1])]
            per_gpu = f"{(gpu[1] - gpu[0]) / added:.1f} MiB" if None not in gpu else "n/a"
            print(f"{what}: per stream added ({ok[0]['streams']} -> {ok[-1]['streams']}): RSS {rss:.1f} MB, "
                  f"GPU memory {per_gpu}")


if __name__ == "__main__":
    main()
