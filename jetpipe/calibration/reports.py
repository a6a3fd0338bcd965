"""Report folders: report.json (stable keys), report.md, PNG plots (matplotlib, Agg).

Written into a temporary folder and renamed: an error never leaves half a report.
An existing folder is replaced only with --force and only when it is a report
(nothing in it but what write() puts there); never the bundle being measured.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from jetpipe import output_folders


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _clean(value):
    """JSON-safe: inf/nan become strings, numpy scalars plain numbers."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, (np.floating, float)):
        value = float(value)
        return value if math.isfinite(value) else str(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


REPORT_JSON, REPORT_MD = "report.json", "report.md"


def owned_files(folder: Path) -> set[str] | None:
    """What a report folder holds that write() put there (None: not a jetpipe report)."""
    try:
        report = json.loads((folder / REPORT_JSON).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or not isinstance(report.get("plots"), list):
        return None
    return {REPORT_JSON, REPORT_MD, *map(str, report["plots"])}


def check_destination(folder: Path, force: bool, bundle: Path) -> None:
    """Before any measurement: the report may replace only a report, only with --force, never the bundle."""
    output_folders.check_destination(Path(folder), force, "--report", "report", owned_files, protected=(Path(bundle),))


def write(folder: Path, report: dict, markdown: str, plots: dict) -> Path:
    """plots: file name -> callable(plt, path) drawing one figure. check_destination() ran before."""
    folder = Path(folder)
    with output_folders.staging(folder) as tmp:
        plt = _plt()
        for name, draw in plots.items():
            draw(plt, tmp / name)
            plt.close("all")
        report = {**report, "plots": sorted(plots)}
        (tmp / REPORT_JSON).write_text(json.dumps(_clean(report), indent=2) + "\n")
        (tmp / REPORT_MD).write_text(markdown)
    return folder


def bar_chart(labels, values, title, xlabel):
    def draw(plt, path):
        fig, ax = plt.subplots(figsize=(8, max(2.5, 0.32 * len(labels) + 1)))
        ax.barh(range(len(labels)), values, color="#4c72b0")
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    return draw


def histogram(values, title, xlabel):
    def draw(plt, path):
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.hist(values, bins=60, color="#dd8452", log=True)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("count (log)")
        ax.set_title(title)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    return draw


def line_chart(x, series: dict, title, xlabel, ylabel, hline=None):
    def draw(plt, path):
        fig, ax = plt.subplots(figsize=(7, 4))
        for label, ys in series.items():
            ax.plot(x, ys, marker="o", label=label)
        if hline is not None:
            ax.axhline(hline[0], color="grey", linestyle="--", label=hline[1])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    return draw


def stacked_bars(x, stages: dict, title, xlabel, ylabel):
    def draw(plt, path):
        fig, ax = plt.subplots(figsize=(7, 4))
        bottom = np.zeros(len(x))
        for label, ys in stages.items():
            ax.bar([str(v) for v in x], ys, bottom=bottom, label=label)
            bottom += np.asarray(ys, dtype=float)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    return draw
