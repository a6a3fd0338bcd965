#!/usr/bin/env python3
"""P3 (pipeline throughput and latency) and the P4 soak, on the GPU.

  python scripts/bench_pipeline.py p3 [--streams 8] [--seconds 20] [--json out.json]
  python scripts/bench_pipeline.py soak [--streams 8] [--seconds 570] [--json out.json]
  python scripts/bench_pipeline.py see [--streams 8] [--seconds 20] [--json out.json]
  python scripts/bench_pipeline.py heads MODEL.onnx ... [--objects 30] [--streams 8] [--seconds 15]
      [--postprocess cpu gpu] [--json out.json]

P3, per model (PP-OCRv4 det; ResNet-50 with random weights where torch exists),
one run, postprocessing on the CPU (before) and on the GPU (after):
  - real time: jetpipe serving N synthetic 1920x1080 NV12 streams at 30 fps
    (latency and drops);
  - saturated: N still synthetic streams offered as fast as the pipeline takes
    frames (unpaced, @0: every frame processed, as a file without --realtime; each
    ring slot rendered once and re-sent, so the figure measures the pipeline, not
    the test camera's memcpy; the pinned slots are still uploaded every frame).
    `--saturate-fps R` offers paced cameras faster than the GPU instead (how the
    figures before 2026-11-25, session 22, were taken): their dropped frames cost
    capture work the processed ones do not need;
  - the engine alone at the same batch (ONNX Runtime CUDA EP on device buffers,
    with and without CUDA graphs; the ratio is taken against the faster);
  - the naive pipeline users write (OpenCV on the CPU + one session.run per frame).
Each pipeline run reports device -> host bytes per frame, CPU cores used, CPU
seconds per pipeline thread and CUDA-event milliseconds per GPU stage (per batch).
Heads: the task heads' GPU postprocessing (pose, instance and semantic segmentation; end-to-end detectors, whose
output is compact already and is copied as it is) against the engine alone and against the same pipeline
postprocessing on the CPU. Each export (an Ultralytics -seg / -pose / end-to-end export, a torchvision
segmentation model) is converted (FP32, max batch 8); an Ultralytics export made from its yaml has
random weights, which leave every class score at its initial bias (nothing found), so it first gets a fixed
[1, C, A] tensor added before the class scores' Sigmoid that puts --objects boxes of random classes at random
anchors on every frame, and a -seg export's prototypes get fixed blobs added (flat otherwise: every mask
empty); the boxes, keypoints and coefficients stay the network's own. Per model:
engine-only frames/s, saturated frames/s with postprocessing on the CPU and on the GPU, device -> host bytes
per frame, objects per frame, and whether GPU and CPU postprocessing give the same records on one batch.
Soak: N streams of PP-OCRv4 det for S seconds; free GPU memory and RSS every 10 s.
See: what watching costs — PP-OCRv4 det on N synthetic 1080p streams (real time at 30 fps, and
saturated), plain, then with the tracker, an annotated `video:` sink (960 wide, H.264) and the preview
page watched (every stream's /preview/N.jpg fetched 5 times a second) in the same process.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root), str(root / "scripts")]

from bench_runtime import bare_backend, make_bundles  # noqa: E402

from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate  # noqa: E402
from jetpipe.pipelines.service.daemon import Pipeline  # noqa: E402

BATCH = 8
SATURATE_HELP = ("per-stream rate of the saturated runs (default 0: as fast as the pipeline takes frames, none "
                 "dropped; R > 0: paced cameras, their oldest frames dropped when behind)")


def serve(bundle: Path, streams: int, fps: float, seconds: float, sample=None, postprocess: str = "gpu",
          still: bool = False, sinks=(), tracker: str = "none", watch: bool = False, clip: Path | None = None) -> dict:
    """clip: real encoded video instead of the synthetic camera, every stream looping it (decoder auto:
    NVDEC on the GPU machine), paced at 30 fps unless `still` (saturated: as fast as it decodes)."""
    uri = f"synthetic://1920x1080@{fps:g}/nv12" + ("/still" if still else "")
    sources = [SourceConfig(uri) for _ in range(streams)] if clip is None else \
        [SourceConfig(str(clip), loop=True, realtime=not still) for _ in range(streams)]
    listen = f"127.0.0.1:{_free_port()}" if watch else ""
    config = validate(PipelineConfig(bundle=bundle, sources=sources,
                                     duration=seconds, max_batch=BATCH, backend="onnxruntime-cuda",
                                     metrics_listen=listen, log_every_s=1e9, batch_timeout_ms=20, queue_depth=4,
                                     postprocess=postprocess, sinks=list(sinks), tracker=tracker))
    pipeline = Pipeline(config, profile=sample is None)
    if watch:  # a viewer of the preview page: every stream's frame, 5 times a second
        sample = _viewer(listen, streams)
    sampler = None
    if sample is not None:
        sampler = threading.Thread(target=sample, args=(pipeline,), daemon=True)
        sampler.start()
    return pipeline.run()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _viewer(listen: str, streams: int):
    import urllib.request

    def watch(pipeline):
        while not pipeline.stop_event.is_set():
            for i in range(streams):
                try:
                    urllib.request.urlopen(f"http://{listen}/preview/{i}.jpg", timeout=2).read()
                except OSError:
                    pass
            time.sleep(0.2)
    return watch


def see(args) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        bundle = next(iter(make_bundles(Path(tmp), resnet=False).values()))
        clip = None
        if args.video:
            from bench_video import encode

            clip = encode(Path(tmp), "h264", 10)
        for fps, still in ((30, False), (args.saturate_fps, True)):
            mode = ("real time" if not still else "saturated") + (", H.264 files" if clip else ", synthetic")
            plain = _brief(serve(bundle, args.streams, fps, args.seconds, still=still, clip=clip))
            video = Path(tmp) / f"annotated-{fps:g}-{{stream}}.mp4"
            summary = serve(bundle, args.streams, fps, args.seconds, still=still, tracker="bytetrack", watch=True,
                            sinks=[f"video:{video}?width=960"], clip=clip)
            watched = {**_brief(summary), "sink_frames_dropped": summary["sink_frames_dropped"]}
            row = {"mode": mode, "streams": args.streams, "plain": plain, "watched": watched,
                   "throughput_change": watched["fps"] / plain["fps"] - 1}
            print(json.dumps(row), flush=True)
            rows.append(row)
    for r in rows:
        p, w = r["plain"], r["watched"]
        print(f"{r['mode']}: plain {p['fps']:.0f} fps p99 {p['p99_ms']:.1f} ms drops {p['dropped']} "
              f"{p['cpu_cores']:.2f} cores; tracker + video sink + preview watched {w['fps']:.0f} fps "
              f"({100 * r['throughput_change']:+.1f} %) p99 {w['p99_ms']:.1f} ms drops {w['dropped']} "
              f"{w['cpu_cores']:.2f} cores, sink dropped {w['sink_frames_dropped']}")
    return rows


def naive_fps(bundle: Path, seconds: float = 5.0) -> float:
    """OpenCV preprocessing on the CPU + one session.run per frame, numpy in and out."""
    import cv2
    import onnxruntime as ort

    from jetpipe import bundle as bundle_io
    from jetpipe.frames import from_bgr
    from jetpipe.preprocess import preprocess_bgr
    from jetpipe.spec import PreprocessSpec
    from jetpipe.synth import render_text_image

    manifest = bundle_io.read_manifest(bundle)
    spec, size = PreprocessSpec.from_dict(manifest["preprocess"]), tuple(manifest["input_size"])
    session = ort.InferenceSession(str(bundle / "model.onnx"),
                                   providers=[("CUDAExecutionProvider", {"use_tf32": "0"})])
    name = session.get_inputs()[0].name
    frames = [from_bgr(render_text_image(i, (1080, 1920)).bgr, "nv12") for i in range(4)]
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        bgr = cv2.cvtColor(frames[count % 4], cv2.COLOR_YUV2BGR_NV12)
        x, _ = preprocess_bgr(bgr, size, spec)
        session.run(None, {name: x[None]})
        count += 1
    return count / (time.perf_counter() - start)


def p3(args) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, bundle in make_bundles(Path(tmp)).items():

            engine = _engine_only(bundle)
            row = {"model": name, "streams": args.streams, "batch": BATCH, "engine_only_fps": engine,
                   "naive_fps": naive_fps(bundle), "batch_period_ms": 1000 * BATCH / (30 * args.streams)}
            best = max(engine.values())
            for where in ("cpu", "gpu"):
                realtime = serve(bundle, args.streams, 30, args.seconds, postprocess=where)
                saturated = serve(bundle, args.streams, args.saturate_fps, args.seconds, postprocess=where,
                                  still=True)
                row[where] = {"realtime": _brief(realtime), "saturated": _brief(saturated)}
                row[where]["saturated_vs_engine"] = row[where]["saturated"]["fps"] / best
                row[where]["saturated_vs_naive"] = row[where]["saturated"]["fps"] / row["naive_fps"]
                print(json.dumps({"model": name, "postprocess": where, **row[where]}), flush=True)
            rows.append(row)
    for r in rows:
        print(f"{r['model']}: engine-only {r['engine_only_fps']['plain']:.0f} fps "
              f"({r['engine_only_fps']['cuda_graph']:.0f} with CUDA graphs), naive {r['naive_fps']:.1f} fps")
        for where in ("cpu", "gpu"):
            rt, sat = r[where]["realtime"], r[where]["saturated"]
            print(f"  postprocess {where}: real time {rt['fps']:.0f} fps (offered {30 * r['streams']}), "
                  f"p50 {rt['p50_ms']:.1f} ms, p99 {rt['p99_ms']:.1f} ms (2 batch periods = "
                  f"{2 * r['batch_period_ms']:.0f} ms), drops {rt['dropped']}, {rt['cpu_cores']:.2f} cores; "
                  f"saturated {sat['fps']:.0f} fps = {100 * r[where]['saturated_vs_engine']:.0f} % of engine-only, "
                  f"{r[where]['saturated_vs_naive']:.1f}x naive, {sat['d2h_bytes_per_frame']} B/frame to the host, "
                  f"{sat['cpu_cores']:.2f} cores, threads {sat['cpu_seconds']}, GPU ms/batch {sat['gpu_stage_ms']}")
    return rows


def busy_head(model: Path, objects: int, out: Path, seed: int = 0) -> Path:
    """An Ultralytics export with `objects` anchors a frame scored 0.57-0.999 (see the module's doc)."""
    import ast

    import numpy as np
    import onnx
    from onnx import numpy_helper

    from jetpipe.tasks.detection_yolo import anchor_points

    graph_model = onnx.load(str(model))
    meta = {p.key: p.value for p in graph_model.metadata_props}
    classes, imgsz = len(ast.literal_eval(meta["names"])), ast.literal_eval(meta["imgsz"])
    producer = {name: node for node in graph_model.graph.node for name in node.output}
    final = producer[graph_model.graph.output[0].name]  # Concat(boxes, Sigmoid(class logits), extra rows)
    sigmoids = [producer[i] for i in final.input if i in producer and producer[i].op_type == "Sigmoid"] or \
        [n for n in graph_model.graph.node if n.op_type == "Sigmoid" and n.input[0] in producer and
         producer[n.input[0]].op_type == "Concat"]  # end-to-end (YOLOv10, YOLO26): the scores a top-K reads
    sigmoid = sigmoids[-1]
    rng = np.random.default_rng(seed)
    anchors = anchor_points(imgsz)
    offsets = np.zeros((1, classes, anchors), np.float32)
    chosen = rng.choice(anchors, objects, replace=False)
    offsets[0, rng.integers(0, classes, objects), chosen] = 12 + rng.uniform(0, 4, objects)
    graph_model.graph.initializer.append(numpy_helper.from_array(offsets, "busy_offsets"))
    at = list(graph_model.graph.node).index(sigmoid)  # nodes stay in topological order
    graph_model.graph.node.insert(at, onnx.helper.make_node("Add", [sigmoid.input[0], "busy_offsets"], ["busy_logits"]))
    sigmoid.input[0] = "busy_logits"
    if len(graph_model.graph.output) == 2:  # a -seg export: blobs added to its (flat) prototypes, so masks have shapes
        protos = graph_model.graph.output[1].name
        producer[protos].output[0] = "busy_protos"
        side = imgsz[0] // 4 // 16, imgsz[1] // 4 // 16
        blobs = np.kron(rng.normal(0, 3, (1, 32, *side)), np.ones((16, 16))).astype(np.float32)
        graph_model.graph.initializer.append(numpy_helper.from_array(blobs, "busy_blobs"))
        graph_model.graph.node.append(onnx.helper.make_node("Add", ["busy_protos", "busy_blobs"], [protos]))
    onnx.save(graph_model, str(out))
    return out


def _convert(model: Path, out: Path) -> Path:
    import subprocess

    subprocess.run([sys.executable, "-m", "jetpipe", "convert", str(model), "-o", str(out), "--max-batch",
                    str(BATCH), "--engine", "never"], check=True, cwd=root)
    return out


def _same_records(bundle: Path) -> dict:
    """One batch of 8 synthetic frames through the GPU runtime twice: the model's outputs finished on the CPU,
    and the task's reduction finished from its compact arrays; objects per frame and whether they agree."""
    import numpy as np

    from jetpipe import bundle as bundle_io
    from jetpipe.runtime.api import Frame
    from jetpipe.runtime.gpu_runtime import GpuRuntime
    from jetpipe.synth import render_text_image
    from jetpipe.tasks import for_bundle

    task, options = for_bundle(bundle_io.read_manifest(bundle))
    post = task.postprocessor(options)
    frames = [Frame(render_text_image(i, (1080, 1920)).bgr, "bgr") for i in range(BATCH)]
    with GpuRuntime(bundle, max_batch=BATCH) as rt:
        raw = rt.infer(frames)
        cpu = post(raw.outputs, raw.letterboxes, [(1080, 1920)] * BATCH)
    objects = [len(r.get("boxes", r.get("regions", []))) for r in cpu]
    reduction = post.reduction(required=True)
    if reduction is None:  # an end-to-end detector: its output is compact already, both paths finish it alike
        return {"task": task.name, "objects_per_frame": objects, "gpu_equals_cpu": None}
    with GpuRuntime(bundle, max_batch=BATCH, reduction=reduction) as rt:
        reduced = rt.infer(frames)
        gpu = post.reduced(reduced.outputs, reduced.letterboxes, [(1080, 1920)] * BATCH)
    if "boxes" in cpu[0]:
        same = all(len(g["boxes"]) == len(c["boxes"]) and (not c["boxes"] or np.allclose(g["boxes"], c["boxes"],
                                                                                           atol=0.5))
                   for g, c in zip(gpu, cpu))
    else:  # semantic: the shares and every region's outline
        same = gpu == cpu
    return {"task": task.name, "objects_per_frame": objects, "gpu_equals_cpu": bool(same)}


def heads(args) -> list[dict]:
    from jetpipe import bundle as bundle_io

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for given in map(Path, args.models):
            model = given
            if _metadata(model).get("task") in ("segment", "pose", "detect") and args.objects:
                model = busy_head(model, args.objects, Path(tmp) / f"busy-{model.name}")
            bundle = _convert(model, Path(tmp) / f"b-{model.stem}")
            engine = _engine_only(bundle)
            row = {"model": given.name, "input": bundle_io.read_manifest(bundle)["input_size"],
                   "engine_only_fps": engine, **_same_records(bundle)}
            best = max(engine.values())
            for where in args.postprocess:
                saturated = _brief(serve(bundle, args.streams, args.saturate_fps, args.seconds, postprocess=where,
                                         still=True))
                row[where] = {**saturated, "vs_engine": saturated["fps"] / best}
            print(json.dumps(row), flush=True)
            rows.append(row)
    for r in rows:
        print(f"{r['model']} ({r['task']}, {r['input'][0]}x{r['input'][1]}): engine-only "
              f"{r['engine_only_fps']['plain']:.0f} fps ({r['engine_only_fps']['cuda_graph']:.0f} with CUDA graphs); "
              f"objects/frame {r['objects_per_frame']}; GPU == CPU records: {r['gpu_equals_cpu']}")
        for where in args.postprocess:
            x = r[where]
            print(f"  postprocess {where}: saturated {x['fps']:.0f} fps = {100 * x['vs_engine']:.0f} % of engine-only, "
                  f"{x['d2h_bytes_per_frame']} B/frame to the host, {x['cpu_cores']:.2f} cores, "
                  f"GPU ms/batch {x['gpu_stage_ms']}")
    return rows


def _engine_only(bundle: Path) -> dict:
    """Frames/s of the bundle's model alone at batch BATCH, plain and replayed from a CUDA graph."""
    from jetpipe import bundle as bundle_io

    sample, model = (3, *bundle_io.read_manifest(bundle)["input_size"]), str(bundle / "model.onnx")
    return {"plain": BATCH * 1000 / bare_backend(model, sample, BATCH, 200),
            "cuda_graph": BATCH * 1000 / bare_backend(model, sample, BATCH, 200, cuda_graph=True)}


def _metadata(model: Path) -> dict:
    import onnx

    return {p.key: p.value for p in onnx.load(str(model), load_external_data=False).metadata_props}


def _brief(summary: dict) -> dict:
    total = summary["latency_ms"]["total"]
    return {"fps": summary["throughput_fps"], "p50_ms": total.get("0.5"), "p99_ms": total.get("0.99"),
            "processed": sum(summary["processed"]), "dropped": sum(summary["dropped"]),
            "failed": sum(summary["failed"]), "seconds": summary["seconds"],
            **{k: summary.get(k) for k in ("postprocess", "d2h_bytes_per_frame", "cpu_cores", "cpu_seconds",
                                           "gpu_stage_ms", "gpu_busy_share", "post_thread_ms_per_batch")},
            "stage_latency_ms": {k: v.get("0.5") for k, v in summary["latency_ms"].items()}}


def soak(args) -> dict:
    samples = []

    def sample(pipeline):
        start = time.monotonic()
        while not pipeline.stop_event.is_set():
            free = pipeline.runtime.gpu_free_memory()
            rss = int(open(f"/proc/{os.getpid()}/statm").read().split()[1]) * resource.getpagesize()
            samples.append({"t": round(time.monotonic() - start, 1), "gpu_free": free, "rss": rss,
                            "processed": sum(pipeline.metrics.processed)})
            pipeline.stop_event.wait(10)

    with tempfile.TemporaryDirectory() as tmp:
        bundle = next(iter(make_bundles(Path(tmp), resnet=False).values()))
        summary = serve(bundle, args.streams, 30, args.seconds, sample=sample)
    after = [s for s in samples if s["t"] >= 60]  # after warm-up
    result = {"streams": args.streams, "seconds": args.seconds, "summary": _brief(summary), "samples": samples,
              "gpu_free_change_after_warmup": (after[-1]["gpu_free"] - after[0]["gpu_free"]) if after else None,
              "rss_change_after_warmup": (after[-1]["rss"] - after[0]["rss"]) if after else None,
              "rss_max_minus_min_after_warmup": (max(s["rss"] for s in after) - min(s["rss"] for s in after))
              if after else None}
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}))
    for s in samples:
        print(f"t={s['t']:>6} s  free GPU {s['gpu_free'] / 2**20:10.1f} MiB  RSS {s['rss'] / 2**20:8.1f} MiB  "
              f"processed {s['processed']}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    a = sub.add_parser("p3")
    a.add_argument("--streams", type=int, default=8)
    a.add_argument("--seconds", type=float, default=20)
    a.add_argument("--saturate-fps", type=float, default=0, help=SATURATE_HELP)
    b = sub.add_parser("soak")
    b.add_argument("--streams", type=int, default=8)
    b.add_argument("--seconds", type=float, default=570)
    c = sub.add_parser("see")
    c.add_argument("--streams", type=int, default=8)
    c.add_argument("--seconds", type=float, default=20)
    c.add_argument("--saturate-fps", type=float, default=0, help=SATURATE_HELP)
    c.add_argument("--video", action="store_true",
                   help="real encoded 1080p30 H.264 files (NVDEC where installed) instead of the synthetic camera")
    d = sub.add_parser("heads")
    d.add_argument("models", nargs="+", help="ONNX exports (Ultralytics -seg / -pose, torchvision segmentation)")
    d.add_argument("--objects", type=int, default=30, help="boxes a frame on random-weight Ultralytics exports")
    d.add_argument("--streams", type=int, default=8)
    d.add_argument("--seconds", type=float, default=15)
    d.add_argument("--saturate-fps", type=float, default=0, help=SATURATE_HELP)
    d.add_argument("--postprocess", nargs="+", choices=("cpu", "gpu"), default=("cpu", "gpu"),
                   help="where the saturated runs finish the model's outputs (default both)")
    for p in (a, b, c, d):
        p.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = {"p3": p3, "soak": soak, "see": see, "heads": heads}[args.what](args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
