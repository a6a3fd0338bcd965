"""classification: [N, C] logits or probabilities -> the top-k classes.

Records: "classes", "scores" (probabilities; softmax of logits) and "labels" where the bundle has class
names. GPU: the "topk" reduction (k values and row statistics come back). Metric against FP32: top-1
agreement, the reference's top-1 within the top-5, and the drop in points.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jetpipe.runtime.api import Reduction
from jetpipe.tasks import agreement_metrics
from jetpipe.tasks.base import (
    ModelFacts,
    Task,
    TaskOptions,
    class_names,
    labels_misfit,
    probabilities,
    single_output,
    with_labels,
)


@dataclass
class Classification:
    top_k: int = 5
    labels: tuple[str, ...] | None = None

    def __call__(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        logits = next(iter(outputs.values())).reshape(len(letterboxes), -1).astype(np.float64)
        probs = logits if probabilities(logits, logits.sum(axis=1)) else np.exp(logits - logits.max(1, keepdims=True))
        probs = probs / probs.sum(1, keepdims=True)
        k = min(self.top_k, probs.shape[1])
        top = np.argsort(-probs, axis=1)[:, :k]
        return self._results(top, np.take_along_axis(probs, top, axis=1))

    def reduction(self, required: bool = False) -> Reduction:
        return Reduction("topk", {"k": self.top_k}, required)

    def reduced(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        """Finish from the GPU's top-k values and row statistics (max, min, sum, sum of exp(v - max))."""
        stats = outputs["stats"].astype(np.float64)
        values = outputs["top_value"].astype(np.float64)
        if probabilities(stats[:, 1], stats[:, 2]):
            probs = values / stats[:, 2:3]
        else:
            probs = np.exp(values - stats[:, 0:1]) / stats[:, 3:4]
        return self._results(outputs["top_index"], probs)

    def _results(self, top: np.ndarray, scores: np.ndarray) -> list[dict]:
        return [with_labels({"classes": t.tolist(), "scores": np.round(s, 5).tolist()}, self.labels)
                for t, s in zip(top, scores)]


class ClassificationTask(Task):
    name = "classification"
    class_ids = True
    metrics = {"top1": ">=", "top5": ">=", "top1_drop": "<="}
    check_bounds = {"top1": 0.9}
    summary = "classifiers: [N, C] scores -> top-5 classes (names from the model or --labels)"

    def mismatch(self, facts: ModelFacts) -> str | None:
        if facts.metadata.get("task") not in (None, "classify"):
            return f"the model says it is an Ultralytics {facts.metadata['task']!r} model, not a classifier"
        shape = single_output(facts, 2, "[N, C] (class scores)")
        return shape if isinstance(shape, str) else labels_misfit(facts, shape[1])

    def labels(self, facts: ModelFacts) -> tuple[str, ...] | None:
        return facts.labels or class_names(facts.metadata)

    def postprocessor(self, options: TaskOptions) -> Classification:
        return Classification(labels=options.labels)

    def metric(self, reference: list, candidate: list, options: TaskOptions) -> dict:
        r, c = reference[0], candidate[0]
        top1 = agreement_metrics.topk_agreement(r, c, 1)
        return {"top1": top1, "top5": agreement_metrics.topk_agreement(r, c, 5), "top1_drop": (1 - top1) * 100}
