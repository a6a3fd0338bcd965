"""Lazy imports of heavy third-party packages (Polygraphy's `mod.lazy_import` is the model).

jetpipe's own modules import each other at the top; a package that costs start-up time
(OpenCV: about 0.5 s, ONNX Runtime) is bound at the top too, but only loaded the first
time one of its attributes is used, so `jetpipe --help` or `jetpipe inspect` stays quick.
Optional GPU packages (PyCUDA, TensorRT, PyNvVideoCodec) keep their own import functions,
which turn a missing package into an install hint.
"""

from __future__ import annotations

import importlib
import types


class LazyModule(types.ModuleType):
    """Stands for a module until first use, then forwards every attribute to it."""

    def __init__(self, name: str):
        super().__init__(name)
        self._module = None

    def _load(self):
        if self._module is None:
            self._module = importlib.import_module(self.__name__)
        return self._module

    def __getattr__(self, attr: str):
        if attr == "__path__":
            raise AttributeError(attr)  # not a package to importlib's eyes until loaded
        return getattr(self._load(), attr)


def lazy_import(name: str) -> LazyModule:
    return LazyModule(name)


def load(module: LazyModule) -> None:
    """The module imported now (at start-up, where its first use would import it in the middle of serving); that
    first use then only binds it."""
    importlib.import_module(module.__name__)
