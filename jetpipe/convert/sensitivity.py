"""Measured sensitivity: which quantized nodes hurt the outputs most.

Each candidate is quantized alone (everything else float) and the output error
against FP32 is measured on held-out samples; the nodes that stand out are kept
in higher precision. ~64 short runs for PP-OCRv4 det (15 s on 2 CPU cores).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import onnx

from jetpipe.convert import int8
from jetpipe.runtime.sessions import cpu_session
from jetpipe.tasks.agreement_metrics import relative_mae

log = logging.getLogger(__name__)


def rank_int8_nodes(model: onnx.ModelProto, full: int8.QuantPlan, ranges: dict[str, float],
                    samples: np.ndarray, input_name: str, progress=None,
                    channel_means: dict[str, np.ndarray] | None = None) -> dict[str, float]:
    """Output error when each quantized node is the only one quantized."""
    reference = cpu_session(model).run(None, {input_name: samples})
    errors = {}
    for name in full.nodes:
        alone = int8.plan(model, set(full.nodes) - {name})
        quantized = int8.quantize(model, alone, ranges, channel_means)
        errors[name] = relative_mae(reference, cpu_session(quantized).run(None, {input_name: samples}))
        if progress is not None:
            progress.update(1)
    return errors


def pick_sensitive(errors: dict[str, float], max_fraction: float = 0.08,
                   outlier_factor: float = 2.0) -> dict[str, str]:
    """Nodes whose error is an outlier (> factor x median), at most max_fraction of them."""
    if not errors:
        return {}
    median = float(np.median(list(errors.values())))
    limit = max(1, math.ceil(max_fraction * len(errors)))
    ranked = sorted(errors, key=errors.get, reverse=True)[:limit]
    return {n: f"sensitivity {errors[n]:.2e} > {outlier_factor:g}x median {median:.2e}"
            for n in ranked if errors[n] > outlier_factor * median}
