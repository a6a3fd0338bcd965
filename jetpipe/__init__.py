"""jetpipe: an edge deployment pipeline for NVIDIA Jetson and desktop GPUs.

Importing jetpipe needs neither CUDA, PyCUDA nor TensorRT, and creates no CUDA
context: GPU modules are imported where they are used.
"""

__version__ = "0.1.0"

from jetpipe.errors import BundleError, CalibrationError, EngineError, JetpipeError, ModelError
from jetpipe.spec import PreprocessSpec

__all__ = ["BundleError", "CalibrationError", "EngineError", "JetpipeError", "ModelError",
           "PreprocessSpec", "__version__", "iter_results"]


def iter_results(config, waiting: int = 64):
    """Run a pipeline (a PipelineConfig, or the path of a jetpipe.toml) and iterate its records in one's own
    program: `for record in jetpipe.iter_results(config): ...` (jetpipe/pipelines/embed.py; docs/serve.md)."""
    from jetpipe.pipelines.embed import iter_results as run

    return run(config, waiting)
