#!/usr/bin/env python3
"""The OCR chain users run — PP-OCRv4 det -> rec through `jetpipe serve` with a secondary stage — side by
side with RapidOCR (its det + cls + rec on the CPU, a process per core) on the same video, in one run.

  python scripts/bench_ocr.py [--streams 8] [--seconds 20 | --once] [--frames 60] [--decoder nvdec] [--scene words]
                              [--size 1920x1080] [--fonts default|several]
                              [--det-model DET.onnx --rec-model REC.onnx] [--secondary-priority high,normal]
                              [--json out.json]

The detector reads each frame at `--det-size` (default 736x1312, the size RapidOCR's detector reads a 1080p
frame at). The video is made at run time: `--frames` images of rendered words, `--size` (default 1920x1080;
seeds from 50,000: none of the calibration or test images; the default PIL font, or with `--fonts several`
eight typefaces, one at random a word; sizes from 1/40 to 1/9 of the height, 4 to 14 words a frame, random
backgrounds and colours), encoded as 30 fps H.264 by ffmpeg, each frame's words kept as ground truth.
jetpipe: the clip loops in `--streams` streams offered as fast as they go (saturated, every frame processed),
FP32 bundles (`--precision` for the detector and recognizer), the GPU runtime where there is one, NVDEC
where the decoder allows. RapidOCR: the clip's frames decoded once (PyAV), then read by `--peer-workers`
processes (default: every core) with one ONNX Runtime thread each, each frame once. Word recall: the share of
each frame's rendered words found among the words read in it, over all frames read (every processed frame
counted once). Then the secondary stage alone on the GPU: a batch of text-line crops cut from a frame in
device memory, the crop kernel's time beside the recognizer's (CUDA events, median of 50 runs).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root)]

FIRST_SEED = 50_000  # rendered frames no calibration or test set uses
SIZE_HW = (1080, 1920)


def render(seed: int, scene: str, size_hw=SIZE_HW, fonts=None):
    """One frame of the scene: `words` (upright words), `tilted` (lines of one or two words turned 8-25
    degrees either way), `lines` (upright lines of four to seven words: wider than 320 / 48). fonts: the
    typefaces words are drawn in (default: Pillow's built-in)."""
    from jetpipe.synth import render_text_image, render_tilted_words

    if scene == "tilted":
        return render_tilted_words(seed, size_hw, count=10, fonts=fonts)
    if scene == "lines":
        return render_tilted_words(seed, size_hw, count=8, degrees=(0, 0), words=(4, 7), fonts=fonts)
    return render_text_image(seed, size_hw, max_words=14, fonts=fonts)


def make_video(folder: Path, frames: int, scene: str = "words", size_hw=SIZE_HW,
               fonts=None) -> tuple[Path, list[list[str]]]:
    path = folder / f"text-{size_hw[0]}p30.mp4"
    encoder = subprocess.Popen(["ffmpeg", "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "bgr24", "-s",
                                f"{size_hw[1]}x{size_hw[0]}", "-r", "30", "-i", "pipe:0", "-c:v", "libx264", "-preset",
                                "veryfast", "-crf", "18", "-pix_fmt", "yuv420p", str(path)], stdin=subprocess.PIPE)
    words = []
    for i in range(frames):
        image = render(FIRST_SEED + i, scene, size_hw, fonts)
        encoder.stdin.write(image.bgr.tobytes())
        words.append(image.words)
    encoder.stdin.close()
    if encoder.wait() != 0:
        raise SystemExit("ffmpeg could not encode the benchmark video")
    return path, words


def recall(truth: list[str], texts) -> tuple[int, int]:
    """(rendered words found among the words read, rendered words) of one frame."""
    read = {word for text in texts if text for word in text.split()}
    rendered = {word for line in truth for word in line.split()}  # a rendered line's words, one by one
    return len(rendered & read), len(rendered)


def convert_bundles(folder: Path, precision: str, det_size: tuple[int, int], rec_batch: int,
                    rec_range: bool = True, sources: dict | None = None) -> tuple[Path, Path]:
    """sources: {"ppocr-det": path, "ppocr-rec": path} of other exports of the same kind (another PP-OCR
    generation) to convert instead of the built-in models, with the built-ins' preprocessing and sizes."""
    from jetpipe.convert import ConvertOptions, convert
    from jetpipe.models import BUILTIN
    from jetpipe.spec import preset

    out = []
    for name in ("ppocr-det", "ppocr-rec"):
        model = BUILTIN[name]
        path = (sources or {}).get(name) or model.path()
        bundle = folder / name
        if (bundle / "manifest.json").exists():  # --bundles: converted by an earlier run
            out.append(bundle)
            continue
        calib = "synthetic" if precision == "int8" else None
        size = det_size if name == "ppocr-det" else model.input_size
        convert(ConvertOptions(model=path, output=bundle, precision=precision, calib=calib,
                               input_size=size, input_width_range=model.width_range if rec_range else None,
                               max_batch=8 if name == "ppocr-det" else rec_batch,
                               spec=preset(model.preset), task=model.task, engine="never", progress=False))
        out.append(bundle)
    return out[0], out[1]


def run_jetpipe(args, det: Path, rec: Path, video: Path, words: list[list[str]], priority: str = "high") -> dict:
    from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
    from jetpipe.pipelines.core.secondary import SecondaryConfig
    from jetpipe.pipelines.service.daemon import Pipeline

    found = [0, 0]

    def count(record):
        if record.type is not None:  # an event's record: no frame read
            return
        texts = [e["text"] if e else None for e in record.detections.secondary["rec"]]
        hit, total = recall(words[record.frame % len(words)], texts)
        found[0], found[1] = found[0] + hit, found[1] + total

    config = validate(PipelineConfig(
        bundle=det, sources=[SourceConfig(str(video), loop=not args.once, realtime=args.realtime, decoder=args.decoder)
                             for _ in range(args.streams)],
        secondaries=[SecondaryConfig(rec, name="rec", max_per_frame=32, priority=priority)],
        duration=0.0 if args.once else args.seconds,
        metrics_listen="",
        log_every_s=1e9, backend=args.backend, batch_timeout_ms=5.0))
    cpu_before = time.process_time()
    summary = Pipeline(config, on_result=count).run()
    processed = sum(summary["processed"])
    return {"frames": processed, "dropped": sum(summary["dropped"]), "fps": summary["throughput_fps"],
            "seconds": summary["seconds"],
            "cpu_ms_per_frame": round(1e3 * (time.process_time() - cpu_before) / max(1, processed), 2),
            "cpu_cores": summary["cpu_cores"], "word_recall": round(found[0] / max(1, found[1]), 4),
            "words": found[1], "backend": summary["backend"], "postprocess": summary["postprocess"],
            "latency_ms": summary["latency_ms"]["total"], "secondary": summary["secondary"]["rec"],
            "batches": summary["batches"], "post_thread_ms_per_batch": summary["post_thread_ms_per_batch"],
            "secondary_thread_ms_per_batch": summary.get("secondary_thread_ms_per_batch"),
            "secondary_reads": summary.get("secondary_reads"),
            "secondary_held_primary_s": summary.get("secondary_held_primary_s"),
            "thread_cpu_s": summary["cpu_seconds"]}


_ENGINE = None


def _peer_read(index_and_frame):
    global _ENGINE
    if _ENGINE is None:
        from rapidocr_onnxruntime import RapidOCR

        _ENGINE = RapidOCR(intra_op_num_threads=1, inter_op_num_threads=1)
    index, frame = index_and_frame
    result, _ = _ENGINE(frame)
    return index, [text for _, text, _ in (result or [])]


def run_rapidocr(args, video: Path, words: list[list[str]]) -> dict:
    import multiprocessing

    import av

    with av.open(str(video)) as container:
        frames = [f.to_ndarray(format="bgr24") for f in container.decode(video=0)]
    jobs = [(i % len(frames), frames[i % len(frames)]) for i in range(args.peer_frames)]
    workers = args.peer_workers or os.cpu_count()
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pool.map(_peer_read, jobs[:workers], chunksize=1)  # models loaded in every worker before timing
        start = time.monotonic()
        results = pool.map(_peer_read, jobs, chunksize=1)
        seconds = time.monotonic() - start
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (children.ru_utime + children.ru_stime) - (children_before.ru_utime + children_before.ru_stime)
    hits = [recall(words[i], texts) for i, texts in results]
    total = sum(t for _, t in hits)
    return {"frames": len(jobs), "fps": round(len(jobs) / seconds, 2), "seconds": round(seconds, 2),
            "workers": workers, "cpu_ms_per_frame_incl_warmup": round(1e3 * cpu / len(jobs), 1),
            "word_recall": round(sum(h for h, _ in hits) / max(1, total), 4), "words": total}


def crop_costs(rec: Path, batch: int = 8, size_hw=SIZE_HW) -> dict | None:
    """The secondary stage alone on the GPU: `batch` text-line crops of a device frame, kernel vs recognizer."""
    import numpy as np

    from jetpipe.frames import from_bgr
    from jetpipe.runtime.api import Frame
    from jetpipe.runtime.gpu_runtime import GpuRuntime
    from jetpipe.synth import render_text_image

    try:
        runtime = GpuRuntime(rec, batch, memory="staged", profile=True, buffer_sets=2)
    except Exception as exc:  # no GPU runtime here
        return {"skipped": str(exc)[:200]}
    image = render_text_image(FIRST_SEED, size_hw, max_words=14)
    frame = from_bgr(image.bgr, "nv12")
    boxes = [tuple(int(v) for v in box) for box in image.boxes]
    frames = [Frame(frame, "nv12", crop=boxes[i % len(boxes)]) for i in range(batch)]
    times = {"preprocess": [], "infer": []}
    try:
        for i in range(60):
            ticket = runtime.submit(frames)
            runtime.collect(ticket)
            if i >= 10:
                stages = runtime.stage_times(ticket)
                for key in times:
                    times[key].append(stages[key])
    finally:
        runtime.close()
    median = {k: round(float(np.median(v)), 4) for k, v in times.items()}
    return {"batch": batch, "crop_kernel_ms": median["preprocess"], "recognizer_ms": median["infer"],
            "crop_share": round(median["preprocess"] / median["infer"], 4)}


def frame_size(text: str) -> tuple[int, int]:
    """An argument type: WxH -> (H, W), even sides (H.264 4:2:0) from 64 to 4096."""
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: WxH, e.g. 1280x720") from None
    if not (64 <= width <= 4096 and 64 <= height <= 4096) or width % 2 or height % 2:
        raise argparse.ArgumentTypeError(f"{text}: even sides from 64 to 4096")
    return height, width


def comma_list(*allowed: str):
    """An argument type: a comma-separated list of some of `allowed`."""
    said = f"{', '.join(allowed[:-1])} or {allowed[-1]}"

    def parse(text: str) -> list[str]:
        chosen = text.split(",")
        for value in chosen:
            if value not in allowed:
                raise argparse.ArgumentTypeError(f"{value}: {said}")
        return chosen
    return parse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--frames", type=int, default=60, help="distinct rendered frames in the clip")
    parser.add_argument("--decoder", default="auto")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--precision", default="fp32", type=comma_list("fp32", "fp16", "int8"),
                        help="fp32, fp16 or int8 for the detector and recognizer; several, comma-separated, are run "
                        "one after the other on the same video (with --once: the same frames), e.g. fp32,int8")
    parser.add_argument("--once", action="store_true", help="each stream plays the clip once (every frame read "
                        "once, the run ends there) instead of looping for --seconds")
    parser.add_argument("--det-size", default="736x1312", help="the detector's input HxW (RapidOCR reads a 1080p "
                        "frame at 736 x 1308: its det_limit_side_len 736, limit_type min)")
    parser.add_argument("--rec-batch", type=int, default=32, help="the recognizer bundle's max batch (crops a run)")
    parser.add_argument("--realtime", action="store_true", help="pace each stream at 30 fps (drops, latency)")
    parser.add_argument("--peer-workers", type=int, default=0, help="RapidOCR processes (default: every core)")
    parser.add_argument("--peer-frames", type=int, default=64, help="frames RapidOCR reads")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--rec-width", default="range", choices=("range", "fixed"),
                        help="the recognizer at its width range (batches at 320, 640, 960) or fixed at 320")
    parser.add_argument("--scene", default="words", choices=("words", "tilted", "lines"),
                        help="what the frames show: upright words, tilted lines, long lines")
    parser.add_argument("--size", default=SIZE_HW, type=frame_size,
                        help="the video's frame size WxH (default 1920x1080; issue 25's accuracy: 1280x720)")
    parser.add_argument("--fonts", default="default", choices=("default", "several"),
                        help="the words' typefaces: Pillow's built-in, or several (jetpipe.synth.SEVERAL_FONTS: "
                        "sans, serif, mono; regular, bold, italic), one at random a word")
    parser.add_argument("--det-model", type=Path, help="another text detector export (e.g. PP-OCRv3's) instead of "
                        "the built-in PP-OCRv4 det")
    parser.add_argument("--rec-model", type=Path, help="another recognizer export (48 high, its alphabet in its "
                        "metadata) instead of the built-in PP-OCRv4 rec")
    parser.add_argument("--secondary-priority", default=["high"], type=comma_list("high", "normal"),
                        help="the recognizer's stream priority (default high, serve's), or several side by side "
                             "in this run: high,normal")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--bundles", type=Path, help="keep the converted bundles here and reuse them in later runs "
                        "(default: converted again in a temporary folder)")
    args = parser.parse_args()
    from jetpipe.synth import several_fonts

    fonts = several_fonts() if args.fonts == "several" else None
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        video, words = make_video(folder, args.frames, args.scene, args.size, fonts)
        report = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "streams": args.streams,
                  "frame_size": f"{args.size[1]}x{args.size[0]}", "fonts": args.fonts,
                  "words_per_frame": round(sum(map(len, words)) / len(words), 1)}
        for precision in args.precision:
            kept = f"{precision}-{args.det_size}-b{args.rec_batch}-{args.rec_width}"  # what the bundles depend on
            kept += "".join(f"-{m.stem}" for m in (args.det_model, args.rec_model) if m is not None)
            det, rec = convert_bundles((args.bundles or folder) / kept, precision,
                                       tuple(int(v) for v in args.det_size.split("x")), args.rec_batch,
                                       rec_range=args.rec_width == "range",
                                       sources={"ppocr-det": args.det_model, "ppocr-rec": args.rec_model})
            for priority in args.secondary_priority:
                key = "jetpipe" + ("" if precision == args.precision[0] else f"_{precision}") \
                    + ("" if priority == args.secondary_priority[0] else f"_priority_{priority}")
                report[key] = run_jetpipe(args, det, rec, video, words, priority)
                report[key].update(precision=precision, secondary_priority=priority)
                print(json.dumps({key: report[key]}), flush=True)
        if not args.no_peer:
            report["rapidocr"] = run_rapidocr(args, video, words)
            print(json.dumps({"rapidocr": report["rapidocr"]}), flush=True)
        report["secondary_alone"] = crop_costs(rec, size_hw=args.size)
        print(json.dumps({"secondary_alone": report["secondary_alone"]}), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
