"""text-recognition: CTC text-line recognizers (PP-OCR rec, CRNN): [N, T, C] scores per time step.

The alphabet comes from the model's own metadata (`character`, as PP-OCRv4 rec ships it: the blank goes
first and a space last, as PaddleOCR adds them) or from `convert --labels FILE` (one character a line).
Greedy CTC decoding: the best class per step, repeats collapsed, blanks dropped. Records: "text" and
"score" (the mean probability of the kept steps). Metric against FP32: lines read exactly alike and the
character error rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jetpipe.runtime.api import Reduction
from jetpipe.tasks import agreement_metrics
from jetpipe.tasks.base import ModelFacts, Task, TaskOptions, known, probabilities, single_output

BLANK = 0  # CTC's blank class: PaddleOCR puts it first


def alphabet(lines, classes) -> tuple[str, ...] | None:
    """A recognizer's classes from a character list: with the blank first and a space last added as
    PaddleOCR does, or as given when it already has one entry per class (None: it fits neither)."""
    lines = tuple(lines)
    if not known(classes):
        return ("blank", *lines, " ")
    for candidate in (("blank", *lines, " "), ("blank", *lines), lines):
        if len(candidate) == classes:
            return candidate
    return None


def ctc_greedy(best: np.ndarray, scores: np.ndarray, labels: tuple[str, ...]) -> list[dict]:
    """Best class and its probability per step ([B, T] each) -> text and mean score per line."""
    keep = best != BLANK
    keep[:, 1:] &= best[:, 1:] != best[:, :-1]
    sums, counts = np.where(keep, scores, 0.0).sum(axis=1), keep.sum(axis=1)
    results, known = [], len(labels)
    for row, row_keep, total, count in zip(best.tolist(), keep.tolist(), sums.tolist(), counts.tolist()):
        # plain lists: a secondary decodes every crop of a batch here
        text = "".join(labels[i] for i, k in zip(row, row_keep) if k and i < known)
        results.append({"text": text, "score": round(total / count, 4) if count else 0.0})
    return results


@dataclass
class CTCRecognition:
    """Greedy CTC decoding. On the GPU runtime the best class of each step is found on the device (Reduction
    "best-per-step") with its row's statistics; both paths finish in `ctc_greedy`."""

    labels: tuple[str, ...]

    def __call__(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        scores = next(iter(outputs.values())).astype(np.float32, copy=False)
        best = scores.argmax(axis=2)
        top = np.take_along_axis(scores, best[..., None], axis=2)[..., 0]
        if not probabilities(scores.min(axis=2), scores.sum(axis=2, dtype=np.float64)):
            top = 1.0 / np.exp(scores - top[..., None]).sum(axis=2)  # logits: the best class's probability
        return ctc_greedy(best, top, self.labels)

    def reduction(self, required: bool = False) -> Reduction:
        return Reduction("best-per-step", {}, required)

    def reduced(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        """Finish from the GPU's best class per step and row statistics (max, min, sum, sum of exp(v - max))."""
        stats = outputs["stats"].astype(np.float64)
        top = outputs["best_value"].astype(np.float64)
        top = top / stats[..., 2] if probabilities(stats[..., 1], stats[..., 2]) else 1.0 / stats[..., 3]
        return ctc_greedy(outputs["best"], top, self.labels)


class TextRecognitionTask(Task):
    name = "text-recognition"
    metrics = {"exact": ">=", "cer": "<="}
    check_bounds = {"cer": 0.02}
    summary = "CTC text-line recognizers (PP-OCR rec): [N, T, C] -> text (alphabet from the model or --labels)"

    def mismatch(self, facts: ModelFacts) -> str | None:
        if facts.metadata.get("task"):
            return f"the model says it is an Ultralytics {facts.metadata['task']!r} model, not a text recognizer"
        shape = single_output(facts, 3, "[N, T, C] (class scores per time step)")
        if isinstance(shape, str):
            return shape
        if self.labels(facts) is None:
            given = facts.labels or tuple(facts.metadata.get("character", "").splitlines())
            if not given:
                return "needs its alphabet: the model has no `character` metadata; pass --labels FILE"
            return f"the alphabet has {len(given)} characters, which does not fit {shape[2]} classes"
        return None

    def labels(self, facts: ModelFacts) -> tuple[str, ...] | None:
        lines = facts.labels or tuple(facts.metadata.get("character", "").splitlines())
        if not lines or len(facts.outputs) != 1 or len(facts.outputs[0][1]) != 3:
            return None
        return alphabet(lines, facts.outputs[0][1][2])

    def postprocessor(self, options: TaskOptions) -> CTCRecognition:
        return CTCRecognition(options.labels or ())

    def metric(self, reference: list, candidate: list, options: TaskOptions) -> dict:
        post = self.postprocessor(options)
        ref, cand = post({"y": reference[0]}, [None] * len(reference[0]), None), \
            post({"y": candidate[0]}, [None] * len(candidate[0]), None)
        agreement = agreement_metrics.text_agreement([r["text"] for r in ref], [c["text"] for c in cand])
        return {"exact": agreement["exact"], "cer": agreement["cer"]}
