"""How many copies of the model a GPU runtime runs batches on (GpuOptions.instances), and which takes a batch.

A second instance runs a second batch beside the first on a stream of its own: for a small model near the GPU's
rate, more frames a second and a shorter queue (PP-OCRv4 det at batch 8 on an H100: 1,037 -> 1,133 frames/s the
engine alone; 32 files in step p99 81 -> 44 ms; docs/lab/benchmarks.md, sessions 59-60). It costs the copy's
memory (~2.2 GB there with sessions for batches of 1, 2, 4 and 8; about 5.5 with one for each size up to 8, since
session 64) and lengthens each batch while both run, so `auto` takes two only where the frames offered
come near the model's rate and the GPU has room for the copy, one otherwise.

The instances share one post stream: a reduction's scratch (the text detector's labels, YOLO's candidates) is one
a runtime, so reductions run one after another, in batch order. Two at once on one scratch hung an H100 (a
union-find walking labels the other batch was writing; session 60).
"""

from __future__ import annotations

import math

AUTO = "auto"
NEAR_RATE = 0.8  # offered / the model's rate at its largest batch, from which auto takes a second instance
ROOM = 2.0       # free GPU memory, in first-instance footprints, that a second instance must leave


def auto_instances(offered_fps: float, model_fps: float | None, free_bytes: int | None,
                   footprint_bytes: int) -> tuple[int, str]:
    """(instances, why) for `auto`: offered_fps: the frames a second the streams offer (inf: files read as fast
    as they decode; 0: not known, as for streams added later); model_fps: the model's rate at its largest batch,
    measured; free_bytes: free GPU memory now; footprint_bytes: what the first instance took."""
    if not model_fps:
        return 1, "the model's rate was not measured: one"
    offered = "files read as fast as they decode" if math.isinf(offered_fps) else f"{offered_fps:,.0f} frames/s offered"
    share = offered_fps / model_fps
    if share < NEAR_RATE:
        return 1, (f"{offered} against the model's {model_fps:,.0f} at its largest batch ({share:.0%}), below "
                   f"{NEAR_RATE:.0%}: one")
    if free_bytes is None or free_bytes < ROOM * footprint_bytes:
        free = "unknown" if free_bytes is None else f"{free_bytes / 2**20:,.0f} MB"
        return 1, (f"{offered}, near the model's {model_fps:,.0f} frames/s, but {free} of GPU memory free, less "
                   f"than {ROOM:g} x the {footprint_bytes / 2**20:,.0f} MB one instance took: one")
    return 2, (f"{offered}, near the model's {model_fps:,.0f} frames/s at its largest batch ({min(share, 9.99):.0%}"
               f"{'+' if share > 9.99 else ''}): two, each running its own batches on a stream of its own "
               "(--model-instances 1 keeps one)")


def why_one(remote: bool, priority: str, backend: str) -> str | None:
    """Why a runtime runs one instance whatever was asked (None: it can run several)."""
    if remote:
        return "a Triton server's model (the server's instance groups decide)"
    if priority != "normal":
        return "priority high (its lane is one stream)"
    if backend != "onnxruntime-cuda":
        return f"{backend} (instances are built for ONNX Runtime's CUDA provider only)"
    return None


def least_busy(running: list[int], last: int) -> int:
    """The instance a batch goes to: the one with the fewest batches running (running[k]), the first after
    `last` (the one the batch before went to) among those tied, so idle instances take batches in turn."""
    turn = [(last + step) % len(running) for step in range(1, len(running) + 1)]
    return min(turn, key=lambda k: running[k])
