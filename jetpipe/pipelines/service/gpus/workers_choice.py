"""`workers_per_gpu = "auto"` (the default): two serving processes on a GPU where one process's CPU would be
the limit and CUDA MPS lets the two share the GPU; one otherwise.

Measured (docs/performance.md, busy scenes): with CUDA MPS running, two workers served 32 live 1080p30 cameras
at p99 25-28 ms (sparse, H100; 24 ms on an H200) against 41-78 ms in one process, and 32 dense ones (61
tracked objects a frame) at 957 of 960 frames/s with none dropped against 754-938 with drops. Without MPS two
workers take turns on the GPU: p99 204 ms against 54 (32 sparse cameras, H100). At 16 cameras one process
already held every target (0 dropped, p99 17-24 ms, dense scenes too). So two workers where MPS runs and a GPU
gets MIN_LIVE_STREAMS live streams or more (halfway between those measured), one where it does not.

Files read as fast as they decode are not counted: the engine, or NVDEC with its decode processes, is their
limit (decode_choice), and two workers were never measured with them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from jetpipe import uri as uris
from jetpipe.errors import JetpipeError
from jetpipe.pipelines.service.gpus import plan

AUTO = "auto"
AUTO_WORKERS = 2          # what auto starts on a GPU where they pay (2 is what was measured)
MIN_LIVE_STREAMS = 24     # live streams on a GPU from which one process's CPU may be the limit (16 held, 32 not)
CORES_PER_WORKER = 2      # a busy worker's post thread and capture threads take 1-2 cores (16 dense cameras)


@dataclass(frozen=True)
class WorkersChoice:
    per_gpu: int
    why: str


def choose(live_per_gpu: float, mps: str | None, refusal: str | None, cores: int, gpus: int) -> WorkersChoice:
    """Serving processes a GPU for `live_per_gpu` live streams on each of `gpus` GPUs; mps: CUDA MPS's pipe
    folder where it runs; refusal: why this configuration cannot run in workers (None: it can); cores: this
    process's CPU cores."""
    streams = f"{live_per_gpu:g} live stream(s) a GPU"
    if live_per_gpu < MIN_LIVE_STREAMS:
        return WorkersChoice(1, f"{streams}, fewer than {MIN_LIVE_STREAMS}: one serving process a GPU")
    if refusal is not None:
        return WorkersChoice(1, f"{streams}, but {refusal}: one serving process a GPU")
    if mps is None:
        return WorkersChoice(1, f"{streams}, where one process's CPU may be the limit (busy scenes), but CUDA MPS "
                                "is not running, and without it two processes take turns on a GPU (32 cameras on "
                                "an H100: p99 204 against 54 ms): one serving process a GPU; start MPS as the "
                                "GPU's owner (nvidia-cuda-mps-control -d) before serving for two")
    needed = CORES_PER_WORKER * AUTO_WORKERS * gpus
    if cores < needed:
        return WorkersChoice(1, f"{streams} and CUDA MPS running, but {cores} CPU core(s), fewer than the "
                                f"{needed} that {AUTO_WORKERS} workers on each of {gpus} GPU(s) take: one serving "
                                "process a GPU")
    return WorkersChoice(AUTO_WORKERS, f"{streams} and CUDA MPS running (its control socket in {mps}): "
                                       f"{AUTO_WORKERS} serving processes a GPU, the streams placed across them, so "
                                       "that one process's CPU is not the limit (--workers-per-gpu 1 keeps one)")


def resolve(config, gpu_count: int | None = None, cores: int | None = None) -> WorkersChoice | None:
    """config.workers_per_gpu = "auto" made a number, and why (None where it was a number already); 2 without
    --gpus serves on GPU 0 behind the face. gpu_count: how many GPUs `--gpus all` means (default: asked of the
    driver, only then); cores: this process's CPU cores (default: those it may run on)."""
    if config.workers_per_gpu != AUTO:
        return None
    gpus = _gpus_served(config.gpus, gpu_count)
    found = plan.conflict(config, "--workers-per-gpu")
    live = sum(_live(spec) for spec in config.sources)
    choice = choose(live / gpus, plan.mps_running(), found[0] if found else None,
                    _cores() if cores is None else cores, gpus)
    config.workers_per_gpu = choice.per_gpu
    if choice.per_gpu > 1 and config.gpus is None:
        config.gpus = [0]
    return choice


def _gpus_served(gpus, gpu_count: int | None) -> int:
    if gpus is None:
        return 1  # GPU 0 alone
    if gpus == "all":
        return max(plan.visible_gpus()[0] if gpu_count is None else gpu_count, 1)
    return len(gpus)


def _live(spec) -> bool:
    """A stream paced as a camera: a camera, a network stream, a synthetic one or a --realtime file."""
    if spec.realtime:
        return True
    try:
        return uris.parse(spec.uri).live
    except JetpipeError:
        return False


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
