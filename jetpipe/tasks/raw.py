"""raw: any outputs, no meaning attached: each output's shape and a few statistics per frame.

What a model no task fits is served as (said at convert and at start-up). Metric against FP32: the
relative mean absolute error of each output (the worst one bounds a budget).
"""

from __future__ import annotations

from jetpipe.tasks.agreement_metrics import relative_mae
from jetpipe.tasks.base import ModelFacts, Task, TaskOptions


class Raw:
    """Output tensors' shapes and a few statistics (the tensors stay on the device side)."""

    def reduction(self, required: bool = False):
        return None

    def __call__(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        return [{name: {"shape": list(arr.shape[1:]), "mean": float(arr[i].mean()),
                        "max": float(arr[i].max())} for name, arr in outputs.items()}
                for i in range(len(letterboxes))]


class RawTask(Task):
    name = "raw"
    metrics = {"rel_mae_max": "<="}
    check_bounds = {"rel_mae_max": 0.1}  # each output on its own: a small one is not averaged away
    summary = "any outputs: shapes and statistics per frame, no meaning attached"

    def mismatch(self, facts: ModelFacts) -> str | None:
        return None

    def recognizes(self, facts: ModelFacts) -> bool:
        return False  # the fallback, never a finding

    def postprocessor(self, options: TaskOptions) -> Raw:
        return Raw()

    def metric(self, reference: list, candidate: list, options: TaskOptions) -> dict:
        return {"rel_mae_max": max(relative_mae([r], [c]) for r, c in zip(reference, candidate))}
