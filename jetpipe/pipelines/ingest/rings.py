"""Every stream slot's frame rings, planned and allocated at start-up (nothing is allocated later).

A slot's own ring holds its queue, the frame being written and a spare; rings of one frame size share a pool
for the frames their batches hold while the GPU and the stages have them (ring.FrameRing.share). The whole
plan is checked against the memory available before anything is allocated (a Jetson shares it with the GPU).
"""

from __future__ import annotations

from collections import Counter

from jetpipe.pipelines.config import ConfigError
from jetpipe.runtime.nvdec import decodes_to_device
from jetpipe.runtime.ring import frame_ring, slot_bytes

RingSpec = tuple  # (frame height and width, in device memory, pixel format or None: any)


def own_slots(queue_depth: int) -> int:
    """Frame slots a stream's own ring holds: its queue, one being written and one spare."""
    return queue_depth + 2


def shared_slots(streams: int, queue_depth: int, max_batch: int, buffer_sets: int) -> int:
    """Frame slots the rings of `streams` streams of one size share: the frames the batches hold while their
    buffer sets are in use (on the GPU, waiting for or in postprocessing, crops being read). At most
    buffer_sets x max_batch, whatever the streams; and as a batch takes a stream's frames from its queue, at
    most queue_depth of one stream's a batch (one stream alone: the 4 x min(queue_depth, max_batch) slots a
    ring held before the pool, 22 a stream in all at depth 4; 64 streams at batch 32 share 128 instead of
    64 x 16)."""
    return min(buffer_sets * max_batch, streams * buffer_sets * min(queue_depth, max_batch))


def ring_need(source, max_frame_hw, exact: bool = True) -> RingSpec:
    """What a ring for this source must hold: frames of its size (max_frame_hw while unknown), in device
    memory or not, of its format where it is known now and `exact` (else any format: slot_bytes)."""
    info = source.info
    hw = (info.height, info.width) if info is not None else tuple(max_frame_hw)
    return hw, source.memory == "device", info.format if exact and info is not None else None


def allocate(runtime, streams, config, sources: list, capacity: int, exact: bool) -> None:
    """Every slot's rings, now: one per source given (its frame size and memory), and for each spare slot of
    the control API a host ring of max_frame_hw, and a device ring too where NVDEC decodes into GPU memory (a
    stream added later takes whichever its decoder writes). exact: a source whose format is known now (a file,
    probed) gets slots of its frame's size (NV12: half of BGR); not with the control API, where a slot a stream
    leaves may be taken by any stream up to its size."""
    own = own_slots(config.queue_depth)
    wanted = [[ring_need(src, config.max_frame_hw, exact)] for src in sources]
    spare = [(tuple(config.max_frame_hw), False, None)] + \
        ([(tuple(config.max_frame_hw), True, None)] if decodes_to_device(runtime) else [])
    wanted += [spare] * (capacity - len(sources))
    sharing = Counter(spec for rings in wanted for spec in rings)
    pooled = {spec: shared_slots(count, config.queue_depth, runtime.max_batch, runtime.buffer_sets)
              for spec, count in sharing.items()}
    check_memory([own * slot_bytes(*spec) for rings in wanted for spec in rings], own,
                 [count * slot_bytes(*spec) for spec, count in pooled.items()], sum(pooled.values()))
    pools = {spec: frame_ring(runtime, count, spec[0], device=spec[1], fmt=spec[2]) for spec, count in pooled.items()}
    for slot, rings in enumerate(wanted):
        streams.choices[slot] = [frame_ring(runtime, own, hw, device=device, fmt=fmt) for hw, device, fmt in rings]
        for ring, spec in zip(streams.choices[slot], rings):
            ring.share(pools[spec])


def available_memory() -> int | None:
    """Bytes of memory the kernel says are available (MemAvailable), None where it does not say."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_memory(ring_bytes: list[int], own: int, pool_bytes: list[int], pooled: int) -> None:
    """The frame rings fit in the memory available (a Jetson shares it with the GPU): checked before any is
    allocated, instead of the OOM killer ending the daemon half-started."""
    available, need = available_memory(), sum(ring_bytes) + sum(pool_bytes)
    if available is not None and need > 0.8 * available:
        raise ConfigError(f"the frame rings would take {_size(need)} ({len(ring_bytes)} stream(s) x {own} "
                          f"slots: queue_depth + 2, and {pooled} shared by the batches in flight: buffer sets x "
                          f"max_batch at most), more than 80 % of the {_size(available)} available: lower "
                          "queue_depth or max_frame_hw")


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"
