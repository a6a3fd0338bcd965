"""embedding: [N, D] (or [N, D, 1, 1]) features -> one unit vector a crop, for telling objects apart.

A re-identification model (OSNet-like: the user brings it, `convert --task embedding`) or the tracker's
built-in colour cue. Never recognized unasked: a classifier's [N, C] has the same shape. Records:
"embedding", the unit vector (float16 precision). Metric against FP32: the lowest cosine similarity of a
crop's two vectors (an average would hide the one crop a quantized model gets wrong).
"""

from __future__ import annotations

import numpy as np

from jetpipe.tasks.base import ModelFacts, Task, TaskOptions, known

MIN_DIM, MAX_DIM = 8, 8192  # an embedding's length: fewer tells too little apart, more is not a feature vector


def unit_rows(output: np.ndarray, count: int) -> np.ndarray:
    """The first `count` rows of an embedding output as float32 unit vectors (an all-zero row stays zero)."""
    rows = np.asarray(output[:count], np.float32).reshape(count, -1)
    norm = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norm, 1e-12)


class Embedding:
    def reduction(self, required: bool = False):
        return None  # the vectors themselves come back: D floats a crop

    def __call__(self, outputs: dict, letterboxes, sizes, pool=None) -> list[dict]:
        rows = unit_rows(next(iter(outputs.values())), len(letterboxes))
        return [{"embedding": row.astype(np.float16).astype(float).tolist()} for row in rows]


class EmbeddingTask(Task):
    name = "embedding"
    metrics = {"cosine_min": ">="}
    check_bounds = {"cosine_min": 0.98}
    summary = "re-identification: [N, D] features -> a unit vector a crop (--task embedding; --reid BUNDLE)"

    def mismatch(self, facts: ModelFacts) -> str | None:
        return embedding_misfit(facts)

    def recognizes(self, facts: ModelFacts) -> bool:
        return False  # a classifier's scores have the same shape: only when asked for

    def postprocessor(self, options: TaskOptions) -> Embedding:
        return Embedding()

    def metric(self, reference: list, candidate: list, options: TaskOptions) -> dict:
        r, c = (unit_rows(outputs[0], len(outputs[0])) for outputs in (reference, candidate))
        return {"cosine_min": float(np.min(np.sum(r * c, axis=1)))}


def embedding_misfit(facts: ModelFacts) -> str | None:
    """Why the outputs are not one embedding a crop ([N, D] or [N, D, 1, 1], D from 8 to 8192), or None."""
    if len(facts.outputs) != 1:
        return f"expects one output [N, D] (a feature vector a crop), the model has {len(facts.outputs)}: " \
               f"{facts.shapes()}"
    shape = list(facts.outputs[0][1])
    if len(shape) == 4 and shape[2:] == [1, 1]:
        shape = shape[:2]
    if len(shape) != 2:
        return f"expects one output [N, D] (a feature vector a crop), found {facts.shapes()}"
    if known(shape[1]) and not MIN_DIM <= int(shape[1]) <= MAX_DIM:
        return f"its output has {shape[1]} values a crop: an embedding has {MIN_DIM} to {MAX_DIM}"
    if not known(shape[1]):
        return f"its output's length is not fixed ({facts.shapes()}): an embedding has a fixed length"
    return None
