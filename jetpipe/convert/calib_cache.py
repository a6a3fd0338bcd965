"""Stored calibration results: reused only when model, method and data all match."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from jetpipe.bundle import CALIBRATION_FILE, write_json
from jetpipe.errors import CalibrationError


@dataclass
class CalibrationResult:
    model_sha256: str
    method: str
    data_fingerprint: str
    samples: int
    skipped: int = 0
    ranges: dict[str, float] = field(default_factory=dict)   # INT8 clip value per activation
    absmax: dict[str, float] = field(default_factory=dict)   # every float activation
    auto_excluded: dict[str, str] | None = None               # measured sensitive nodes
    sensitivity: dict[str, float] = field(default_factory=dict)  # node -> output error when quantized alone
    channel_means: dict[str, list[float]] = field(default_factory=dict)  # quantized Convs' inputs: bias correction

    def key(self) -> dict:
        return {"model_sha256": self.model_sha256, "method": self.method,
                "data_fingerprint": self.data_fingerprint}

    def means(self) -> dict[str, np.ndarray]:
        return {name: np.asarray(mean, np.float32) for name, mean in self.channel_means.items()}

    def summary(self) -> dict:
        return {**self.key(), "samples": self.samples, "skipped": self.skipped,
                "int8_ranges": len(self.ranges), "observed_tensors": len(self.absmax),
                "bias_corrected_inputs": len(self.channel_means),
                "file": CALIBRATION_FILE}


def load(path: Path) -> CalibrationResult:
    if path.is_dir():
        path = path / CALIBRATION_FILE
    if not path.is_file():
        raise CalibrationError(f"calibration cache {path} not found: pass a bundle folder or its "
                               f"{CALIBRATION_FILE}")
    try:
        return CalibrationResult(**json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError) as exc:
        raise CalibrationError(f"{path} is not a jetpipe calibration file ({exc}); "
                               "drop --calib-cache to recalibrate") from exc


def mismatch(cached: CalibrationResult, wanted: dict) -> str | None:
    """Why a cached result does not fit this run (None when it does)."""
    labels = {"model_sha256": "model", "method": "calibration method",
              "data_fingerprint": "calibration data or preprocessing"}
    for key, label in labels.items():
        if getattr(cached, key) != wanted[key]:
            return f"its {label} differs ({str(getattr(cached, key))[:12]} vs {str(wanted[key])[:12]})"
    return None


def save(result: CalibrationResult, folder: Path) -> None:
    write_json(folder / CALIBRATION_FILE, asdict(result))
