"""The bundle measured through the runtime that serves it (`calibrate accuracy --backend`), like Polygraphy's
comparator runs any backend: on a Jetson this is the TensorRT engine's accuracy, not its ONNX graph's.

Each sample becomes the frame a source hands serve (NV12, as decoders and cameras deliver it), the runtime
preprocesses it as serve does (the fused GPU kernel from YUV on the GPU runtime, the CPU path on the CPU one)
and runs it; the FP32 reference reads the same NV12 frames through the CPU path. The difference therefore
holds everything serve adds to the ONNX graph's error: the engine's kernels and precision, and the GPU
preprocessing against its CPU reference.
"""

from __future__ import annotations

import numpy as np

from jetpipe.convert.calib_data import NpyTensors
from jetpipe.errors import JetpipeError
from jetpipe.frames import from_bgr
from jetpipe.preprocess import preprocess_frame
from jetpipe.runtime.api import Frame
from jetpipe.spec import PreprocessSpec

SERVED_FORMAT = "nv12"  # what NVDEC, V4L2 and the FFmpeg path hand the runtime
NOT_FRAMES = ("--backend needs images or video frames (a .npy file of tensors skips the preprocessing serve "
              "runs): pass a folder of images, a video or 'synthetic'")


def served_frames(source) -> list[np.ndarray]:
    """The data's images as NV12 frames (sides cut to even: 4:2:0 halves them)."""
    frames = []
    if isinstance(source, NpyTensors):
        raise JetpipeError(NOT_FRAMES)
    for image in source.frames():
        height, width = image.shape[0] // 2 * 2, image.shape[1] // 2 * 2
        if height and width:
            frames.append(from_bgr(np.ascontiguousarray(image[:height, :width]), SERVED_FORMAT))
    if not frames:
        raise JetpipeError(NOT_FRAMES)
    return frames


def reference_inputs(frames: list[np.ndarray], size_hw, spec: PreprocessSpec) -> np.ndarray:
    """The NV12 frames through the CPU path: what the FP32 reference reads."""
    return np.stack([preprocess_frame(frame, SERVED_FORMAT, tuple(size_hw), spec)[0] for frame in frames])


def runtime_outputs(runtime, frames: list[np.ndarray], output_names: list[str]) -> list[np.ndarray]:
    """Every frame through `runtime` in batches of its max batch; the outputs in the model's order (copied:
    a runtime's result buffers are reused by its next batch)."""
    collected: list[list[np.ndarray]] = [[] for _ in output_names]
    step = runtime.max_batch
    for start in range(0, len(frames), step):
        batch = [Frame(frame, SERVED_FORMAT) for frame in frames[start:start + step]]
        result = runtime.infer(batch)
        if result.rejected:
            index, why = result.rejected[0]
            raise JetpipeError(f"--backend {runtime.backend_name}: sample {start + index} was refused: {why}")
        for kept, name in zip(collected, output_names):
            kept.append(np.array(result.outputs[name], copy=True))
    return [np.concatenate(parts) for parts in collected]
