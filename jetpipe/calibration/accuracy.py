"""`jetpipe calibrate accuracy`: a bundle against its FP32 reference on real data.

The reference is the source model prepared exactly as `convert` prepared it
(same input size, batch axis, clean-up, opset), so tensor names match across
the two graphs: per-layer error is localised by name across Q/DQ and Cast
insertions. With a budget (`f1>=0.99`, `top1_drop<=0.5`, ...), a precision
search finds a small set of nodes to keep in higher precision that meets it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from jetpipe import bundle as bundles
from jetpipe.calibration import comparison as m
from jetpipe.calibration import reports, served
from jetpipe.calibration.evaluate import Context, compare, run_outputs
from jetpipe.calibration.layers import localise
from jetpipe.calibration.search import search
from jetpipe.convert.calib_data import open_source
from jetpipe.convert.chain import prepare
from jetpipe.errors import JetpipeError
from jetpipe.progress import bar
from jetpipe.runtime.open import open_runtime
from jetpipe.spec import PreprocessSpec
from jetpipe.tasks import Task, for_bundle
from jetpipe.tasks.agreement_metrics import meets

log = logging.getLogger(__name__)

@dataclass
class AccuracyOptions:
    bundle: Path
    data: str
    report: Path
    reference: Path | None = None
    task: str | None = None
    samples: int = 32
    batch: int = 4
    provider: str = "cpu"          # cpu | cuda
    backend: str | None = None     # measure the bundle through this runtime (served.py), not its ONNX graph
    budget: str | None = None
    search: bool = True
    force: bool = False            # replace an existing report
    max_search_nodes: int = 32
    layers: bool = True
    progress: bool = True
    extra: dict = field(default_factory=dict)


def prepare_context(opts: AccuracyOptions) -> Context:
    manifest = bundles.load(opts.bundle)
    task, options = for_bundle(manifest, opts.task, "--task")
    _check_budget_metric(opts.budget, task)
    source = Path(opts.reference or manifest["source"]["path"])
    if not source.is_file():
        raise JetpipeError(f"reference model {source} not found: pass --reference MODEL.onnx (the FP32 model)")
    widths = manifest.get("input_width_range")
    prepared = prepare(source, manifest["precision"], tuple(manifest["input_size"]), manifest["batch"]["max"],
                       tuple(widths) if widths else None)
    _check_same_io(prepared.model, manifest, source)
    spec = PreprocessSpec.from_dict(manifest["preprocess"])
    data = open_source(opts.data, tuple(prepared.input.dims), tuple(manifest["input_size"]), spec, opts.samples)
    frames = None
    if opts.backend is not None:
        frames = served.served_frames(data)
        inputs = served.reference_inputs(frames, manifest["input_size"], spec)
    else:
        inputs = np.concatenate(list(data.batches(opts.batch)))
    if data.skipped:
        log.warning("%d unreadable items in %s skipped", data.skipped, opts.data)
    return Context(manifest, prepared.model, str(Path(opts.bundle) / bundles.MODEL_FILE), inputs,
                   prepared.input.name, task, options, opts.provider, frames=frames)


def _check_same_io(reference: onnx.ModelProto, manifest: dict, source: Path) -> None:
    ref_in = [i.name for i in reference.graph.input if i.name not in {t.name for t in reference.graph.initializer}]
    ref_out = [o.name for o in reference.graph.output]
    io = manifest["io"]
    want_in, want_out = [i["name"] for i in io["inputs"]], [o["name"] for o in io["outputs"]]
    if ref_in != want_in or ref_out != want_out:
        raise JetpipeError(f"reference {source} and the bundle have different I/O (reference in {ref_in} out "
                           f"{ref_out}, bundle in {want_in} out {want_out}): pass the model the bundle was made from")


def _check_budget_metric(budget: str | None, task: Task) -> None:
    """Before any evaluation: the budget's metric must be one this task reports."""
    if not budget:
        return
    metric = m.parse_budget(budget)[0]
    allowed = (*task.metrics, *m.COMMON_METRICS)
    if metric not in allowed:
        raise JetpipeError(f"--budget {budget!r}: task {task.name} does not report {metric}; it reports "
                           f"{', '.join(allowed)} (or pass --task)")


def run_accuracy(opts: AccuracyOptions) -> dict:
    """Compare, localise, search (with a budget) and write the report folder."""

    if opts.budget:
        m.parse_budget(opts.budget)  # fail before any work
    if opts.samples < 1:
        raise JetpipeError(f"--samples {opts.samples} must be at least 1")
    reports.check_destination(opts.report, opts.force, opts.bundle)
    ctx = prepare_context(opts)
    backend = "onnx graph (ONNX Runtime)"
    if opts.backend is None:
        bundle_outputs = run_outputs(ctx.processed_path, ctx)
    else:
        bundle_outputs, backend = _served_outputs(opts, ctx)
    per_output, tm = compare(ctx, outputs=bundle_outputs)
    report = {"bundle": str(opts.bundle), "precision": ctx.manifest["precision"], "task": ctx.task.name,
              "provider": ctx.provider, "measured_through": backend, "data": opts.data,
              "samples": int(len(ctx.inputs)),
              "outputs": per_output, "task_metrics": tm, "layers": [], "budget": None, "precision_search": None}
    if opts.layers:
        report["layers"] = localise(ctx.reference, onnx.load(ctx.processed_path), ctx.inputs[:1],
                                    ctx.input_name, ctx.provider)
    if opts.budget:
        metric, op, bound = m.parse_budget(opts.budget)
        met = meets(tm[metric], op, bound)
        report["budget"] = {"expression": opts.budget, "metric": metric, "value": tm[metric], "met": met}
        if not met and opts.search and ctx.manifest["precision"] in ("int8", "fp16"):
            result = search(ctx, opts.bundle, opts.budget, opts.max_search_nodes,
                            progress=lambda total, what, unit: bar(total, what, unit, opts.progress))
            report["precision_search"] = {k: getattr(result, k) for k in
                                          ("met", "value", "added", "excluded_nodes", "trials", "why")}
    plots = _accuracy_plots(ctx, report, bundle_outputs)
    reports.write(opts.report, report, accuracy_markdown(report, sorted(plots)), plots)
    return report


def _served_outputs(opts: AccuracyOptions, ctx: Context) -> tuple[list[np.ndarray], str]:
    """The bundle's outputs through the runtime serve would use (opts.backend), and what that runtime is."""
    runtime = open_runtime(opts.bundle, None, opts.backend)
    try:
        names = [o.name for o in ctx.reference.graph.output]
        outputs = served.runtime_outputs(runtime, ctx.frames, names)
        return outputs, f"{runtime.backend_name} runtime, NV12 frames preprocessed as serve does"
    finally:
        runtime.close()


def _accuracy_plots(ctx: Context, report: dict, bundle_outputs: list[np.ndarray]) -> dict:
    plots = {}
    diff = np.abs(ctx.reference_outputs()[0].astype(np.float64) - bundle_outputs[0]).ravel()
    plots["error_histogram.png"] = reports.histogram(diff, f"|{report['precision']} - fp32| of "
                                                     f"{ctx.reference.graph.output[0].name}", "absolute error")
    if report["layers"]:
        layers = report["layers"][:15]
        plots["layer_errors.png"] = reports.bar_chart([f"{r['node']} ({r['op']})" for r in layers],
                                                      [r["added_error"] for r in layers],
                                                      "error added per layer (relative L2)", "added error")
    search = report.get("precision_search")
    if search and search["trials"]:
        trials = sorted(search["trials"], key=lambda t: t["extra_nodes"])
        metric = report["budget"]["metric"]
        plots["precision_search.png"] = reports.line_chart(
            [t["extra_nodes"] for t in trials], {metric: [t[metric] for t in trials]},
            "precision search", "extra nodes kept in higher precision", metric,
            hline=(m.parse_budget(report["budget"]["expression"])[2], report["budget"]["expression"]))
    return plots


def accuracy_markdown(report: dict, plots=()) -> str:
    tm = report["task_metrics"]
    lines = [f"# Accuracy: {report['bundle']} ({report['precision']}) vs FP32", "",
             f"Task {report['task']}, {report['samples']} samples from `{report['data']}`, "
             f"the bundle measured through its {report.get('measured_through', 'onnx graph')}, "
             f"ONNX Runtime {report['provider']} for the FP32 reference.", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {v:.6g} |" for k, v in tm.items()]
    lines += ["", "| output | max abs | mean abs | cosine | SNR dB |", "|---|---|---|---|---|"]
    lines += [f"| {n} | {e['max_abs']:.4g} | {e['mean_abs']:.4g} | {e['cosine']:.6f} | {e['snr_db']:.1f} |"
              for n, e in report["outputs"].items()]
    budget = report.get("budget")
    if budget:
        verdict = "**met**" if budget["met"] else "**not met**"
        lines += ["", f"Budget `{budget['expression']}`: {budget['metric']} = {budget['value']:.6g}, {verdict}."]
    search = report.get("precision_search")
    if search:
        if search["met"]:
            lines += [f"Precision search: keeping {len(search['added'])} more node(s) in higher precision gives "
                      f"{budget['metric']} = {search['value']:.6g} (**meets** the budget): "
                      f"{', '.join(search['added'])}.",
                      "Rebuild with `jetpipe convert SOURCE -o BUNDLE --force --exclude-from THIS_REPORT_DIR`."]
        else:
            lines += [f"Precision search: **budget not reachable**: {search['why']}"]
    if report["layers"]:
        lines += ["", "Layers adding the most error themselves (relative L2 error of the layer's part of the "
                  "processed graph fed the FP32 inputs), and the error accumulated at their output:", "",
                  "| node | op | added | accumulated |", "|---|---|---|---|"]
        lines += [f"| {r['node']} | {r['op']} | {r['added_error']:.4g} | {r['output_error']:.4g} |"
                  for r in report["layers"][:10]]
    lines += ["", " ".join(f"![{p}]({p})" for p in plots)]
    return "\n".join(lines) + "\n"
