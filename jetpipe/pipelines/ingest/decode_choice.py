"""`decode_processes = "auto"` (the default): NVDEC files decoded in a process of their own where that pays.

Every frame PyNvVideoCodec decodes costs ~0.4 ms of CPU under the GIL, so the serving process decodes at most
2,700-3,450 frames/s (32-64 1080p files into a light detector on an H100 and an H200: 68-76 % of what NVDEC
decodes alone); one decode process took the same runs to 94-97 % (docs/lab/benchmarks.md). Where the model is
the limit (PP-OCRv4 det at 1080p: 900-970 frames/s) or the streams offer less, a decode process only adds a
CUDA context that the GPU time-slices with the serving one. So: one decode process where enough NVDEC files
could be served faster than the serving process decodes, by what they offer and by the model's measured rate.

With clips on, the serving process also keeps each packet, and decodes less: 32 files into the light detector
on an H200, 1,702 frames/s with the rings against 2,010 without; in a decode process, 4,411 with them (97 % of
NVDEC). A decode process's packets cost more CPU per frame than keeping them here (about 6 % against under 1 %
at 16 x 1080p30, where both keep up), so with clips the bar is lower, not gone (docs/lab/benchmarks.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

AUTO = "auto"
MIN_FILES = 8                  # fewer NVDEC files: decoding here was never the limit
SERVING_DECODE_FPS = 2500.0    # frames/s above which decoding in the serving process holds the pipeline back
# the same with clips' rings: below the 1,702 measured (a frame dropped costs more than a decode process's CPU)
SERVING_DECODE_FPS_CLIPS = 1500.0
LIVE_FILE_FPS = 30.0           # what a --realtime file offers, its own rate unread at this point


@dataclass(frozen=True)
class DecodeChoice:
    processes: int
    why: str


def choose(files: int, realtime_files: int, engine_fps: float | None, clips: bool = False) -> DecodeChoice:
    """The decode processes for `files` NVDEC files (`realtime_files` of them paced as cameras; the others as
    fast as they are taken) into a model that runs `engine_fps` frames/s at its largest batch (None: not
    measured here); clips: clips are on (this process decodes less, and a decode process sends its packets
    here)."""
    if files < MIN_FILES:
        return DecodeChoice(0, f"{files} NVDEC file(s), fewer than {MIN_FILES}: decoding in this process")
    offered = math.inf if files > realtime_files else realtime_files * LIVE_FILE_FPS
    if engine_fps is None:
        return DecodeChoice(0, "the model's rate is not measured here (a server's model): decoding in this "
                               "process")
    rate = min(offered, engine_fps)
    serving = SERVING_DECODE_FPS_CLIPS if clips else SERVING_DECODE_FPS
    limit = f"what this process decodes{' with clips on' if clips else ''} (~{serving:,.0f} frames/s)"
    if rate <= serving:
        held_by = "the model runs" if engine_fps <= offered else "the files offer"
        return DecodeChoice(0, f"{files} NVDEC files: {held_by} {rate:,.0f} frames/s, within {limit}: decoding "
                               "in this process")
    return DecodeChoice(1, f"{files} NVDEC files into a model that runs {engine_fps:,.0f} frames/s, more than "
                           f"{limit}: decoding in 1 process of its own (decode_processes = 0 decodes here)")
