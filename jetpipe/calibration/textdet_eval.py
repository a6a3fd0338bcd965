"""PP-OCRv4 det accuracy of a bundle against FP32 on rendered-text images.

The evaluation images use seeds below SyntheticText.seed, so they are never
part of the default calibration set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jetpipe.calibration.metrics import mean_abs_error, per_sample_f1
from jetpipe.preprocess import preprocess_bgr
from jetpipe.spec import PreprocessSpec
from jetpipe.synth import render_text_image


def eval_inputs(count: int, size_hw: tuple[int, int], spec: PreprocessSpec, first_seed: int = 0,
                source_hw: tuple[int, int] = (480, 640)) -> np.ndarray:
    return np.stack([preprocess_bgr(render_text_image(first_seed + i, source_hw).bgr, size_hw, spec)[0]
                     for i in range(count)])


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
    name = session.get_inputs()[0].name
    outs = [session.run(None, {name: inputs[i:i + batch]})[0] for i in range(0, len(inputs), batch)]
    return np.concatenate(outs)


def score(reference: np.ndarray, candidate: np.ndarray) -> TextDetScore:
    f1 = per_sample_f1(reference, candidate)
    return TextDetScore(float(f1.mean()), float(f1.min()), mean_abs_error(reference, candidate), len(f1))
