"""PP-OCRv4 det accuracy on rendered-text images: agreement with FP32, and the task metric.

Agreement: F1 of the binarized probability map against the FP32 model's.
Task metric: detection hmean against the rendered words' boxes (a predicted box
matches one unmatched ground-truth box at IoU >= 0.5, ICDAR-style).
The evaluation images use seeds below SyntheticText.seed, so they are never
part of the default calibration set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jetpipe.preprocess import preprocess_bgr
from jetpipe.runtime.sessions import run_in_batches
from jetpipe.spec import PreprocessSpec
from jetpipe.synth import render_text_image
from jetpipe.tasks.agreement_metrics import match_boxes, mean_abs_error, per_sample_f1
from jetpipe.tasks.text_detection import TextDetection


def eval_set(count: int, size_hw: tuple[int, int], spec: PreprocessSpec, first_seed: int = 0,
             source_hw: tuple[int, int] = (480, 640)) -> tuple[np.ndarray, list, list[np.ndarray]]:
    """Network inputs, their letterboxes and the ground-truth word boxes (source pixels, x0 y0 x1 y1)."""
    inputs, boxes, truths = [], [], []
    for i in range(count):
        image = render_text_image(first_seed + i, source_hw)
        x, box = preprocess_bgr(image.bgr, size_hw, spec)
        inputs.append(x)
        boxes.append(box)
        truths.append(np.array(image.boxes, np.float64).reshape(-1, 4))
    return np.stack(inputs), boxes, truths


@dataclass
class Hmean:
    hmean: float
    precision: float
    recall: float
    predicted: int
    truths: int


def detection_hmean(predicted: list[np.ndarray], truths: list[np.ndarray], threshold: float = 0.5) -> Hmean:
    """Greedy one-to-one matching by IoU, highest first, over all images."""
    matched = sum(len(match_boxes(pred, truth, threshold)) for pred, truth in zip(predicted, truths)
                  if len(pred) and len(truth))
    n_pred, n_truth = sum(map(len, predicted)), sum(map(len, truths))
    p, r = matched / max(n_pred, 1), matched / max(n_truth, 1)
    return Hmean(2 * p * r / max(p + r, 1e-12), p, r, n_pred, n_truth)


def boxes_of(probabilities: np.ndarray, letterboxes, source_hw: tuple[int, int] = (480, 640)) -> list[np.ndarray]:
    """DB postprocessing (the pipeline's TextDetection) of (N, 1, H, W) maps -> source-pixel boxes."""

    post = TextDetection()
    return [post.one(p, box, source_hw).xyxy.astype(np.float64)
            for p, box in zip(probabilities[:, 0], letterboxes)]


def eval_inputs(count: int, size_hw: tuple[int, int], spec: PreprocessSpec, first_seed: int = 0,
                source_hw: tuple[int, int] = (480, 640)) -> np.ndarray:
    return eval_set(count, size_hw, spec, first_seed, source_hw)[0]


@dataclass
class TextDetScore:
    f1_mean: float
    f1_min: float
    mae: float
    images: int

    def line(self) -> str:
        return (f"F1 mean {self.f1_mean:.4f} min {self.f1_min:.4f}, MAE {self.mae:.2e} "
                f"({self.images} images)")


def run_batched(session, inputs: np.ndarray, batch: int = 4) -> np.ndarray:
    """The first output on `inputs`, a few rows per run."""
    return run_in_batches(session, inputs, batch)[0]


def score(reference: np.ndarray, candidate: np.ndarray) -> TextDetScore:
    f1 = per_sample_f1(reference, candidate)
    return TextDetScore(float(f1.mean()), float(f1.min()), mean_abs_error(reference, candidate), len(f1))
