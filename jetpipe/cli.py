"""`jetpipe convert | inspect | doctor | serve | demo | calibrate | export`.

User mistakes (JetpipeError) print one line and exit 2; Ctrl-C exits 130 and
SIGTERM 143, both with nothing half-written (`serve` handles both itself, to
drain); --debug shows tracebacks.
"""

from __future__ import annotations

import argparse
import errno
import logging
import math
import os
import signal
import sys
from pathlib import Path

from jetpipe import __version__, bundle, output_folders
from jetpipe.calibration.accuracy import AccuracyOptions, run_accuracy
from jetpipe.calibration.latency import LatencyOptions, run_latency
from jetpipe.calibration.search import excluded_from_report
from jetpipe.calibration.tracking import TrackingOptions, run_tracking
from jetpipe.calibration.tracking_scenes import SCENES
from jetpipe.cli_values import (
    parse_batches,
    parse_channel_values,
    parse_input_size,
    parse_size,
    parse_targets,
    positive_seconds,
    read_labels,
)
from jetpipe.convert import ConvertOptions, convert
from jetpipe.convert.chain import ENGINE_MODES, PRECISIONS
from jetpipe.convert.prune import ALLOCATIONS
from jetpipe.convert.prune import METHODS as PRUNE_METHODS
from jetpipe.convert.stats import METHODS
from jetpipe.doctor import run_doctor
from jetpipe.errors import JetpipeError
from jetpipe.export import triton
from jetpipe.models import BUILTIN, resolve
from jetpipe.pipelines.amounts import say_bytes
from jetpipe.pipelines.config import POSTPROCESS_PLACES, ConfigError, PipelineConfig, SourceConfig, read, validate
from jetpipe.pipelines.core.events import rules
from jetpipe.pipelines.core.secondary import SecondaryConfig
from jetpipe.pipelines.core.tracking import TRACKERS
from jetpipe.pipelines.ingest.sources import DECODERS
from jetpipe.pipelines.outputs.recording import export as recording_export
from jetpipe.pipelines.service.serve import SummaryFile, demo, serve
from jetpipe.report import print_summary
from jetpipe.runtime.cuda import MEMORY_MODES
from jetpipe.runtime.open import BACKEND_HELP, check_backend
from jetpipe.runtime.trt_builder import ENGINE_FAMILIES, RTX_DEFAULT_TARGETS, RTX_TARGETS
from jetpipe.spec import CHANNEL_ORDERS, PRESETS, RESIZE_MODES, preset
from jetpipe.tasks import TASKS


def _backend(value: str) -> str:
    """--backend: a name, or triton://HOST:PORT/NAME (argparse prints the reason, exit 2)."""
    try:
        return check_backend(value)
    except JetpipeError as exc:
        reason = str(exc).removeprefix(f"backend {value!r}: ")
        raise argparse.ArgumentTypeError(f"invalid choice: {value!r} ({reason})") from None


def _count_or_auto(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: a count, e.g. 1, or auto") from None


def _add_convert(sub) -> None:
    p = sub.add_parser("convert", help="ONNX -> FP16/INT8 -> TensorRT engine bundle",
                       description="Convert an ONNX model (or a built-in model name, e.g. ppocr-det) "
                                   "into a bundle folder.")
    p.add_argument("model", help=f"path of an .onnx file, or a built-in model: {', '.join(BUILTIN)}")
    p.add_argument("-o", "--output", required=True, type=Path, help="bundle folder to write")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="fp16: float16 graph, float32 I/O; int8: explicit Q/DQ (needs --calib)")
    g = p.add_argument_group("calibration")
    g.add_argument("--calib", help="image folder, video file, .npy of N,C,H,W float32 inputs, "
                                   "or 'synthetic' (rendered text images)")
    g.add_argument("--calib-size", type=int, default=64, help="images to use (default 64)")
    g.add_argument("--calib-method", default="percentile", choices=METHODS,
                   help="INT8 range method (default percentile)")
    g.add_argument("--calib-batch", type=int, default=2, help="images per calibration run (memory)")
    g.add_argument("--calib-cache", type=Path, help="reuse calibration from a bundle or calibration.json")
    g.add_argument("--exclude", nargs="+", default=[], metavar="NODE",
                   help="nodes to keep in higher precision")
    g.add_argument("--no-auto-exclude", action="store_true",
                   help="INT8: do not keep measured sensitive layers in float")
    g.add_argument("--exclude-from", type=Path, metavar="REPORT",
                   help="keep the nodes a `jetpipe calibrate accuracy --budget` search chose in float")
    s = p.add_argument_group("input and preprocessing")
    s.add_argument("--max-batch", type=int, default=8, help="largest batch the bundle and engine take (1-256)")
    s.add_argument("--input-size", metavar="HxW", help="for models with dynamic height/width; HxMIN:OPT:MAX keeps "
                   "a dynamic width in that range (text recognizers; the engine's profile), e.g. 48x80:320:960")
    s.add_argument("--preset", choices=sorted(PRESETS), help="named preprocessing preset")
    s.add_argument("--scale", type=float, help="pixel scale before mean/std (default 1/255)")
    s.add_argument("--mean", help="R,G,B mean, after scaling (one value for a 1-channel gray network)")
    s.add_argument("--std", help="R,G,B std, after scaling (one value for a 1-channel gray network)")
    s.add_argument("--channel-order", choices=CHANNEL_ORDERS,
                   help="the network's input channel order (default rgb; gray: a 1-channel network fed the "
                        "luma, chosen by itself for 1-channel inputs)")
    s.add_argument("--resize", choices=RESIZE_MODES,
                   help="letterbox: keep the aspect ratio and pad around; stretch: fill; topleft: letterbox at the "
                        "top left, padded right and below (text lines) (default letterbox)")
    s.add_argument("--pad-value", type=float, help="letterbox pad, in pixel units")
    r = p.add_argument_group("pruning")
    r.add_argument("--prune", type=float, metavar="RATIO",
                   help="remove this share of the model's FLOPs by removing whole Conv channels (0 < RATIO < 1)")
    r.add_argument("--prune-method", choices=PRUNE_METHODS,
                   help="l1: weight L1 norm; reconstruct: choose channels on calibration activations, then refit "
                        "the following layers by least squares (needs --calib) (default: reconstruct with --calib, "
                        "l1 without)")
    r.add_argument("--prune-allocation", choices=ALLOCATIONS,
                   help="channels kept per group: the same share everywhere, or by measured sensitivity "
                        "(needs --calib; default for reconstruct)")
    r.add_argument("--prune-align", type=int, default=8, metavar="N",
                   help="kept channel counts are multiples of N (default 8: tensor-core friendly; 1: any)")
    r.add_argument("--prune-budget", type=float, default=15, metavar="MINUTES",
                   help="where measuring every group's sensitivity would take longer (estimated from the first "
                        "measurements), allocate uniformly instead and say so (default 15)")
    e = p.add_argument_group("engine")
    e.add_argument("--engine", default="auto", choices=ENGINE_MODES,
                   help="auto: build where TensorRT is installed; require: fail without it")
    e.add_argument("--engine-family", default="auto", choices=ENGINE_FAMILIES,
                   help="auto: TensorRT (Jetson, data-centre GPUs) where installed; tensorrt-rtx: "
                        "TensorRT-RTX for RTX GPUs, built ahead of time, even without a GPU")
    e.add_argument("--rtx-targets", default=",".join(RTX_DEFAULT_TARGETS), metavar="SM,...",
                   help=f"TensorRT-RTX: compute capabilities to build for, of {', '.join(RTX_TARGETS)} "
                        f"(default {','.join(RTX_DEFAULT_TARGETS)}: RTX 30/40/50)")
    e.add_argument("--workspace", type=int, metavar="MiB", help="builder workspace limit")
    e.add_argument("--timing-cache", type=Path, help="timing cache file (read and updated)")
    e.add_argument("--sparsity", choices=("2:4",),
                   help="prune eligible Conv/Gemm weights to 2:4 along input channels (TensorRT sparse "
                        "tensor cores); measure accuracy afterwards")
    e.add_argument("--dla", type=int, metavar="CORE", help="build for DLA core N (TensorRT 10.x)")
    t = p.add_argument_group("task (what the outputs mean)")
    t.add_argument("--task", choices=tuple(TASKS),
                   help="default: recognized from the outputs and the model's metadata (raw where none fits)")
    t.add_argument("--labels", type=Path, metavar="FILE",
                   help="class names, or a text recognizer's alphabet, one a line (default: the model's metadata: "
                        "Ultralytics names, PP-OCR character)")
    p.add_argument("--force", action="store_true", help="replace an existing bundle")
    p.add_argument("--force-synthetic", action="store_true",
                   help="INT8 with --calib synthetic for a model that does not read text (refused without it: "
                        "its ranges come from unlike data)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(run=_run_convert)


def _convert_options(args):
    model_path, builtin = resolve(args.model)
    spec = preset(args.preset or (builtin.preset if builtin else "none"))
    mean = parse_channel_values(args.mean, "mean") if args.mean else None
    std = parse_channel_values(args.std, "std") if args.std else None
    single = [len(v) == 1 for v in (mean, std) if v is not None]
    order = args.channel_order or ("gray" if single and all(single) else None)  # one value: a gray network
    spec = spec.replace(scale=args.scale, channel_order=order, resize=args.resize, pad_value=args.pad_value,
                        mean=mean, std=std)
    size, widths = parse_input_size(args.input_size) if args.input_size else \
        ((builtin.input_size, builtin.width_range) if builtin else (None, None))
    exclude, auto_exclude = tuple(args.exclude), not args.no_auto_exclude
    if args.exclude_from:
        # the report lists everything to keep in float, measured sensitive layers included
        exclude, auto_exclude = exclude + tuple(excluded_from_report(args.exclude_from)), False
    return ConvertOptions(
        model=model_path, output=args.output, precision=args.precision, calib=args.calib,
        calib_size=args.calib_size, calib_method=args.calib_method, calib_batch=args.calib_batch,
        calib_cache=args.calib_cache, max_batch=args.max_batch, input_size=size, input_width_range=widths, spec=spec,
        exclude=exclude, auto_exclude=auto_exclude, engine=args.engine, prune=args.prune,
        engine_family=args.engine_family, rtx_targets=parse_targets(args.rtx_targets),
        prune_method=args.prune_method, prune_allocation=args.prune_allocation, prune_align=args.prune_align,
        prune_budget_min=args.prune_budget,
        workspace_mb=args.workspace, timing_cache=args.timing_cache, sparsity=args.sparsity,
        dla_core=args.dla, force=args.force, force_synthetic=args.force_synthetic,
        task=args.task or (builtin.task if builtin else None),
        labels=read_labels(args.labels) if args.labels else (builtin.labels if builtin else None),
        progress=not args.quiet)


def _run_convert(args) -> int:
    manifest = convert(_convert_options(args))
    print_summary(args.output, manifest)
    return 0


def _add_inspect(sub) -> None:
    p = sub.add_parser("inspect", help="print a bundle's manifest and verify its hashes")
    p.add_argument("bundle", type=Path, help="bundle folder written by `jetpipe convert`")
    p.add_argument("--json", action="store_true", help="print the raw manifest")
    p.set_defaults(run=_run_inspect)


def _run_inspect(args) -> int:
    import json


    manifest = bundle.read_manifest(args.bundle)
    problems = bundle.verify(args.bundle)
    if args.json:
        print(json.dumps(manifest, indent=2))
    else:
        print_summary(args.bundle, manifest)
    if problems:
        for problem in problems:
            print(f"FAILED {problem}", file=sys.stderr)
        print(f"error: bundle {args.bundle} is damaged: rebuild it with `jetpipe convert`", file=sys.stderr)
        return 1
    # with --json, stdout is the manifest alone (for jq and friends)
    print(f"hashes: {len(manifest.get('files', {}))} files verified", file=sys.stderr if args.json else sys.stdout)
    return 0


def _add_doctor(sub) -> None:
    p = sub.add_parser("doctor", help="report what this machine can run")
    p.add_argument("--trt", action="store_true",
                   help="also build a tiny TensorRT engine and compare it with ONNX Runtime")
    p.set_defaults(run=_run_doctor)


def _run_doctor(args) -> int:
    return run_doctor(trt_selftest=args.trt)


def _add_serve(sub) -> None:
    p = sub.add_parser("serve", help="run the video-stream daemon",
                       description="Sources -> batched GPU inference -> postprocessing -> sinks. "
                                   "A CONFIG.toml, or flags (which also override the file).")
    p.add_argument("config", nargs="?", help="TOML config (see examples/jetpipe.toml)")
    p.add_argument("--bundle", help="bundle folder written by `jetpipe convert`")
    p.add_argument("--source", action="append", metavar="URI",
                   help="a video file or image folder (or file://PATH), v4l2:///dev/video0, csi://0, "
                        "rtsp://HOST/PATH, synthetic://WxH@FPS/FORMAT, gst:PIPELINE (repeatable)")
    p.add_argument("--loop", action="store_true", help="loop file sources")
    p.add_argument("--realtime", action="store_true",
                   help="pace file sources at their frame rate (like cameras: the oldest frame is dropped when "
                        "behind); default: every frame of a file is processed, as fast as it goes")
    p.add_argument("--decoder", choices=DECODERS, default="auto",
                   help="auto (default): NVDEC into GPU memory for video files with the GPU runtime "
                        "(jetpipe[nvdec]), GStreamer/nvv4l2decoder on a Jetson, else FFmpeg into raw YUV; "
                        "opencv: decode and convert to BGR on the CPU")
    p.add_argument("--hwaccel", metavar="TYPE", default="",
                   help="FFmpeg hardware decoding for video files on the FFmpeg path (cuda, qsv, ...: "
                        "'jetpipe doctor' lists this FFmpeg's): frames are decoded by the device and downloaded "
                        "as NV12; streams the hardware cannot decode fall back to software, said in the log")
    p.add_argument("--sink", action="append", metavar="SPEC",
                   help="jsonl:PATH[?append=1] (a new file; append=1: add to it), stdout, the brokers' "
                        "mqtt://HOST:PORT/TOPIC, kafka://HOST:PORT/TOPIC, redis://HOST:PORT[/DB][?stream=KEY] and "
                        "http(s)://HOST/PATH (a web hook; each at least once from a queue of its own: ?queue=N, "
                        "?drain=S, ?records=events|all), video:FILE.mp4[?width=W&fps=N&codec=hevc"
                        "&encoder=E] (results drawn on the frames; E: auto (nvv4l2h264enc on a Jetson, NVENC where "
                        "it works, else libx264), an FFmpeg encoder, or gst:ELEMENT), jpeg:FOLDER[?every=N]")
    p.add_argument("--max-batch", type=int, help="frames per GPU batch (default: the bundle's)")
    p.add_argument("--latency-budget-ms", type=float, metavar="MS",
                   help="capture to results: a batch is cut at the latest moment that keeps its oldest frame within "
                        "MS, from the measured engine time per batch size and frame arrival rate, and no larger than "
                        "a batch that runs within MS/2; a camera's frame older than MS is dropped (default 0: off, "
                        "batches wait for batch_timeout_ms)")
    p.add_argument("--capture-threads", type=int, metavar="N",
                   help="threads reading the streams that can share one (video files NVDEC decodes, synthetic "
                        "cameras), a frame each in turn; other streams get a thread each (default 0: half the "
                        "cores; N >= the streams: a thread each)")
    p.add_argument("--decode-processes", type=_count_or_auto, metavar="N|auto",
                   help="decode video files with NVDEC in N processes of their own, the frames written into this "
                        "process's GPU memory (CUDA IPC): for many streams into a light model, where decoding in "
                        "this process holds it below NVDEC's rate (0: decode here; default auto: one process where "
                        "8 or more NVDEC files could go faster than this process decodes, said in the log)")
    p.add_argument("--decode-threads", type=int, metavar="N",
                   help="with --decode-processes: decoding threads in each (default 0: a thread a stream, 4 at "
                        "most); each waiting thread costs CPU (NVIDIA's video library polls for its frame)")
    p.add_argument("--gpus", metavar="all|0,1,...",
                   help="serve on these GPUs: a worker process each, the streams placed by load (a [[source]]'s "
                        "gpu = N pins one), one metrics port and one set of sinks (default: GPU 0 alone)")
    p.add_argument("--workers-per-gpu", type=_count_or_auto, metavar="N|auto",
                   help="serving processes on each GPU, the streams placed across them: where one process's CPU, "
                        "not the GPU, is the limit (many busy cameras: the log's overload line says so); without "
                        "--gpus, on GPU 0 (default auto: 2 where CUDA MPS runs and 24 or more live streams share a "
                        "GPU, else 1, said in the log; without MPS, workers take turns on the GPU)")
    p.add_argument("--model-instances", type=_count_or_auto, metavar="N|auto",
                   help="copies of the model on the GPU, each running its own batches at once on a stream of its "
                        "own (ONNX Runtime's CUDA provider; each copy holds its own sessions' memory): a small "
                        "model near the GPU's rate runs more frames a second (auto: two where the streams offer "
                        "80 %% or more of the model's measured rate and the GPU has room, else one, said in the log; "
                        "default auto; 1 keeps one)")
    p.add_argument("--frames", type=int, help="stop each source after N frames")
    p.add_argument("--duration", type=float, help="stop after S seconds")
    p.add_argument("--backend", type=_backend, metavar="BACKEND",
                   help=f"inference backend: {BACKEND_HELP} (default auto: TensorRT > ORT CUDA > CPU)")
    p.add_argument("--memory", choices=MEMORY_MODES,
                   help="frame memory: mapped (zero copy), staged (pinned + async copy), device (default auto)")
    p.add_argument("--task", choices=tuple(TASKS), help="read the outputs as this task (default: the bundle's; "
                   "refused at start-up where the outputs do not fit it)")
    p.add_argument("--secondary", action="append", metavar="BUNDLE",
                   help="run this bundle on every box of the primary's results (repeatable): a text recognizer "
                        "reads each detected line; crops are cut from the frame where it is (GPU memory on the GPU "
                        "runtime); [[secondary]] tables in the config add classes, min_size, max_per_frame")
    p.add_argument("--direction", metavar="BUNDLE",
                   help="a direction classifier (classes 0 and 180: convert ppocr-cls) run on every --secondary's "
                        "crops first: those upside down are turned before the secondary reads them")
    p.add_argument("--tracker", choices=TRACKERS,
                   help="track detected boxes per stream: a track_id in every record (botsort: optimal "
                        "assignment, IDs kept through occlusion, memory in seconds of the frames' clock, the "
                        "default with rules; bytetrack: Kalman prediction, high- then low-score matching; "
                        "iou: overlap with the last box)")
    p.add_argument("--reid", metavar="BUNDLE|colour",
                   help="botsort tells objects apart by their looks too: an embedding model's bundle (a person "
                        "ReID network: convert MODEL --task embedding), or colour (a built-in colour histogram of "
                        "the crop); run on the crops that need it, where the frames are")
    p.add_argument("--reid-in-events", action="store_true", default=None,
                   help="an object's event carries its track's look (--reid's unit vector, float16 in base64): a "
                        "consumer matches objects across cameras by it")
    p.add_argument("--postprocess", choices=POSTPROCESS_PLACES,
                   help="where postprocessing runs: gpu (only compact results leave the GPU), cpu, or auto "
                        "(default: gpu with the GPU runtime)")
    p.add_argument("--zone", action="append", metavar="NAME:x1,y1,x2,y2,x3,y3[,...]",
                   help="a zone (a polygon in 0..1 coordinates of the frame): events when tracked objects enter and "
                        "leave it, with their dwell; [[zone]] tables in the config set streams, classes, anchor, "
                        "... (repeatable)")
    p.add_argument("--line", action="append", metavar="NAME:x1,y1,x2,y2",
                   help="a counting line (0..1 coordinates): an event each time a tracked object crosses it, 'in' "
                        "from its right-hand side to its left (walking from the first point to the second); [[line]] "
                        "tables set the rest (repeatable)")
    p.add_argument("--max-frame-size", metavar="HxW",
                   help="the largest frames any stream may bring, its buffers allocated at start-up (default: "
                        "1080x1920, grown to the largest video file among the sources; [pipeline] max_frame_hw)")
    p.add_argument("--clips", metavar="DIR",
                   help="an MP4 clip around each event (line_cross, zone_enter, loiter, occupancy) in DIR: the "
                        "stream's own packets from the keyframe before --clip-before seconds to --clip-after "
                        "seconds after, never re-encoded; from every source that demuxes (PyAV, NVDEC, ffmpeg, "
                        "GStreamer; not raw cameras); [clips] sets the rest")
    p.add_argument("--clip-before", type=float, metavar="S", help="seconds of a clip before its event (default 5)")
    p.add_argument("--clip-after", type=float, metavar="S", help="seconds of a clip after its event (default 5)")
    p.add_argument("--record", metavar="DIR",
                   help="record every stream's own packets (never re-encoded) into DIR as 10-s MP4 segments with "
                        "an index of them and of the events, clips and snapshots; kept within --record-max-size "
                        "(default 10GB) and --record-max-age, the oldest going first; [record] sets the rest")
    p.add_argument("--record-max-size", metavar="SIZE",
                   help="the recording's folder at most, e.g. 500MB or 50GB (segments, the index); never exceeded")
    p.add_argument("--record-max-age", metavar="DURATION",
                   help="recorded segments without events kept at most this long, e.g. 7d or 12h (default: as "
                        "long as the size allows)")
    p.add_argument("--record-mode", choices=("all", "events"),
                   help="all: everything (default); events: only the segments around events (the clips' before "
                        "and after seconds)")
    p.add_argument("--snapshots", metavar="DIR",
                   help="a JPEG of the frame of each event (line_cross, zone_enter, loiter, occupancy) in DIR, its "
                        "boxes outlined, encoded on the GPU (nvImageCodec) where it can be, else by OpenCV; "
                        "[snapshots] sets the rest")
    p.add_argument("--summary", metavar="PATH",
                   help="also write the run's summary (JSON) to PATH, a new file written when the run ends, or '-' "
                        "for stdout (it always goes to stderr too)")
    p.add_argument("--metrics", metavar="HOST:PORT",
                   help="Prometheus /metrics, /healthz and the live preview page / ('' disables)")
    p.add_argument("--control", action="store_true",
                   help="streams added and removed while serving: GET/POST/DELETE /streams on the metrics server "
                        "(a bearer token in $JETPIPE_CONTROL_TOKEN, required beyond 127.0.0.1)")
    p.add_argument("--max-streams", type=int, metavar="N",
                   help="with --control: streams served at once, their memory allocated at start-up (default: the "
                        "sources given)")
    p.add_argument("--control-allow", action="append", metavar="SCHEME",
                   help="with --control: callers may also start sources of this URI scheme (repeatable; default "
                        "csi, v4l2, rtsp, rtsps, synthetic; gst lets a caller run any GStreamer pipeline)")
    p.add_argument("--control-folder", action="append", metavar="DIR",
                   help="with --control: callers may start video files and image folders inside DIR "
                        "(repeatable; default: none)")
    p.add_argument("--metrics-host", action="append", metavar="NAME",
                   help="a host name clients reach the metrics server by, beyond localhost and this machine's "
                        "name (repeatable; '*': any, behind a proxy that checks it): other Host headers are "
                        "refused, so a web page cannot reach it by DNS rebinding")
    p.set_defaults(run=_run_serve)


def _run_serve(args) -> int:
    return serve(_serve_config(args), summary_to=SummaryFile(args.summary) if args.summary else None)


def _serve_config(args):
    """A config file, with flags overriding it, or flags alone."""

    if args.config:  # checked whole once the flags are in (validate below): they may complete it
        config = read(args.config, Path(args.bundle) if args.bundle else None)
    elif not args.bundle:
        raise ConfigError("pass a CONFIG.toml or --bundle DIR (with --source URI ...)")
    else:
        config = PipelineConfig(bundle=Path(args.bundle), sources=[])
    if args.bundle:
        config.bundle = Path(args.bundle)
    if args.source:
        config.sources = [SourceConfig(uri, loop=args.loop, realtime=args.realtime, decoder=args.decoder,
                                       hwaccel=args.hwaccel) for uri in args.source]
    if args.sink:
        config.sinks = list(args.sink)
    if args.secondary:
        direction = Path(args.direction) if args.direction else None
        config.secondaries = [SecondaryConfig(Path(b), direction=direction) for b in args.secondary]
    elif args.direction:
        raise JetpipeError("--direction turns the crops of a --secondary: add --secondary BUNDLE")
    for key in ("max_batch", "frames", "duration", "backend", "memory", "task", "postprocess", "tracker",
                "reid", "reid_in_events", "latency_budget_ms", "capture_threads", "decode_processes", "decode_threads",
                "gpus", "workers_per_gpu", "model_instances"):
        value = getattr(args, key)
        if value is not None:
            setattr(config, key, value)
    if args.frames == 0:  # in a config, frames = 0 is "no limit"; said on the command line it meant none (issue 49)
        raise ConfigError("--frames 0: give a count of 1 or more (leave --frames out to run until the sources end)")
    if args.metrics is not None:
        config.metrics_listen = args.metrics
    if args.control:
        config.control.enabled = True
    if args.max_streams is not None:
        if not (args.control or config.control.enabled):
            raise ConfigError("--max-streams is the control API's capacity: add --control")
        config.control.max_streams = args.max_streams
    if args.control_allow or args.control_folder:
        if not (args.control or config.control.enabled):
            raise ConfigError("--control-allow and --control-folder say what the control API may start: add --control")
        config.control.allow_schemes = [*config.control.allow_schemes, *(args.control_allow or [])]
        config.control.allow_folders = [*config.control.allow_folders, *(args.control_folder or [])]
    if args.metrics_host:
        config.metrics_hosts = [*config.metrics_hosts, *args.metrics_host]
    config.zones = [*config.zones, *(rules.from_flag(z, "zone") for z in args.zone or [])]
    config.lines = [*config.lines, *(rules.from_flag(line, "line") for line in args.line or [])]
    _evidence_flags(args, config)
    if args.max_frame_size:
        config.max_frame_hw, config.max_frame_set = parse_size(args.max_frame_size, "--max-frame-size"), True
    return validate(config, args.config or "flags")


def _evidence_flags(args, config) -> None:
    if args.snapshots:
        config.snapshots.folder = args.snapshots
    if args.clips:
        config.clips.folder = args.clips
    if args.record:
        config.record.folder = args.record
    for flag, key in (("record_max_size", "max_size"), ("record_max_age", "max_age"), ("record_mode", "mode")):
        value = getattr(args, flag)
        if value is not None:
            if not config.record.folder:
                raise ConfigError(f"--{flag.replace('_', '-')} sets the recording: add --record DIR")
            setattr(config.record, key, value)
    for flag, key in (("clip_before", "before_s"), ("clip_after", "after_s")):
        value = getattr(args, flag)
        if value is not None:
            if not config.clips.folder:
                raise ConfigError(f"--{flag.replace('_', '-')} is a clip's length: add --clips DIR")
            setattr(config.clips, key, value)


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="convert the built-in model and serve two synthetic cameras")
    p.add_argument("--duration", type=positive_seconds, default=10.0, help="seconds to serve")
    p.add_argument("--bundle-dir", default="bundles/demo-ppocr-det", help="where the converted model goes")
    p.add_argument("--sink", action="append", metavar="SPEC", help="also write results here")
    p.add_argument("--backend", type=_backend, metavar="BACKEND", help=f"inference backend: {BACKEND_HELP} "
                   "(default auto)")
    p.set_defaults(run=_run_demo)




def _run_demo(args) -> int:
    return demo(args.duration, args.bundle_dir, args.sink, args.backend)


def _add_calibrate(sub) -> None:
    p = sub.add_parser("calibrate", help="accuracy and latency reports for a bundle")
    what = p.add_subparsers(dest="what", required=True)
    a = what.add_parser("accuracy", help="bundle vs FP32 on real data; per-layer errors; precision search",
                        description="Compare a bundle with its FP32 reference on identical preprocessed inputs.")
    a.add_argument("bundle", type=Path, help="bundle folder to measure")
    a.add_argument("--data", required=True, help="image folder, video, .npy of N,C,H,W inputs, or 'synthetic'")
    a.add_argument("--reference", type=Path, help="FP32 model (default: the bundle's source model)")
    a.add_argument("--task", choices=tuple(TASKS), help="measure as this task, with its metrics (default: the "
                   "bundle's)")
    a.add_argument("--samples", type=int, default=32, help="inputs to use (default 32)")
    a.add_argument("--provider", choices=("cpu", "cuda"), default="cpu", help="ONNX Runtime provider")
    a.add_argument("--backend", type=_backend, metavar="BACKEND",
                   help="measure the bundle through this runtime, as serve runs it "
                   "(its engine, samples as NV12 frames through its preprocessing), instead of its ONNX graph; "
                   "per-layer errors and the precision search stay on the ONNX graph")
    a.add_argument("--budget", help="e.g. 'f1>=0.99', 'top1_drop<=0.5', 'map>=0.95': verdict + precision search")
    a.add_argument("--no-search", action="store_true", help="report the verdict only")
    a.add_argument("--report", type=Path, required=True,
                   help="report folder to write (a new or empty folder; an existing report needs --force)")
    a.add_argument("--force", action="store_true", help="replace an existing report folder")
    a.set_defaults(run=_run_accuracy)
    lat = what.add_parser("latency", help="per-stage latency and throughput against batch size")
    lat.add_argument("bundle", type=Path, help="bundle folder to measure")
    lat.add_argument("--batch", default="1,2,4,8", help="batch sizes, e.g. 1,2,4,8,16")
    lat.add_argument("--iterations", type=int, default=100, help="timed batches per batch size")
    lat.add_argument("--warmup", type=int, default=10, help="untimed batches first")
    lat.add_argument("--source", default="synthetic://1920x1080/nv12",
                     help="the frames timed: synthetic://WxH/FORMAT (default: synthetic://1920x1080/nv12)")
    lat.add_argument("--backend", type=_backend, metavar="BACKEND", default="auto",
                     help=f"inference backend: {BACKEND_HELP}")
    lat.add_argument("--memory", choices=MEMORY_MODES, default="auto", help="frame memory mode (GPU runtime)")
    lat.add_argument("--report", type=Path, required=True,
                     help="report folder to write (a new or empty folder; an existing report needs --force)")
    lat.add_argument("--force", action="store_true", help="replace an existing report folder")
    lat.set_defaults(run=_run_latency)
    tr = what.add_parser("tracking", help="tracking quality: HOTA, IDF1, MOTA, ID switches (TrackEval)",
                         description="Score trackers with the field's metrics (TrackEval: pip install --no-deps "
                                     "trackeval): on built-in scenes with ground truth (people behind pillars, "
                                     "crossing, in groups, stopping, under a panning camera), or a served "
                                     "JSONL's tracks against MOTChallenge ground truth (--gt with --results).")
    tr.add_argument("--trackers", default="bytetrack,botsort", help="trackers to compare on the scenes")
    tr.add_argument("--scenes", default=",".join(SCENES), help=f"built-in scenes: {', '.join(SCENES)}")
    tr.add_argument("--fps", default="30,10", help="frame rates each scene is sampled at")
    tr.add_argument("--seeds", default="1,2,3", help="scene seeds (the trackers were tuned on seed 0)")
    tr.add_argument("--gt", type=Path, help="MOTChallenge gt.txt (frame,id,left,top,width,height,...; frames from 1)")
    tr.add_argument("--results", type=Path, help="a `jetpipe serve` JSONL with track_ids (with --gt)")
    tr.add_argument("--stream", type=int, default=0, help="the JSONL's stream scored against --gt")
    tr.add_argument("--report", type=Path, required=True,
                    help="report folder to write (a new or empty folder; an existing report needs --force)")
    tr.add_argument("--force", action="store_true", help="replace an existing report folder")
    tr.set_defaults(run=_run_tracking)


def _add_export(sub) -> None:
    p = sub.add_parser("export", help="a bundle for another server (a Triton model repository), or a stretch of a "
                                      "recording as one MP4")
    what = p.add_subparsers(dest="what", required=True)
    r = what.add_parser("recording", help="a time range of one stream's recording (serve --record) as one MP4",
                        description="Remux the recorded segments of --stream from --from to --to into one MP4 "
                                    "(its own packets, never re-encoded; from the keyframe at or before --from), "
                                    "read from the recording's index; the recording may be in use.")
    r.add_argument("folder", type=Path, help="the recording's folder (serve --record DIR)")
    r.add_argument("--stream", type=int, required=True, help="the stream's ID (its folder streamID)")
    r.add_argument("--from", dest="start", required=True, metavar="TIME",
                   help="2026-11-28T14:05:00 (local time), ...Z (UTC), or Unix seconds")
    r.add_argument("--to", dest="end", required=True, metavar="TIME", help="as --from")
    r.add_argument("-o", "--output", type=Path, required=True, help="the MP4 to write (a new file)")
    r.set_defaults(run=_run_export_recording)
    t = what.add_parser("triton", help="REPO/NAME/config.pbtxt + REPO/NAME/1/model.onnx (or model.plan)",
                        description="Write the bundle as a Triton Inference Server model: config.pbtxt from the "
                                    "manifest (batch, I/O, dynamic batching, instances; task, labels and "
                                    "preprocessing as parameters) and the model file. The repository's other "
                                    "models are left alone; REPO/NAME is replaced only if an earlier export "
                                    "wrote it, with --force.")
    t.add_argument("bundle", type=Path, help="bundle folder written by `jetpipe convert`")
    t.add_argument("-o", "--output", type=Path, required=True, help="model repository folder (made if missing)")
    t.add_argument("--name", help="model name in the repository (default: the bundle folder's name)")
    t.add_argument("--platform", choices=tuple(triton.PLATFORMS), default="onnxruntime",
                   help="onnxruntime: the bundle's ONNX model (any server); tensorrt: its engine, as model.plan "
                        "(needs --server-tensorrt and --server-compute-capability matching the engine's)")
    t.add_argument("--instance-kind", choices=tuple(triton.INSTANCE_KINDS), default="gpu",
                   help="where Triton runs the model's instances (default gpu)")
    t.add_argument("--instances", type=int, default=1, help="model instances (default 1; per GPU with --gpus)")
    t.add_argument("--gpus", type=_triton_gpus, metavar="all|0,1,...",
                   help="the GPUs the instances go on, --instances on each (default all: Triton's own, every GPU "
                        "the server has)")
    t.add_argument("--max-queue-delay-us", type=int, default=500,
                   help="how long Triton may hold a request to fill a batch (default 500 us)")
    t.add_argument("--server-tensorrt", help="the server's TensorRT version (--platform tensorrt)")
    t.add_argument("--server-compute-capability", help="the server GPU's compute capability, e.g. 9.0 "
                   "(--platform tensorrt)")
    t.add_argument("--force", action="store_true", help="replace an earlier export of this name")
    t.set_defaults(run=_run_export_triton)


def _run_export_recording(args) -> int:
    done = recording_export.export_range(args.folder, args.stream, recording_export.parse_when(args.start, "--from"),
                                         recording_export.parse_when(args.end, "--to"), args.output)
    print(f"wrote {done.path}: {done.end - done.start:.1f} s from {done.segments} segment(s), {done.packets} "
          f"packets, {say_bytes(done.bytes)}")
    return 0


def _triton_gpus(text: str) -> list[int] | None:
    """--gpus: all (None: Triton's default) or GPU numbers; the export checks their bounds."""
    if text.strip().lower() == "all":
        return None
    try:
        return [int(g) for g in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: GPU numbers, e.g. 0,1, or all") from None


def _run_export_triton(args) -> int:
    folder = triton.export(triton.TritonExport(
        bundle=args.bundle, repository=args.output, name=args.name, platform=args.platform,
        instance_kind=args.instance_kind, instances=args.instances, gpus=args.gpus,
        max_queue_delay_us=args.max_queue_delay_us,
        server_tensorrt=args.server_tensorrt, server_compute_capability=args.server_compute_capability,
        force=args.force))
    print(f"wrote {folder}: config.pbtxt, {triton.VERSION}/{triton.PLATFORMS[args.platform][1]}")
    return 0


def _run_accuracy(args) -> int:
    report = run_accuracy(AccuracyOptions(
        bundle=args.bundle, data=args.data, report=args.report, reference=args.reference, task=args.task,
        samples=args.samples, provider=args.provider, backend=args.backend, budget=args.budget,
        search=not args.no_search, force=args.force))
    print((args.report / "report.md").read_text())
    budget = report.get("budget")
    search = report.get("precision_search")
    return 0 if not budget or budget["met"] or (search and search["met"]) else 1


def _run_tracking(args) -> int:
    if (args.gt is None) != (args.results is None):
        raise JetpipeError("--gt and --results go together: ground truth and the served tracks to score")
    trackers = _names(args.trackers, TRACKERS[1:], "--trackers")
    scenes = _names(args.scenes, SCENES, "--scenes")
    fps = tuple(_bounded_float(v, "--fps", 1, 120) for v in args.fps.split(","))
    seeds = tuple(int(v) if v.strip().isdigit() and int(v) <= 10**6 else _not_a_seed(v) for v in args.seeds.split(","))
    if args.stream < 0:
        raise JetpipeError(f"--stream {args.stream}: a stream number is 0 or more")
    run_tracking(TrackingOptions(args.report, trackers, scenes, fps, seeds, args.gt, args.results, args.stream,
                                 args.force))
    print((args.report / "report.md").read_text())
    return 0


def _names(text: str, allowed, flag: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    wrong = [n for n in names if n not in allowed]
    if wrong or not names:
        raise JetpipeError(f"{flag} {text!r}: choose from {', '.join(allowed)}, comma-separated")
    return names


def _not_a_seed(text: str):
    raise JetpipeError(f"--seeds {text!r}: whole numbers from 0 to 1000000, comma-separated")


def _bounded_float(text: str, flag: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not low <= value <= high:
        raise JetpipeError(f"{flag} {text!r}: a number from {low:g} to {high:g}")
    return value


def _run_latency(args) -> int:
    batches = parse_batches(args.batch)
    run_latency(LatencyOptions(bundle=args.bundle, report=args.report, batches=batches,
                               iterations=args.iterations, warmup=args.warmup, source=args.source,
                               backend=args.backend, memory=args.memory, force=args.force))
    print((args.report / "report.md").read_text())
    return 0


class _Parser(argparse.ArgumentParser):
    """Usage mistakes are one line too, like every other user mistake."""

    def error(self, message):
        self.exit(2, f"error: {self.prog}: {message} (see `{self.prog} --help`)\n")


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help line ends with its default, where it has one worth saying."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if default in (None, False, argparse.SUPPRESS) or "default" in text.lower() or action.nargs == 0:
            return text
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        return f"{text} (default: {shown})" if shown != [] and shown != "" else text


def parsers(parser: argparse.ArgumentParser):
    """The parser and every sub-command parser under it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from parsers(child)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jetpipe", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"jetpipe {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_convert(sub)
    _add_inspect(sub)
    _add_doctor(sub)
    _add_serve(sub)
    _add_demo(sub)
    _add_calibrate(sub)
    _add_export(sub)
    for each in parsers(parser):
        each.formatter_class = _HelpFormatter
    return parser


class Terminated(BaseException):
    """SIGTERM, raised where the program is, like KeyboardInterrupt for SIGINT: staged output is removed."""


def _raise_terminated(signum, frame):
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return _run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)
        output_folders.release_all()  # outputs claimed by a command that stopped before writing them


# a full disk or quota, a read-only file system, a name too long: the storage's problem, said in one line
STORAGE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENAMETOOLONG}


def _run(args) -> int:
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO,
                        format="%(levelname)s: %(message)s", stream=sys.stderr)
    logging.getLogger("jetpipe").setLevel(logging.DEBUG if args.debug else logging.INFO)
    for noisy in ("onnxslim", "matplotlib", "PIL", "PyNvVideoCodec"):  # their INFO lines are not ours
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return args.run(args)
    except JetpipeError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `jetpipe inspect B --json | head`: the reader left, which is fine
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as exc:
        if args.debug or exc.errno not in STORAGE_ERRORS:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"error: {exc.strerror}{where}: free space or choose another place, and run again (outputs are written "
              "staged: nothing was left half-written)", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as exc:
        if args.debug:
            raise
        name, code = ("SIGTERM", 143) if isinstance(exc, Terminated) else ("Ctrl-C", 130)
        print(f"interrupted ({name}): nothing was written", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
