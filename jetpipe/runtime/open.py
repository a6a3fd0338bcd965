"""Which runtime serves a bundle here: open_runtime picks the GPU runtime (gpu_runtime: the fused kernel + ONNX
Runtime CUDA, TensorRT or a Triton server) where the machine has one, else the CPU runtime (cpu_runtime), and
logs why. A runtime: a bundle + max batch -> infer(frames) / submit(frames) + collect(ticket)."""

from __future__ import annotations

import logging

from jetpipe.errors import JetpipeError
from jetpipe.runtime.cpu_runtime import CpuRuntime
from jetpipe.runtime.cuda import GpuUnavailable
from jetpipe.runtime.gpu_runtime import GpuRuntime, pick_gpu_backend
from jetpipe.runtime.triton_backend import (
    PREPROCESS_PLACES,
    SHM_MODES,
    is_triton,
    parse_uri,
    preprocess_place,
)

log = logging.getLogger(__name__)

BACKENDS = ("auto", "tensorrt", "tensorrt-rtx", "onnxruntime-cuda", "onnxruntime-cpu")
BACKEND_HELP = (" | ".join(BACKENDS) + f" | triton://HOST:PORT/NAME[?shm={'|'.join(SHM_MODES)}"
                f"&preprocess={'|'.join(PREPROCESS_PLACES)}]")
_CPU_CANNOT_REDUCE = ("postprocessing on the GPU needs the GPU runtime: use postprocess auto or cpu "
                      "(--postprocess) with the CPU runtime")


def check_backend(backend: str) -> str:
    """A backend name, or a Triton server's model (triton://HOST:PORT/NAME); anything else is one line."""
    if is_triton(backend):
        parse_uri(backend)
    elif backend not in BACKENDS:
        raise JetpipeError(f"backend {backend!r}: choose one of {BACKEND_HELP}")
    return backend


def open_runtime(bundle_dir, max_batch: int | None = None, backend: str = "auto", memory: str = "auto",
                 **gpu_options):
    """The best runtime this machine offers for the bundle (or the one asked for); logs the choice.
    cpu_threads: the CPU runtime's intra-op threads (0: a thread a core); the GPU runtime ignores it."""
    check_backend(backend)
    cpu_options = {k: v for k, v in gpu_options.items() if k == "buffer_sets"}  # one model instance there
    cpu_options["threads"] = gpu_options.pop("cpu_threads", 0)
    reduction = gpu_options.get("reduction")
    if reduction is not None and reduction.required and backend == "onnxruntime-cpu":
        raise JetpipeError(_CPU_CANNOT_REDUCE)
    if backend == "onnxruntime-cpu":
        return _chosen(CpuRuntime(bundle_dir, max_batch, backend=backend, **cpu_options), "requested")
    if is_triton(backend):
        return _remote(bundle_dir, max_batch, backend, memory, gpu_options, cpu_options)
    try:
        gpu_backend = pick_gpu_backend(bundle_dir, backend)
        return _chosen(GpuRuntime(bundle_dir, max_batch, backend=gpu_backend, memory=memory, **gpu_options),
                       "requested" if backend != "auto" else "auto")
    except GpuUnavailable as exc:
        if backend != "auto":
            raise
        if reduction is not None and reduction.required:
            raise JetpipeError(f"{_CPU_CANNOT_REDUCE} ({exc})") from None
        return _chosen(CpuRuntime(bundle_dir, max_batch, **cpu_options), f"auto; no GPU runtime: {exc}")


def _remote(bundle_dir, max_batch, backend: str, memory: str, gpu_options: dict, cpu_options: dict):
    """A Triton server's model, the frames preprocessed by the GPU runtime's kernel where this machine has a
    GPU (PyCUDA), else on the CPU path (?preprocess=gpu|cpu decides)."""
    place = preprocess_place(backend)
    try:
        if place == "cpu":
            raise GpuUnavailable("?preprocess=cpu")
        return _chosen(GpuRuntime(bundle_dir, max_batch, backend=backend, memory=memory, **gpu_options),
                       "requested; frames preprocessed on this GPU")
    except GpuUnavailable as exc:
        if place == "gpu":
            raise
        reduction = gpu_options.get("reduction")
        if reduction is not None and reduction.required:
            raise JetpipeError(f"{_CPU_CANNOT_REDUCE} ({exc})") from None
        return _chosen(CpuRuntime(bundle_dir, max_batch, backend=backend, **cpu_options),
                       f"requested; frames preprocessed on the CPU: {exc}")


def _chosen(runtime, why: str):
    log.info("runtime backend: %s (%s)", runtime.backend_name, why)
    return runtime
