"""Human-readable bundle summaries for `convert` and `inspect`."""

from __future__ import annotations

from pathlib import Path


def _tensor(t: dict) -> str:
    return f"{t['name']} {t['dtype']} [{', '.join(str(d) for d in t['shape'])}]"


def summary_lines(path: Path, m: dict) -> list[str]:
    size = sum(p.stat().st_size for p in Path(path).iterdir() if p.is_file()) if Path(path).is_dir() else 0
    lines = [f"bundle    {path} ({size / 1e6:.1f} MB)",
             f"source    {m['source']['path']} (sha256 {m['source']['sha256'][:12]})",
             f"precision {m['precision']}" + (f", task {m['task']}" if m.get("task") else "")]
    lines += [f"input     {_tensor(t)}" for t in m["io"]["inputs"]]
    lines += [f"output    {_tensor(t)}" for t in m["io"]["outputs"]]
    batch = m["batch"]
    proof = " (made dynamic, batch-N == N x batch-1 checked)" if batch.get("made_dynamic") else ""
    lines.append(f"batch     1..{batch['max']}{proof}")
    pre = m["preprocess"]
    lines.append(f"preproc   {pre['channel_order']} {pre['resize']} scale {pre['scale']:.5g} "
                 f"mean {pre['mean']} std {pre['std']} pad {pre['pad_value']:g}")
    excluded = m.get("excluded_nodes") or {}
    if excluded:
        shown = ", ".join(list(excluded)[:4]) + (" ..." if len(excluded) > 4 else "")
        lines.append(f"float     {len(excluded)} node(s) kept in higher precision: {shown}")
    calib = m.get("calibration")
    if calib:
        what = (f"{calib['method']} INT8 ranges for {calib['int8_ranges']} tensors" if calib["int8_ranges"]
                else f"activation ranges of {calib['observed_tensors']} tensors")
        skipped = f", {calib['skipped']} unreadable skipped" if calib["skipped"] else ""
        lines.append(f"calib     {calib['samples']} samples{skipped}: {what}")
    check = m.get("accuracy_check")
    if check:
        lines.append(f"vs fp32   {_check_text(check)}")
    cost = m.get("cost")
    if cost:
        src, out = cost["source"], cost["processed"]
        line = f"weights   {out['params'] / 1e6:.2f} M params, {out['flops'] / 1e9:.2f} GFLOPs per image"
        if out["nonzero_weights"] != src["nonzero_weights"]:
            line += f", non-zero weights {src['nonzero_weights']:,} -> {out['nonzero_weights']:,}"
        lines.append(line)
    pruning = m.get("pruning")
    if pruning:
        lines.append(f"pruning   {pruning['method']} {pruning['ratio']:g} ({pruning.get('allocation', 'uniform')}): "
                     f"{len(pruning['pruned'])} channel group(s) "
                     f"pruned, {len(pruning['skipped'])} left alone; params {cost['source']['params'] / 1e6:.2f} M"
                     f" -> {cost['processed']['params'] / 1e6:.2f} M, GFLOPs {cost['source']['flops'] / 1e9:.2f}"
                     f" -> {cost['processed']['flops'] / 1e9:.2f}")
        if pruning.get("check"):
            lines.append(f"pruned    vs unpruned: {_check_text(pruning['check'])}")
    sparsity = m.get("sparsity")
    if sparsity:
        pruned = sum(1 for v in sparsity["layers"].values() if v == "2:4")
        lines.append(f"sparsity  {sparsity['pattern']} on {pruned} of {len(sparsity['layers'])} weight layers "
                     "(SPARSE_WEIGHTS for TensorRT)")
    engine = m["engine"]
    if engine.get("built"):
        if engine.get("family") == "tensorrt-rtx":
            lines.append(f"engine    {engine['file']} (TensorRT-RTX {engine['version']}, built ahead of time for "
                         f"{', '.join(engine['targets'])})")
        else:
            lines.append(f"engine    {engine['file']} (TensorRT {engine['tensorrt']}, "
                         f"sm {engine.get('compute_capability')})")
    else:
        lines.append(f"engine    none: {engine['reason']}")
    return lines


def print_summary(path: Path, manifest: dict) -> None:
    print("\n".join(summary_lines(path, manifest)))


def _check_text(check: dict) -> str:
    """'text-detection box_f1 1, f1 0.99; relative MAE 2.24e-02, max abs error 1 on 8 held-out samples'
    (+ the warning, loud): the task's own metrics first (older bundles have none)."""
    kind = "held-out" if check.get("held_out") else "calibration"
    metrics = check.get("task_metrics") or {}
    task = f"{check['task']} " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()) + "; " if metrics else ""
    text = (f"{task}relative MAE {check['relative_mae']:.2e}, max abs error {check['max_abs_error']:.3g} on "
            f"{check['samples']} {kind} samples")
    if not check.get("held_out"):  # in-sample figures flatter: say how to get held-out ones
        text += " (in-sample: images beyond --calib-size are held out for this check)"
    return text + (f"  <- WARNING: {check['warning']}" if check.get("warning") else "")
