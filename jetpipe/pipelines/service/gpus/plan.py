"""Which GPUs serve, and which streams each serves: `--gpus`, a stream's `gpu = N` pin, placement by load.

Placement puts each stream on the GPU with the most headroom: the offered rates already placed there over
what that GPU runs (frames a second from its measured engine time where it is known; GPUs of one model are
alike until measured). Pinned streams go first, then the others from the highest rate down, so that a mix of
rates spreads evenly.
"""

from __future__ import annotations

import os

from jetpipe import uri as uris
from jetpipe.errors import JetpipeError
from jetpipe.limits import MAX_GPUS
from jetpipe.pipelines.outputs.sinks import scheme_of
from jetpipe.runtime.probe import probe_gpu
from jetpipe.runtime.triton_backend import is_triton

GPUS_HELP = "all, or GPU numbers such as 0,1"
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


def check(config, where: str) -> None:
    """What --gpus cannot go with, said before anything opens (the GPUs themselves are looked at by resolve)."""
    pinned = [s for s in config.sources if s.gpu is not None]
    if config.gpus is None:
        if pinned:
            raise GpuError(f"{where}: source {pinned[0].uri!r}: gpu = {pinned[0].gpu} places it on one of the GPUs "
                           "serve runs on: add --gpus (e.g. --gpus all)")
        return
    if config.backend == "onnxruntime-cpu":
        raise GpuError(f"{where}: --gpus runs a pipeline on each GPU; backend onnxruntime-cpu runs on the CPU: "
                       "drop --gpus, or use backend auto")
    if is_triton(config.backend):
        raise GpuError(f"{where}: --gpus with a Triton backend: the server places the model on its GPUs "
                       "(jetpipe export triton --gpus); drop --gpus here")
    for sink in config.sinks:
        if scheme_of(sink) == "rtsp":
            raise GpuError(f"{where}: sink {sink}: an RTSP server serves one process's frames, and with --gpus "
                           "each GPU's frames stay in its worker: drop the rtsp sink or --gpus")


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


def offered_rate(spec) -> float:
    """Frames a second a source offers, as far as its URI says (a synthetic camera's rate), else CAMERA_FPS."""
    try:
        uri = uris.parse(spec.uri)
    except JetpipeError:
        return CAMERA_FPS
    if uri.scheme == "synthetic":
        return uris.synthetic_spec(uri)[2]
    return CAMERA_FPS


def place(rates: list[float], gpus: list[int], pins: list[int | None],
          capacities: dict[int, float] | None = None, loads: dict[int, float] | None = None) -> list[int]:
    """The GPU of each stream: pinned ones where pinned; each other, from the highest rate down, where the load
    (offered frames/s over capacity, frames/s the GPU runs; 1.0 each where unknown) would be lowest after it.
    loads: the offered frames/s already on each GPU (streams served now)."""
    capacity = {g: (capacities or {}).get(g) or 1.0 for g in gpus}
    load = {g: (loads or {}).get(g, 0.0) for g in gpus}
    placed: list[int | None] = list(pins)
    for i, gpu in enumerate(pins):
        if gpu is not None:
            load[gpu] += rates[i]
    for i in sorted((i for i, pin in enumerate(pins) if pin is None), key=lambda i: -rates[i]):
        best = min(gpus, key=lambda g: ((load[g] + rates[i]) / capacity[g], load[g], g))
        placed[i] = best
        load[best] += rates[i]
    return placed


class Placed:
    """The face's table of which GPU serves each stream and the rate it offers: the start-up placement, then the
    streams added and removed through the control API. IDs of added streams are each GPU's own residue (GPU k of
    G: total + k, then every G-th), so that a worker gives them without asking."""

    def __init__(self, gpus: list[int], placement: list[int], rates: list[float]):
        self.gpus, self.stride, self.total = list(gpus), len(gpus), len(placement)
        self.gpu_of = dict(enumerate(placement))
        self.rate_of = dict(enumerate(rates))
        self.live = set(self.gpu_of)

    def next_added(self, gpu: int) -> int:
        """The first ID a worker started (or started again) on `gpu` gives an added stream: past those given."""
        given = [i for i, g in self.gpu_of.items() if g == gpu and i >= self.total]
        return max(given) + self.stride if given else self.total + self.gpus.index(gpu)

    def order(self, rate: float, pin: int | None, serving: list[int],
              capacities: dict[int, float | None] | None = None) -> list[int]:
        """The GPUs to try for a new stream, best first: the pinned one alone, else by load after it: the
        offered frames/s over what the GPU's model runs (capacities: measured by each worker at start-up; the
        GPUs alike unless every one was measured)."""
        if pin is not None:
            return [pin]
        known = capacities or {}
        measured = all(known.get(g) for g in serving)
        capacity = {g: known[g] if measured else 1.0 for g in serving}
        loads = {g: sum(self.rate_of[i] for i in self.live if self.gpu_of[i] == g) for g in serving}
        return sorted(serving, key=lambda g: ((loads[g] + rate) / capacity[g], loads[g], g))

    def added(self, stream: int, gpu: int, rate: float) -> None:
        self.gpu_of[stream], self.rate_of[stream] = gpu, rate
        self.live.add(stream)

    def removed(self, stream: int) -> None:
        self.live.discard(stream)
