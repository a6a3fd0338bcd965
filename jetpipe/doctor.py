"""`jetpipe doctor`: what this machine can run, without creating a CUDA context."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from importlib import metadata

from jetpipe import __version__
from jetpipe.runtime.probe import probe_gpu
from jetpipe.runtime.trt_builder import import_family, import_tensorrt
from jetpipe.runtime.trt_selftest import run_rtx_build_check, run_selftest


def _line(label: str, value: str) -> None:
    print(f"{label:<13}{value}")


def _onnxruntime() -> str:
    try:
        import onnxruntime as ort
    except ImportError:
        return "not installed (pip install onnxruntime)"
    return f"{ort.__version__}, providers: {', '.join(ort.get_available_providers())}"


def _gpu() -> tuple[str, str]:
    """(PyCUDA line, GPU line); driver queries only, no context."""
    facts = probe_gpu()
    if facts.pycuda is None:
        return "not installed (pip install 'jetpipe[gpu]')", "unknown without PyCUDA"
    if not facts.usable:
        return facts.pycuda, facts.reason
    kind = "integrated (Jetson-style, zero-copy frames)" if facts.integrated else "discrete (staged copies)"
    return facts.pycuda, (f"{facts.name}, sm {facts.compute_capability}, {facts.total_memory_mib} MiB, {kind}")


def _nvcc() -> str:
    path = shutil.which("nvcc")
    if path is None:
        return "not found (needed to compile the preprocessing kernels; install the CUDA toolkit)"
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    return f"{path} ({out[-1] if out else 'unknown version'})"


def _package(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _hwaccels() -> str:
    try:
        from av.codec.hwaccel import hwdevices_available
    except ImportError as exc:
        return f"unknown: {exc}"
    return ", ".join(hwdevices_available()) or "none"


def _video() -> str:
    """Which decoders `--decoder auto` can pick from here (nothing is imported or started)."""
    pyav, nvdec = _package("av"), _package("pynvvideocodec")
    parts = [f"files in-process: PyAV {pyav} (hwaccel: {_hwaccels()})" if pyav else
             "PyAV not installed (pip install av)",
             "streams: ffmpeg" if shutil.which("ffmpeg") else "ffmpeg not found (apt install ffmpeg)",
             f"NVDEC: PyNvVideoCodec {nvdec}" if nvdec else "NVDEC: not installed (pip install 'jetpipe[nvdec]')"]
    if shutil.which("gst-launch-1.0"):
        parts.append("GStreamer: gst-launch-1.0")
    return "; ".join(parts)


def run_doctor(trt_selftest: bool = False) -> int:
    _line("jetpipe", __version__)
    _line("python", f"{platform.python_version()} ({sys.executable})")
    _line("platform", f"{platform.system()} {platform.machine()}")
    _line("onnxruntime", _onnxruntime())
    pycuda_line, gpu_line = _gpu()
    _line("pycuda", pycuda_line)
    _line("gpu", gpu_line)
    trt = import_tensorrt()
    _line("tensorrt", trt.__version__ if trt else "not installed (bundles are written without engines)")
    rtx = import_family("tensorrt-rtx")
    _line("tensorrt-rtx", f"{rtx.__version__} (convert --engine-family tensorrt-rtx)" if rtx else "not installed")
    _line("nvcc", _nvcc())
    _line("video", _video())
    if not trt_selftest:
        return 0
    if trt is None and rtx is None:
        print("error: --trt needs TensorRT or TensorRT-RTX installed", file=sys.stderr)
        return 2

    return run_selftest() if trt is not None else run_rtx_build_check()
