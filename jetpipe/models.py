"""Built-in models shipped by registry packages (no downloads at run time)."""

from __future__ import annotations

import difflib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from jetpipe.errors import ModelError


@dataclass(frozen=True)
class BuiltinModel:
    package: str
    relative_path: str
    preset: str
    input_size: tuple[int, int]
    task: str
    width_range: tuple[int, int] | None = None  # (min, max) of a dynamic width; input_size has the opt width
    labels: tuple[str, ...] | None = None       # where the model's metadata has none

    def path(self) -> Path:
        spec = importlib.util.find_spec(self.package)  # locate without importing (it pulls cv2 etc.)
        if spec is None or not spec.submodule_search_locations:
            raise ModelError(f"the built-in model needs the package {self.package!r}: "
                             f"pip install 'jetpipe[models]'")
        path = Path(next(iter(spec.submodule_search_locations))) / self.relative_path
        if not path.is_file():
            raise ModelError(f"{path} is missing from {self.package}: reinstall it")
        return path


BUILTIN = {
    "ppocr-det": BuiltinModel("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx",
                              preset="ppocr-det", input_size=(640, 640), task="text-detection"),
    # text lines 48 high, 80 to 960 wide (fed at 320); the alphabet is in the model's metadata
    "ppocr-rec": BuiltinModel("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx", preset="ppocr-rec",
                              input_size=(48, 320), task="text-recognition", width_range=(80, 960)),
    # the direction classifier: is a text line upside down?
    "ppocr-cls": BuiltinModel("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                              preset="ppocr-rec", input_size=(48, 192), task="classification", labels=("0", "180")),
}
DEFAULT_MODEL = "ppocr-det"


def resolve(name_or_path: str) -> tuple[Path, BuiltinModel | None]:
    """A file path, or the name of a built-in model."""
    path = Path(name_or_path)
    if not path.exists() and name_or_path not in BUILTIN and path.suffix.lower() != ".onnx":
        close = difflib.get_close_matches(name_or_path, list(BUILTIN), n=1)
        if close:
            raise ModelError(f"model {name_or_path!r} not found: did you mean the built-in {close[0]!r}?")
    if path.exists() or name_or_path not in BUILTIN:
        return path, None
    builtin = BUILTIN[name_or_path]
    return builtin.path(), builtin
