"""`jetpipe convert`: ONNX -> cleaned -> FP16 / INT8 -> (engine) -> bundle.

A chain of small steps over a ModelProto; the bundle is staged in a temp folder
and renamed into place only when everything succeeded.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import logging
import math
import platform
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import onnx

from jetpipe import __version__, output_folders
from jetpipe import bundle as bundles
from jetpipe.convert import batch, calib_cache, flops, fp16, graph, int8, sensitivity, stats
from jetpipe.convert.calib_cache import CalibrationResult
from jetpipe.convert.calib_data import CalibrationSource, SyntheticText, open_source
from jetpipe.convert.ops import policy
from jetpipe.convert.prune import prune
from jetpipe.convert.sparsity import apply_2_4
from jetpipe.convert.trt_ops import check_tensorrt_ops
from jetpipe.errors import CalibrationError, EngineError, JetpipeError, ModelError
from jetpipe.limits import MAX_BATCH, MAX_SIDE
from jetpipe.progress import bar
from jetpipe.runtime import trt_builder
from jetpipe.runtime.sessions import cpu_session, run_in_batches
from jetpipe.spec import PreprocessSpec
from jetpipe.tasks import ModelFacts, Task, TaskOptions, choose
from jetpipe.tasks import get as get_task
from jetpipe.tasks.agreement_metrics import meets, relative_mae
from jetpipe.tasks.base import kept_metadata

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "int8")
ENGINE_MODES = ("auto", "never", "require")
FP16_TOLERANCE = 1e-2  # relative output MAE above which more nodes stay float32


@dataclass
class ConvertOptions:
    model: Path
    output: Path
    precision: str = "fp32"
    calib: str | None = None
    calib_size: int = 64
    calib_method: str = "percentile"
    calib_batch: int = 2
    calib_cache: Path | None = None
    max_batch: int = 8
    input_size: tuple[int, int] | None = None
    input_width_range: tuple[int, int] | None = None  # (min, max): the width stays dynamic; input_size has opt
    spec: PreprocessSpec = field(default_factory=PreprocessSpec)
    exclude: tuple[str, ...] = ()
    auto_exclude: bool = True
    fp16_data_max: float = 16384.0  # a quarter of the fp16 range: headroom for unseen data
    engine: str = "auto"
    engine_family: str = "auto"      # auto | tensorrt | tensorrt-rtx (see runtime/trt_builder.py)
    rtx_targets: tuple[str, ...] = ("sm86", "sm89", "sm120")  # TensorRT-RTX: GPUs the engine is built for
    workspace_mb: int | None = None
    timing_cache: Path | None = None
    sparsity: str | None = None      # "2:4": prune eligible weights to TensorRT's sparse pattern
    prune: float | None = None       # structured channel pruning: share of FLOPs to remove, in (0, 1)
    prune_method: str | None = None  # l1 | reconstruct; None: reconstruct where --calib gives data, else l1
    prune_allocation: str | None = None  # uniform | sensitivity (default: by method)
    prune_align: int = 8             # kept channel counts are multiples of this
    prune_budget_min: float = 15     # sensitivity measured only where it fits in this time (else uniform)
    dla_core: int | None = None
    force: bool = False
    output_flag: str = "-o"          # the option that named the output, for the messages (demo: --bundle-dir)
    force_synthetic: bool = False  # INT8 ranges from rendered text for a model that does not read text
    task: str | None = None          # None: recognized from the outputs and the model's metadata
    labels: tuple[str, ...] | None = None  # class names / a recognizer's alphabet (--labels FILE)
    progress: bool = True


@dataclass
class Prepared:
    """The FP32 model a bundle is made from; `channels`: 3 (colour) or 1 (gray)."""

    model: onnx.ModelProto
    input: graph.InputInfo
    size_hw: tuple[int, int]
    batch_made_dynamic: bool
    source_sha256: str
    cleanup: dict = field(default_factory=dict)       # whether onnxslim's clean-up was kept, and why not
    batch_layout: dict = field(default_factory=dict)  # rewritten batch literals, outputs' batch axes moved
    width_range: tuple[int, int] | None = None        # (min, max) of a dynamic input width; size_hw has opt
    metadata: dict = field(default_factory=dict)      # the source's metadata_props (task, class names, alphabet)

    @property
    def channels(self) -> int:
        return int(self.input.dims[1])


def convert(opts: ConvertOptions) -> dict:
    """Run the whole conversion; returns the manifest written into the bundle."""
    _validate(opts)
    opts = dataclasses.replace(opts, prune_method=_prune_method(opts))
    bundles.check_destination(opts.output, opts.force, opts.output_flag)
    prepared = prepare(opts.model, opts.precision, opts.input_size, opts.max_batch, opts.input_width_range)
    task, labels, facts = _choose_task(opts, prepared)
    opts = dataclasses.replace(opts, spec=opts.spec.for_channels(prepared.channels),  # gray for 1 channel
                               task=task.name, labels=labels)
    source = _calibration_source(opts, prepared)
    first_batch = next(source.batches(_step_batch(opts.calib_batch, prepared))) if source is not None else None
    batch_proof = _prove_batch(prepared, first_batch)  # before pruning, which can take minutes
    held = source.held_out(check_sample_count(prepared.size_hw)) if source is not None else (None, False)
    checks = _CheckSamples(*held, task, TaskOptions.of(facts, labels))
    cost = {"source": flops.totals(flops.layer_costs(prepared.model, prepared.size_hw))}
    pruning = _apply_pruning(opts, prepared, source, cost["source"], checks)
    sparsity = _apply_sparsity(opts, prepared)
    cost["processed"] = flops.totals(flops.layer_costs(prepared.model, prepared.size_hw))
    _check_node_names(prepared.model, opts.exclude)
    if opts.engine != "never":
        check_tensorrt_ops(prepared.model)
    calibration = _calibrate(opts, prepared, source, pruning)
    model, excluded, check = _apply_precision(opts, prepared, calibration, first_batch, checks)
    with output_folders.staging(opts.output) as tmp:
        onnx.save(model, str(tmp / bundles.MODEL_FILE))
        if calibration is not None:
            calib_cache.save(calibration, tmp)
        engine = _build_engine(opts, prepared, tmp)
        manifest = _manifest(opts, prepared, model, excluded, calibration, check, engine, batch_proof)
        manifest["cost"], manifest["sparsity"], manifest["pruning"] = cost, sparsity, pruning
        bundles.finish_manifest(tmp, manifest)
    return manifest


RECONSTRUCT_SAMPLES = 8  # calibration images for the sensitivity measurement and the least-squares refit
CHECK_SAMPLES = 8        # samples of the "vs fp32" accuracy check, held out from calibration where the data allows
CHECK_PIXELS = CHECK_SAMPLES * 640 * 640  # small inputs are checked on more samples, up to MAX_CHECK_SAMPLES
MAX_CHECK_SAMPLES = 64   # a text-line recognizer (48x320): one line of 8 read differently was 12.5 points


def check_sample_count(size_hw: tuple[int, int]) -> int:
    return int(np.clip(CHECK_PIXELS // (size_hw[0] * size_hw[1]), CHECK_SAMPLES, MAX_CHECK_SAMPLES))
ACCURACY_WARNING = 0.1   # relative MAE against FP32 above which convert warns (PP-OCRv4 det INT8: about 0.02)


@dataclass
class _CheckSamples:
    """Inputs the processed model is compared on with FP32 (`held_out`: calibration never saw them), and the
    task whose own metric the comparison reports."""

    inputs: np.ndarray | None
    held_out: bool
    task: Task
    options: TaskOptions


def _apply_pruning(opts: ConvertOptions, prepared: Prepared, source, before: dict, checks) -> dict | None:
    """Structured channel pruning of the cleaned FP32 graph (before precision and calibration)."""
    if opts.prune is None:
        return None

    samples = None
    if source is not None and (opts.prune_method == "reconstruct" or opts.prune_allocation == "sensitivity"):
        samples = np.concatenate([b for b, _ in zip(source.batches(2), range(RECONSTRUCT_SAMPLES // 2))])
    unpruned = prepared.model
    prepared.model, report = prune(prepared.model, opts.prune, opts.prune_method, set(opts.exclude),
                                   align=opts.prune_align, allocation=opts.prune_allocation,
                                   samples=samples, input_name=prepared.input.name, size_hw=prepared.size_hw,
                                   budget_s=60 * opts.prune_budget_min,
                                   progress=lambda total, what, unit: bar(total, what, unit, opts.progress))
    graph.check(prepared.model, "the pruned model")
    _check_runs(prepared.model, prepared.input, prepared.size_hw,
                _random_sample(prepared.channels, prepared.size_hw))
    layers = flops.layer_costs(prepared.model, prepared.size_hw)
    after = flops.totals(layers)
    log.info("pruned %d channel group(s): params %.2f M -> %.2f M, GFLOPs %.2f -> %.2f", len(report["pruned"]),
             before["params"] / 1e6, after["params"] / 1e6, before["flops"] / 1e9, after["flops"] / 1e9)
    for group, why in report["skipped"].items():
        log.info("not pruned: %s (%s)", group, why)
    check = _accuracy_check(unpruned, prepared.model, checks, prepared.input.name)
    _warn_if_inaccurate(check, "pruning", opts)
    removed = 1 - after["flops"] / max(before["flops"], 1)
    _say_what_pruning_did(opts, removed, check)
    return {"method": opts.prune_method, "ratio": opts.prune, "flops_removed": round(removed, 4), **report,
            "check": check, "layers": {r["node"]: r for r in layers}}


PRUNE_RATIO_SLACK = 0.03  # FLOPs removed this far from the ratio asked are said, with why


def _prune_method(opts) -> str | None:
    """The method asked for, else the one that keeps accuracy where there is data to keep it with: l1 lost
    real models without a word (PP-OCRv4 det hmean 0.03 at -20 % FLOPs; reconstruct 0.82)."""
    if opts.prune is None or opts.prune_method is not None:
        return opts.prune_method
    if opts.calib is None:
        return "l1"
    log.info("--prune-method reconstruct: the default with --calib (--prune-method l1 for the data-free one)")
    return "reconstruct"


def _say_what_pruning_did(opts, removed: float, check: dict | None) -> None:
    """How far the FLOPs fell against what was asked, and, without data, that nothing was measured."""
    if abs(removed - opts.prune) > PRUNE_RATIO_SLACK:
        log.warning("--prune %g removed %.1f %% of the FLOPs, not %.0f %%: channel groups move in steps of "
                    "--prune-align %d and whole groups stay (the log's 'not pruned' lines say which)", opts.prune,
                    100 * removed, 100 * opts.prune, opts.prune_align)
    if check is None:
        log.warning("pruning (%s) removed %.1f %% of the FLOPs and nothing measured what it cost: pass --calib DATA to "
                    "compare with the unpruned model by the task's metric (and for --prune-method reconstruct, "
                    "which keeps accuracy where l1 loses it: PP-OCRv4 det hmean 0.82 against 0.03 at -20 %%)",
                    opts.prune_method, 100 * removed)


def _apply_sparsity(opts: ConvertOptions, prepared: Prepared) -> dict | None:
    """2:4 on the cleaned FP32 graph, before calibration (ranges must see the pruned weights)."""
    if opts.sparsity is None:
        return None

    prepared.model, layers = apply_2_4(prepared.model, set(opts.exclude))
    pruned = [n for n, what in layers.items() if what == "2:4"]
    if not pruned:
        raise ModelError("--sparsity 2:4: no layer can take the pattern (it needs Conv/Gemm/MatMul weights with "
                         ">= 8 input channels and group 1): drop --sparsity")
    log.info("2:4 sparsity on %d of %d weight layers", len(pruned), len(layers))
    return {"pattern": opts.sparsity, "layers": layers}


def _validate(opts: ConvertOptions) -> None:
    if opts.precision not in PRECISIONS:
        raise JetpipeError(f"--precision {opts.precision!r}: choose one of {', '.join(PRECISIONS)}")
    if opts.engine not in ENGINE_MODES:
        raise JetpipeError(f"--engine {opts.engine!r}: choose one of {', '.join(ENGINE_MODES)}")
    if opts.calib_method not in stats.METHODS:
        raise JetpipeError(f"--calib-method {opts.calib_method!r}: choose one of {', '.join(stats.METHODS)}")
    if opts.sparsity not in (None, "2:4"):
        raise JetpipeError(f"--sparsity {opts.sparsity!r}: only 2:4 is supported")
    if not opts.prune_budget_min > 0:
        raise JetpipeError(f"--prune-budget {opts.prune_budget_min:g}: minutes above 0, e.g. 15")
    if not 1 <= opts.max_batch <= MAX_BATCH:
        raise JetpipeError(f"--max-batch {opts.max_batch} must be from 1 to {MAX_BATCH}")
    _check_bounds(opts)
    if opts.precision == "int8" and opts.calib is None and opts.calib_cache is None:
        raise CalibrationError("--precision int8 needs calibration data: pass --calib FOLDER|VIDEO|FILE.npy "
                               "(or --calib synthetic for rendered text images)")
    _validate_engine(opts)


MAX_WORKSPACE_MB = 1 << 20  # 1 TiB
MAX_DLA_CORE = 15           # Orin has cores 0 and 1


def _check_bounds(opts: ConvertOptions) -> None:
    """Every number a user gives, against its bound, before any work."""
    sides = (*(opts.input_size or ()), *(opts.input_width_range or ()))
    checks = [
        (1 <= opts.calib_batch <= MAX_BATCH, f"--calib-batch {opts.calib_batch}: images per calibration run, from 1 "
                                              f"to {MAX_BATCH}"),
        (all(1 <= s <= MAX_SIDE for s in sides), f"--input-size: sides from 1 to {MAX_SIDE} pixels"),
        (opts.workspace_mb is None or 1 <= opts.workspace_mb <= MAX_WORKSPACE_MB,
         f"--workspace {opts.workspace_mb}: MiB from 1 to {MAX_WORKSPACE_MB}"),
        (opts.dla_core is None or 0 <= opts.dla_core <= MAX_DLA_CORE,
         f"--dla {opts.dla_core}: a DLA core number from 0 (Orin has 0 and 1)"),
    ]
    for ok, message in checks:
        if not ok:
            raise JetpipeError(message)


def _validate_engine(opts: ConvertOptions) -> None:
    families, targets = trt_builder.ENGINE_FAMILIES, trt_builder.RTX_TARGETS
    if opts.engine_family not in families:
        raise JetpipeError(f"--engine-family {opts.engine_family!r}: choose one of {', '.join(families)}")
    unknown = [t for t in opts.rtx_targets if t not in targets]
    if unknown or not opts.rtx_targets:
        raise JetpipeError(f"--rtx-targets {','.join(opts.rtx_targets)!r}: name one or more of "
                           f"{', '.join(targets)} (comma-separated)")
    if opts.engine == "require" and trt_builder.resolve_family(opts.engine_family) is None:
        which = "TensorRT" if opts.engine_family == "auto" else opts.engine_family
        raise EngineError(f"--engine require but {which} is not installed: install TensorRT (JetPack on Jetson, "
                          "NVIDIA's index on desktops), or build for RTX GPUs with --engine-family tensorrt-rtx "
                          "(pip install 'jetpipe[rtx]'), or use --engine auto|never")


def prepare(model_path: Path, precision: str, input_size: tuple[int, int] | None, max_batch: int,
            width_range: tuple[int, int] | None = None) -> Prepared:
    """Load, check, upgrade opset (INT8), fix input size and batch axis, clean up: the FP32 base a bundle
    is made from (and the reference `calibrate accuracy` compares it with). With `width_range` the input
    width stays dynamic and `input_size`'s width is the one calibration and checks use."""
    model = graph.load(model_path)
    source_sha = bundles.sha256_file(model_path)
    _refuse_requantizing(model, precision)
    if precision == "int8":
        model = graph.upgrade_opset(model)
    if input_size is None:
        input_size = _exported_size(model)
    model = graph.fix_input_size(model, input_size, width_range)
    info = graph.image_input(model)
    if info.dims[1] not in (1, 3):
        raise ModelError(f"input {info.name!r} has {info.dims[1]} channels; jetpipe feeds 3-channel (colour) "
                         "or 1-channel (gray) images")
    size_hw = (int(info.dims[2]), int(input_size[1] if width_range else info.dims[3]))
    if max(size_hw) > MAX_SIDE:
        raise ModelError(f"input {info.name!r} is {size_hw[0]}x{size_hw[1]}; jetpipe takes sides up to {MAX_SIDE} "
                         "pixels: export the model for a smaller input or pass --input-size")
    _check_memory(model, info.name, size_hw)
    sample = _random_sample(info.dims[1], size_hw)
    reference = _check_runs(model, info, size_hw, sample)
    _check_width_range(model, info, size_hw[0], width_range)
    dynamic = graph.make_batch_dynamic(model) if max_batch > 1 else False
    exported = model  # clean_up returns new models and leaves this one as it is
    model, cleanup = graph.clean_up(model, sample, reference)
    if cleanup["applied"] and width_range and not _runs_at_widths(model, info, size_hw[0], width_range):
        log.warning("graph clean-up (onnxslim) fixed the input width: the bundle keeps the graph as exported")
        model, cleanup = graph.with_shapes(exported), {"applied": False, "reason": "it fixed the input width"}
    layout = batch.batch_layout(model, sample, dynamic) if max_batch > 1 else batch.batch_one_layout(model, sample)
    metadata = {prop.key: prop.value for prop in exported.metadata_props}
    return Prepared(model, graph.image_input(model), size_hw, dynamic, source_sha, cleanup, layout, width_range,
                    metadata)


ACTIVATIONS_AT_ONCE = 3  # a run holds about this many of its largest tensors at once (a layer's in and out, one more)


def _check_memory(model: onnx.ModelProto, name: str, size_hw: tuple[int, int]) -> None:
    """A sample at this input size must fit the memory there is before it is run (--input-size 16384x16384 was
    OOM-killed at 24 GB after 81 s, its lock left behind)."""
    need = ACTIVATIONS_AT_ONCE * flops.largest_activation_bytes(model)
    have = _available_memory()
    if have and need > have:
        raise ModelError(f"input {name!r} at {size_hw[0]}x{size_hw[1]}: one sample's activations need about "
                         f"{need / 1e9:.0f} GB, this machine has {have / 1e9:.0f} GB available: choose a smaller "
                         "--input-size")


def _available_memory() -> int:
    """MemAvailable (Linux), in bytes; 0 where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _exported_size(model: onnx.ModelProto) -> tuple[int, int] | None:
    """A dynamic-size export's own input size, where its metadata says it (Ultralytics' imgsz "[640, 640]")."""
    info = graph.image_input(model)
    if not any(isinstance(d, str) for d in info.dims[2:]):
        return None
    text = next((p.value for p in model.metadata_props if p.key == "imgsz"), None)
    try:
        size = tuple(int(v) for v in ast.literal_eval(text)) if text else ()
    except (ValueError, SyntaxError, TypeError):
        return None
    if len(size) != 2 or not all(0 < v <= MAX_SIDE for v in size):
        return None
    log.info("input size %dx%d: the export's imgsz (--input-size to choose another)", *size)
    return size


def _check_width_range(model: onnx.ModelProto, info: graph.InputInfo, height: int, width_range) -> None:
    """The model runs at both ends of a --input-size width range."""
    if width_range is None:
        return
    for width in width_range:
        _check_runs(model, info, (height, width), _random_sample(info.dims[1], (height, width)))


def _runs_at_widths(model: onnx.ModelProto, info: graph.InputInfo, height: int, width_range) -> bool:
    try:
        _check_width_range(model, info, height, width_range)
    except ModelError:
        return False
    return True


def _refuse_requantizing(model: onnx.ModelProto, precision: str) -> None:
    """An already quantized model (ONNX Runtime's quantize_dynamic / quantize_static output, or Q/DQ) is not
    converted to FP16 or quantized again: fp16 broke its integer ops (INVALID_GRAPH), int8 would stack Q/DQ."""
    if precision == "fp32":
        return
    node = next((n for n in model.graph.node if policy(n.op_type).quantized), None)
    if node is not None:
        raise ModelError(f"the model is quantized already (node {node.name or '<unnamed>'!r} is {node.op_type}): "
                         f"--precision {precision} needs the float model it was made from; or convert this one "
                         "with --precision fp32, which keeps its quantization")


def _random_sample(channels: int, size_hw) -> np.ndarray:
    """One network input of random values: for checks that need any input of the right shape."""
    return np.random.default_rng(0).standard_normal((1, channels, *size_hw)).astype(np.float32)


def _check_runs(model: onnx.ModelProto, info: graph.InputInfo, size_hw, sample: np.ndarray) -> list:
    """One ONNX Runtime run at the input size, on `sample`: catches sizes the graph cannot take; returns
    the outputs."""
    try:
        return cpu_session(model).run(None, {info.name: sample})
    except Exception as exc:
        unknown = _unknown_operator(str(exc))
        if unknown:
            raise ModelError(f"the model uses the operator {unknown}, which ONNX Runtime does not implement (a custom "
                             "op): jetpipe runs and checks models with ONNX Runtime; re-export the model with "
                             "standard ONNX operators") from None
        raise ModelError(
            f"the model does not run at input size {size_hw[0]}x{size_hw[1]} "
            f"({str(exc).splitlines()[0][:160]}); pick an --input-size the network accepts "
            "(detectors usually need multiples of 32)"
        ) from exc


UNKNOWN_OPERATOR = (re.compile(r"(\S+?)\(-?\d+\) is not a registered function/op"),
                    re.compile(r"Could not find an implementation for (\S+?)\("),
                    re.compile(r"No Op registered for (\S+) with domain_version"))


def _unknown_operator(message: str) -> str | None:
    """The operator ONNX Runtime's error says it does not know ("custom.ops:MyOp"), if that is the error."""
    for pattern in UNKNOWN_OPERATOR:
        found = pattern.search(message)
        if found:
            return found.group(1)
    return None


def _calibration_source(opts, prepared: Prepared) -> CalibrationSource | None:
    if opts.calib is None:
        return None
    source = open_source(opts.calib, tuple(prepared.input.dims), prepared.size_hw, opts.spec, opts.calib_size)
    in_domain = "text-recognition" if isinstance(source, SyntheticText) and source.lines else "text-detection"
    if isinstance(source, SyntheticText) and opts.task != in_domain:
        h, w = prepared.size_hw
        made_for = ("text recognizers (line-shaped inputs like this one's)" if source.lines else
                    "text detectors")
        if opts.precision == "int8" and not opts.force_synthetic:
            raise CalibrationError(
                f"--calib synthetic renders {source.describe()}, made for {made_for}; this is a {opts.task} model "
                f"and INT8 ranges taken from unlike data cost accuracy: calibrate on real {w}x{h} inputs (--calib "
                "FOLDER|VIDEO|FILE.npy), or add --force-synthetic to use it anyway")
        log.warning("--calib synthetic renders %s, made for %s; for other models its ranges come from unlike "
                    "data and cost accuracy: calibrate on real %dx%d inputs (a folder of images or a video)",
                    source.describe(), made_for, w, h)
    return source


def _choose_task(opts, prepared: Prepared) -> tuple[Task, tuple[str, ...] | None, ModelFacts]:
    """The task the bundle is for (--task checked against the outputs, else recognized), its labels, and the
    facts it was chosen by (the accuracy check's task options read them too)."""
    facts = ModelFacts.from_io(_io(prepared.model), prepared.size_hw, prepared.metadata, opts.labels)
    task = choose(opts.task, facts)
    labels = task.labels(facts)
    log.info("task: %s%s", task.name, f" ({len(labels)} labels)" if labels else "")
    return task, labels, facts


def _step_batch(wanted: int, prepared: Prepared) -> int:
    """Rows per calibration / check run: never more than a model with a fixed batch (--max-batch 1
    keeps a batch-1 export as it is) takes."""
    fixed = prepared.input.dims[0]
    return min(wanted, fixed) if isinstance(fixed, int) else wanted


def _prove_batch(prepared: Prepared, first_batch) -> dict | None:
    if not prepared.batch_made_dynamic:
        return None
    sample = first_batch if first_batch is not None else _random_sample(prepared.channels, prepared.size_hw)
    return {"made_dynamic": True, "max_relative_difference": batch.prove_rows(prepared.model, sample),
            "rewritten_reshapes": prepared.batch_layout["rewritten_reshapes"],
            "expanded_concats": prepared.batch_layout["expanded_concats"]}


def _calibrate(opts, prepared: Prepared, source: CalibrationSource | None,
               pruning: dict | None) -> CalibrationResult | None:
    if opts.precision == "fp32" or source is None and opts.calib_cache is None:
        return None
    # calibration results are only valid for the same weights: sparsity is part of the model's key
    model_key = prepared.source_sha256 + (f"+sparsity={opts.sparsity}" if opts.sparsity else "") + \
        (f"+prune={opts.prune}:{opts.prune_method}:{pruning['allocation']}:{opts.prune_align}" if pruning else "")
    wanted = {"model_sha256": model_key, "method": opts.calib_method,
              "data_fingerprint": source.fingerprint() if source is not None else None}
    hist, means = set(), set()
    if opts.precision == "int8":
        full = int8.plan(prepared.model, set(opts.exclude))
        hist, means = set(full.activations), int8.conv_inputs(prepared.model, full)
    cached = _cached_calibration(opts, wanted, hist, means)
    if cached is not None:
        return cached
    if source is None:
        raise CalibrationError("--calib-cache was given without --calib: pass the calibration data too")
    progress = _progress(opts, len(source), "calibrating")
    try:
        collected = stats.collect(prepared.model, source.batches(_step_batch(opts.calib_batch, prepared)),
                                  prepared.input.name,
                                  hist, all_absmax=opts.precision == "fp16", progress=progress,
                                  mean_tensors=means)
    finally:
        progress.close()
    if collected.samples == 0:
        raise CalibrationError(f"no calibration sample could be read from {opts.calib}")
    return CalibrationResult(
        **wanted, samples=collected.samples, skipped=source.skipped,
        ranges=collected.ranges(opts.calib_method, hist), absmax=collected.absmax(),
        channel_means=collected.channel_means())


def _cached_calibration(opts, wanted: dict, needed: set[str], means: set[str]) -> CalibrationResult | None:
    """An explicit --calib-cache must match; a replaced bundle's is reused when it matches and has a range for
    every tensor this run quantizes (`needed`: it may have been made with other --exclude nodes) and the
    channel means bias correction uses (`means`: a bundle made before bias correction has none)."""
    if opts.calib_cache is not None:
        cached = calib_cache.load(opts.calib_cache)
        if wanted["data_fingerprint"] is None:
            wanted = {**wanted, "data_fingerprint": cached.data_fingerprint}
        why = calib_cache.mismatch(cached, wanted)
        if why:
            raise CalibrationError(f"calibration cache {opts.calib_cache} does not match this run: {why}. "
                                   "Drop --calib-cache to recalibrate")
        log.info("reusing calibration from %s", opts.calib_cache)
        if means - set(cached.channel_means):
            log.info("%s has no channel means for %d Conv input(s): their biases are not corrected",
                     opts.calib_cache, len(means - set(cached.channel_means)))
        return cached
    previous = opts.output / bundles.CALIBRATION_FILE
    if opts.force and previous.is_file():
        try:
            cached = calib_cache.load(previous)
        except CalibrationError:
            return None
        why = calib_cache.mismatch(cached, wanted) or (
            "its ranges were made for other excluded nodes" if needed - set(cached.ranges) else None) or (
            "it has no channel means for bias correction" if means - set(cached.channel_means) else None)
        if why is None:
            log.info("reusing calibration from the bundle being replaced (same model, method and data)")
            return cached
        log.info("recalibrating: %s", why)
    return None


def _apply_precision(opts, prepared: Prepared, calibration, first_batch, checks):
    """The processed model, the nodes kept in float32 (name -> reason), and an accuracy check."""
    model = prepared.model
    manual = {n: "--exclude" for n in opts.exclude}
    if opts.precision == "fp32":
        return model, manual, None
    if opts.precision == "fp16":
        absmax = calibration.absmax if calibration is not None else {}
        if calibration is None:
            log.warning("fp16 without --calib: no activation ranges; only weights are checked")
        return _to_fp16(opts, model, absmax, manual, checks, prepared.input.name)
    return _to_int8(opts, prepared, calibration, manual, first_batch, checks)


def _to_fp16(opts, model, absmax, manual, checks, input_name):
    data_max = opts.fp16_data_max
    while True:
        keep = {**fp16.range_rules(model, absmax, data_max), **manual}
        half = fp16.convert(model, set(keep))
        check = _accuracy_check(model, half, checks, input_name)
        close = check is None or (check["relative_mae"] <= FP16_TOLERANCE and not _task_misses(check, checks.task))
        if close or data_max <= 256 or not absmax:
            _warn_if_inaccurate(check, "FP16", opts)
            return half, keep, check
        data_max /= 4  # measured error too high: keep more of the largest-valued nodes in fp32
        log.info("fp16 output error %.2e, %s: keeping nodes with |x| > %g in fp32", check["relative_mae"],
                 _metric_text(check["task_metrics"]), data_max)


def _to_int8(opts, prepared: Prepared, calibration: CalibrationResult, manual, samples, checks):
    """Quantize; where the task's check misses its bound, keep the next most sensitive nodes in float until it
    holds (at most FALLBACK_SHARE of the quantized nodes): the per-layer fallback, by the task's metric."""
    model, name = prepared.model, prepared.input.name
    excluded = dict(manual)
    ranked: dict[str, float] = {}
    if opts.auto_exclude and samples is not None:
        if not calibration.sensitivity:
            calibration.sensitivity = _rank_int8_nodes(opts, model, calibration, samples, name, excluded)
        ranked = calibration.sensitivity
        calibration.auto_excluded = sensitivity.pick_sensitive(ranked)
        excluded.update(calibration.auto_excluded)
    best = (*_quantize_checked(opts, model, calibration, excluded, checks, name), dict(excluded))
    order = [n for n in sorted(ranked, key=ranked.get, reverse=True) if n not in excluded]
    step, most = max(1, math.ceil(FALLBACK_STEP * len(ranked))), math.floor(FALLBACK_SHARE * len(ranked))
    check = best[1]
    while order and check is not None and _task_misses(check, checks.task) and \
            len(excluded) - len(manual) + step <= most:
        added, order = order[:step], order[step:]
        log.info("INT8 %s: keeping %d more node(s) in float", "; ".join(_task_misses(check, checks.task)), step)
        excluded.update({node: f"kept for the task's check (sensitivity {ranked[node]:.2e})" for node in added})
        quantized, check = _quantize_checked(opts, model, calibration, excluded, checks, name)
        if _shortfall(check, checks.task) < _shortfall(best[1], checks.task):
            best = (quantized, check, dict(excluded))
    quantized, check, excluded = best  # more nodes in float can read worse: the best check seen is kept
    if calibration.auto_excluded is not None:
        calibration.auto_excluded = {n: why for n, why in excluded.items() if n not in manual}
    _warn_if_inaccurate(check, "INT8", opts)
    return quantized, excluded, check


def _shortfall(check: dict, task: Task) -> float:
    """How far the check's metrics are from their bounds, the worst one as a ratio (<= 1: all met)."""
    ratios = [1.0]
    for metric, bound in task.check_bounds.items():
        value = check["task_metrics"].get(metric)
        if value is not None:
            lower_is_better = task.metrics[metric] == "<="
            ratios.append(value / bound if lower_is_better else bound / max(value, 1e-12))
    return max(ratios)


FALLBACK_STEP = 0.05   # nodes kept in float per step of the fallback, as a share of the quantizable ones
FALLBACK_SHARE = 0.25  # the fallback keeps at most this share of them in float (auto-excluded ones included)


def _rank_int8_nodes(opts, model, calibration, samples, input_name, excluded) -> dict[str, float]:
    full = int8.plan(model, set(excluded))
    progress = _progress(opts, len(full.nodes), "sensitivity")
    try:
        return sensitivity.rank_int8_nodes(model, full, calibration.ranges, samples, input_name, progress,
                                           calibration.means())
    finally:
        progress.close()


def _quantize_checked(opts, model, calibration, excluded, checks, input_name):
    qplan = int8.plan(model, set(excluded))
    missing = [a for a in qplan.activations if a not in calibration.ranges]
    if missing:
        # calibration covers every tensor the plan without auto-exclusions needs, exclusions only remove
        # quantization (int8.plan), and a replaced bundle's ranges are reused only when they cover the plan:
        # only an explicit --calib-cache made with other --exclude nodes can lack one
        raise CalibrationError(f"--calib-cache {opts.calib_cache} has no range for {missing[0]} (it was made "
                               "with other excluded nodes): drop --calib-cache to recalibrate")
    quantized = int8.quantize(model, qplan, calibration.ranges, calibration.means())
    graph.check(quantized, "the INT8 model")
    return quantized, _accuracy_check(model, quantized, checks, input_name)


def _check_node_names(model, names) -> None:
    known = {n.name for n in model.graph.node}
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ModelError(f"--exclude {name!r}: no node of that name in the cleaned-up model{hint}")


def _accuracy_check(reference, processed, checks: _CheckSamples, input_name) -> dict | None:
    """The processed model against `reference` (FP32) on the check samples: the task's own metrics (boxes
    found, strings read, top-1, ...) and the relative MAE of each output."""
    if checks.inputs is None:
        return None
    ref = run_in_batches(cpu_session(reference), checks.inputs)
    out = run_in_batches(cpu_session(processed), checks.inputs)
    names = [o.name for o in reference.graph.output]
    return {"samples": int(len(checks.inputs)), "held_out": checks.held_out, "task": checks.task.name,
            "task_metrics": {k: round(float(v), 6) for k, v in checks.task.metric(ref, out, checks.options).items()},
            "relative_mae": relative_mae(ref, out),
            "outputs": {n: relative_mae([r], [o]) for n, r, o in zip(names, ref, out)},
            "max_abs_error": max(float(np.abs(r - o).max()) for r, o in zip(ref, out))}


def _task_misses(check: dict, task: Task) -> list[str]:
    """The task's check bounds the metrics miss ('box_f1 0.27 < 0.9')."""
    missed = []
    for metric, bound in task.check_bounds.items():
        value, op = check["task_metrics"].get(metric), task.metrics[metric]
        if value is not None and not meets(value, op, bound):
            missed.append(f"{metric} {value:.3g} {'<' if op == '>=' else '>'} {bound:g}")
    return missed


def _metric_text(metrics: dict) -> str:
    return ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())


def _warn_if_inaccurate(check: dict | None, what: str, opts) -> None:
    """Say loudly when `what` (a step: INT8, FP16, pruning) moved the task's results or the outputs far;
    marks the check."""
    if check is None:
        return
    reasons = _task_misses(check, get_task(check["task"]))
    if check["relative_mae"] > ACCURACY_WARNING:
        reasons.append(f"relative MAE {check['relative_mae']:.3f} > {ACCURACY_WARNING}")
    if not reasons:
        return
    samples = f"{check['samples']} {'held-out' if check['held_out'] else 'calibration'} samples"
    log.warning("%s changes the model's results against FP32 on %s (%s: %s): check them on your data with "
                "`jetpipe calibrate accuracy %s --data %s --budget ...`, which can also keep the worst layers in "
                "float", what, samples, check["task"], "; ".join(reasons), opts.output, opts.calib)
    check["warning"] = "; ".join(reasons)


def _build_engine(opts, prepared: Prepared, folder: Path) -> dict:
    if opts.engine == "never":
        return {"built": False, "reason": "--engine never"}
    family = trt_builder.resolve_family(opts.engine_family)
    if family is None:
        log.warning("TensorRT is not installed: bundle written without an engine")
        return {"built": False, "reason": "TensorRT not installed on the converting machine"}
    build = trt_builder.BuildOptions(
        input_name=prepared.input.name, input_chw=(prepared.channels, *prepared.size_hw), max_batch=opts.max_batch,
        width_range=prepared.width_range,
        workspace_bytes=opts.workspace_mb * (1 << 20) if opts.workspace_mb else None,
        timing_cache=opts.timing_cache, sparse_weights=opts.sparsity is not None, dla_core=opts.dla_core,
        family=family, targets=tuple(opts.rtx_targets) if family == "tensorrt-rtx" else ())
    facts = trt_builder.build_engine(folder / bundles.MODEL_FILE, folder / bundles.ENGINE_FILE, build)
    return {"built": True, "file": bundles.ENGINE_FILE, **facts}


def _io(model: onnx.ModelProto) -> dict:
    inits = {t.name for t in model.graph.initializer}

    def describe(v):
        t = v.type.tensor_type
        # a symbolic dim is kept by name; shape inference's expressions of one ("((width - 1)//2) + 1...")
        # are shown as "?"
        dims = [d.dim_value if d.HasField("dim_value") else
                (d.dim_param if d.dim_param.replace(".", "_").isidentifier() else "?") for d in t.shape.dim]
        return {"name": v.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name,
                "shape": dims}

    return {"inputs": [describe(v) for v in model.graph.input if v.name not in inits],
            "outputs": [describe(v) for v in model.graph.output]}


def _versions(engine: dict | None) -> dict:
    import onnxruntime
    import onnxslim

    # the TensorRT that built this bundle's engine, if one did: one installed but unused made nothing here (and
    # loading TensorRT-RTX's libraries only to read its version takes seconds)
    family, version = (engine or {}).get("family"), (engine or {}).get("version")
    return {"jetpipe": __version__, "python": platform.python_version(), "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "onnxslim": onnxslim.__version__,
            "numpy": np.__version__, "tensorrt": version if family == "tensorrt" else None,
            "tensorrt_rtx": version if family == "tensorrt-rtx" else None}


def _manifest(opts, prepared, model, excluded, calibration, check, engine, batch_proof) -> dict:
    return {
        "format": bundles.FORMAT_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": {"path": str(Path(opts.model).resolve()), "sha256": prepared.source_sha256},
        "model": bundles.MODEL_FILE,
        "task": opts.task,
        "labels": list(opts.labels) if opts.labels else None,
        "metadata": kept_metadata(prepared.metadata),  # what the task is recognized and laid out by, at serve
        "precision": opts.precision,
        "excluded_nodes": excluded,
        "io": _io(model),
        "batch": {"min": 1, "max": opts.max_batch, **(batch_proof or {}),
                  **({"moved_batch_axes": moved} if (moved := prepared.batch_layout.get("moved_batch_axes")) else {})},
        "cleanup": prepared.cleanup,
        "input_size": list(prepared.size_hw),
        **({"input_width_range": list(prepared.width_range)} if prepared.width_range else {}),
        "preprocess": opts.spec.to_dict(),
        "calibration": calibration.summary() if calibration is not None else None,
        "accuracy_check": check,
        "engine": engine,
        "versions": _versions(engine),
    }


def _progress(opts, total: int, what: str):
    return bar(total, what, "img" if what == "calibrating" else "node", opts.progress)
