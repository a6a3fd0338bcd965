"""Build step: ONNX -> cleaned -> FP16 / INT8 -> TensorRT engine -> bundle (no CUDA imports)."""

from jetpipe.convert.chain import ConvertOptions, convert

__all__ = ["ConvertOptions", "convert"]
