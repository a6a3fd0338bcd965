"""jetpipe: an edge deployment pipeline for NVIDIA Jetson and desktop GPUs.

Importing jetpipe needs neither CUDA, PyCUDA nor TensorRT, and creates no CUDA
context: GPU modules are imported where they are used.
"""

__version__ = "0.1.0"

from jetpipe.errors import BundleError, CalibrationError, EngineError, JetpipeError, ModelError
from jetpipe.spec import PreprocessSpec

__all__ = ["BundleError", "CalibrationError", "EngineError", "JetpipeError", "ModelError",
           "PreprocessSpec", "__version__", "iter_results"]


def __getattr__(name: str):
    """jetpipe.iter_results, the embedded API (jetpipe/pipelines/service/embed.py; docs/serve.md), loaded when first
    asked for: `import jetpipe` stays light (no OpenCV, no ONNX Runtime), and the package's root, like the CLI,
    stands above every layer."""
    if name == "iter_results":
        from importlib import import_module

        return import_module("jetpipe.pipelines.service.embed").iter_results
    raise AttributeError(f"module 'jetpipe' has no attribute {name!r}")
