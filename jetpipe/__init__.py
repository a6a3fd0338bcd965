"""jetpipe: an edge deployment pipeline for NVIDIA Jetson and desktop GPUs.

Importing jetpipe needs neither CUDA, PyCUDA nor TensorRT, and creates no CUDA
context: GPU modules are imported where they are used.
"""

__version__ = "0.1.0"

from jetpipe.errors import BundleError, CalibrationError, EngineError, JetpipeError, ModelError
from jetpipe.spec import PreprocessSpec

__all__ = ["BundleError", "CalibrationError", "EngineError", "JetpipeError", "ModelError",
           "PreprocessSpec", "__version__"]
