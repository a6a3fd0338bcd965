"""Which GPUs serve, and which streams each serves: `--gpus`, a stream's `gpu = N` pin, placement by load.

Placement puts each stream on the GPU with the most headroom: the offered rates already placed there over
what that GPU runs (frames a second from its measured engine time where it is known; GPUs of one model are
alike until measured). Pinned streams go first, then the others from the highest rate down, so that a mix of
rates spreads evenly.
"""

from __future__ import annotations

import os
import socket

from jetpipe import uri as uris
from jetpipe.errors import JetpipeError
from jetpipe.limits import MAX_GPUS
from jetpipe.pipelines.outputs.sinks import scheme_of
from jetpipe.runtime.probe import probe_gpu
from jetpipe.runtime.triton_backend import is_triton

GPUS_HELP = "all, or GPU numbers such as 0,1"
MPS_PIPES = "/tmp/nvidia-mps"  # CUDA MPS's control socket's folder unless CUDA_MPS_PIPE_DIRECTORY says another
MPS_PROBE_S = 1.0  # the longest a connection to it is waited for
SIMULATED_ENV = "JETPIPE_SIMULATED_GPUS"  # tests: N workers on the CPU runtime stand for N GPUs
CAMERA_FPS = 30.0  # the offered rate of a source that says none (a file read as fast as it decodes, a camera)


class GpuError(JetpipeError):
    """--gpus or a stream's pin asks for what this machine or configuration cannot do."""


def parse(value, where: str) -> list[int] | str:
    """`all`, a list of GPU numbers, or their text (`0,1`): 'all' or the numbers, each once."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "all":
            return "all"
        parts = [p.strip() for p in text.split(",")]
        if not all(p.isdigit() for p in parts):
            raise GpuError(f"{where}: gpus = {value!r}: {GPUS_HELP}")
        value = [int(p) for p in parts]
    if (not isinstance(value, list) or not value or any(isinstance(g, bool) or not isinstance(g, int) for g in value)
            or len(set(value)) != len(value) or not all(0 <= g < MAX_GPUS for g in value)):
        raise GpuError(f"{where}: gpus = {value!r}: {GPUS_HELP}, each from 0 to {MAX_GPUS - 1} and once")
    return list(value)


def check(config, where: str, flag: str = "--gpus") -> None:
    """What --gpus (or flag, --workers-per-gpu, which implies it) cannot go with, said before anything opens (the
    GPUs themselves are looked at by resolve)."""
    pinned = [s for s in config.sources if s.gpu is not None]
    if config.gpus is None:
        if pinned:
            raise GpuError(f"{where}: source {pinned[0].uri!r}: gpu = {pinned[0].gpu} places it on one of the GPUs "
                           "serve runs on: add --gpus (e.g. --gpus all)")
        return
    found = conflict(config, flag)
    if found is not None:
        reason, fix = found
        raise GpuError(f"{where}: {reason}: {fix}")


def conflict(config, flag: str) -> tuple[str, str] | None:
    """What in this configuration cannot run in worker processes (which `flag` asks for), as (the reason, its
    fix); None where nothing."""
    if config.backend == "onnxruntime-cpu":
        return (f"{flag} runs a pipeline on each GPU; backend onnxruntime-cpu runs on the CPU",
                f"drop {flag}, or use backend auto")
    if is_triton(config.backend):
        return (f"{flag} with a Triton backend: the server places the model on its GPUs (jetpipe export triton "
                "--gpus)", f"drop {flag} here")
    for sink in config.sinks:
        if scheme_of(sink) == "rtsp":
            return (f"sink {sink}: an RTSP server serves one process's frames, and with {flag} each worker's "
                    "frames stay in it", f"drop the rtsp sink or {flag}")
    return None


def resolve(asked, config, where: str) -> list[int]:
    """The GPU numbers to serve on: `all` of them, or those asked, each present on this machine; a stream's
    pin among them."""
    count, name = visible_gpus()
    if count == 0:
        raise GpuError(f"{where}: --gpus: {name}")
    gpus = list(range(count)) if asked == "all" else list(asked)
    missing = [g for g in gpus if g >= count]
    if missing:
        raise GpuError(f"{where}: --gpus {','.join(map(str, gpus))}: this machine has {count} GPU(s) "
                       f"(0 to {count - 1}): GPU {missing[0]} is not one")
    for spec in config.sources:
        if spec.gpu is not None and spec.gpu not in gpus:
            raise GpuError(f"{where}: source {spec.uri!r}: gpu = {spec.gpu} is not among the GPUs served "
                           f"({','.join(map(str, gpus))})")
    return gpus


def models_of(gpus: list[int]) -> dict[int, str]:
    """Each GPU's model name (empty where simulated): GPUs of different models are said at start-up, since a
    bundle's TensorRT engine runs on the compute capability it was built for (each worker checks its own)."""
    if os.environ.get(SIMULATED_ENV):
        return dict.fromkeys(gpus, "")
    return {g: probe_gpu(g).name or "" for g in gpus}


def visible_gpus() -> tuple[int, str]:
    """(how many GPUs this process sees, their name or why there are none); SIMULATED_ENV stands in for them."""
    simulated = os.environ.get(SIMULATED_ENV)
    if simulated:
        return int(simulated), "simulated"
    facts = probe_gpu(0)
    return (facts.devices, facts.name or "") if facts.usable else (0, facts.reason or "no CUDA GPU found")


def mps_running() -> str | None:
    """The folder of CUDA MPS's control socket where its daemon runs, else None. Without MPS, processes on one GPU
    take turns on it in time slices; with it, their kernels run side by side. The socket (`control`, a seqpacket
    one) stays behind when the daemon quits, so it is asked: a connection is taken while the daemon runs and
    refused after (checked on an H100, driver 580; nvidia-cuda-mps-control connects the same way for each
    command)."""
    folder = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_PIPES
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    probe.settimeout(MPS_PROBE_S)
    try:
        probe.connect(os.path.join(folder, "control"))
    except OSError:  # none there, none listening (it quit), not a socket, or not ours to reach
        return None
    finally:
        probe.close()
    return folder


def offered_rate(spec) -> float:
    """Frames a second a source offers, as far as its URI says (a synthetic camera's rate), else CAMERA_FPS."""
    try:
        uri = uris.parse(spec.uri)
    except JetpipeError:
        return CAMERA_FPS
    if uri.scheme == "synthetic":
        return uris.synthetic_spec(uri)[2]
    return CAMERA_FPS


def workers_of(gpus: list[int], per_gpu: int) -> list[int]:
    """Each worker's GPU, workers numbered from 0: `per_gpu` of them a GPU, a GPU's together."""
    return [gpu for gpu in gpus for _ in range(per_gpu)]


def place(rates: list[float], workers: list[int], pins: list[int | None],
          capacities: dict[int, float] | None = None, loads: dict[int, float] | None = None,
          gpu_of: list[int] | dict[int, int] | None = None) -> list[int]:
    """The worker of each stream: pinned ones on a worker of their GPU, first; each other, from the highest rate
    down, where the load (offered frames/s over capacity, frames/s the worker's GPU runs; 1.0 each where unknown)
    would be lowest after it. loads: the offered frames/s already on each worker (streams served now); gpu_of:
    each worker's GPU, which pins name (default: a worker a GPU, numbered as its GPU)."""
    capacity = {w: (capacities or {}).get(w) or 1.0 for w in workers}
    load = {w: (loads or {}).get(w, 0.0) for w in workers}
    gpu = {w: (gpu_of[w] if gpu_of is not None else w) for w in workers}
    placed: list[int | None] = [None] * len(rates)
    pinned = [i for i, pin in enumerate(pins) if pin is not None]
    on_gpu = {g: sum(load[w] for w in workers if gpu[w] == g) for g in set(gpu.values())}
    for i in pinned + sorted((i for i, pin in enumerate(pins) if pin is None), key=lambda i: -rates[i]):
        allowed = [w for w in workers if pins[i] is None or gpu[w] == pins[i]]
        # ties go to the GPU with less on it (two GPUs of two workers each: the second stream to the other GPU)
        best = min(allowed, key=lambda w: ((load[w] + rates[i]) / capacity[w], on_gpu[gpu[w]], load[w], w))
        placed[i] = best
        load[best] += rates[i]
        on_gpu[gpu[best]] += rates[i]
    return placed


class Placed:
    """The face's table of which worker serves each stream and the rate it offers: the start-up placement, then
    the streams added and removed through the control API. Workers are numbered from 0 (`gpu_of`: each one's
    GPU). IDs of added streams are each worker's own residue (worker k of W: total + k, then every W-th), so that
    a worker gives them without asking."""

    def __init__(self, gpu_of: list[int], placement: list[int], rates: list[float]):
        self.gpu_of, self.stride, self.total = list(gpu_of), len(gpu_of), len(placement)
        self.worker_of = dict(enumerate(placement))
        self.rate_of = dict(enumerate(rates))
        self.live = set(self.worker_of)

    def next_added(self, worker: int) -> int:
        """The first ID a worker started (or started again) gives an added stream: past those given."""
        given = [i for i, w in self.worker_of.items() if w == worker and i >= self.total]
        return max(given) + self.stride if given else self.total + worker

    def order(self, rate: float, pin: int | None, serving: list[int],
              capacities: dict[int, float | None] | None = None) -> list[int]:
        """The workers to try for a new stream, best first, by load after it: the offered frames/s over what the
        worker's GPU model runs (capacities: measured by each worker at start-up; the workers alike unless every
        one was measured); pin: a GPU, whose workers alone are tried."""
        if pin is not None:
            serving = [w for w in serving if self.gpu_of[w] == pin]
        known = capacities or {}
        measured = all(known.get(w) for w in serving)
        capacity = {w: known[w] if measured else 1.0 for w in serving}
        loads = {w: sum(self.rate_of[i] for i in self.live if self.worker_of[i] == w) for w in serving}
        on_gpu = {g: sum(v for w, v in loads.items() if self.gpu_of[w] == g) for g in set(self.gpu_of)}
        return sorted(serving, key=lambda w: ((loads[w] + rate) / capacity[w], on_gpu[self.gpu_of[w]], loads[w], w))

    def added(self, stream: int, worker: int, rate: float) -> None:
        self.worker_of[stream], self.rate_of[stream] = worker, rate
        self.live.add(stream)

    def removed(self, stream: int) -> None:
        self.live.discard(stream)
