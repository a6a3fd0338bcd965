#!/usr/bin/env python3
"""Snapshot encoding (issue 52): the same decoded 1080p frames of a real H.264 video pictured as JPEG by
OpenCV on one core and by the GPU (runtime/jpeg.py: the frame copied in device memory, the kernel's RGB, nvJPEG
through nvImageCodec), side by side in one run, the arms in turn --rounds times.

  python scripts/bench_snapshots.py [--video FILE] [--frames 64] [--rounds 3] [--quality 90] [--json OUT]

Arms, milliseconds a picture (each over every frame):
  opencv          the NV12 frame on the host -> BGR -> cv2.imencode, one thread (what a CPU-only machine does)
  opencv_encode   cv2.imencode of the frame already in BGR: the encode alone
  gpu             the NV12 frame in device memory (as NVDEC leaves it) -> hold + picture: a snapshot's whole cost
  gpu_host_image  a BGR picture on the host uploaded and encoded (the jpeg: sink's path)
Each picture's mean absolute difference from the frame (decoded back) and its size are kept beside its time.
The video is bench_events.py's words panning past the text detector (made with ffmpeg where --video is not
there yet).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root), str(root / "scripts")]

import cv2  # noqa: E402
import numpy as np  # noqa: E402
from bench_events import make_video  # noqa: E402

from jetpipe.runtime.api import Frame  # noqa: E402
from jetpipe.runtime.jpeg import CpuJpeg, GpuJpeg  # noqa: E402


def decoded_frames(video: Path, count: int) -> list[np.ndarray]:
    """The first `count` frames as NV12 host arrays (FFmpeg through PyAV, as the in-process source decodes)."""
    import av

    frames = []
    with av.open(str(video)) as container:
        for frame in container.decode(video=0):
            frames.append(frame.to_ndarray(format="nv12"))
            if len(frames) == count:
                break
    return frames


def timed(pictures) -> tuple[float, list[bytes]]:
    """Milliseconds a picture, and the pictures (bytes)."""
    started = time.perf_counter()
    out = [make() for make in pictures]
    return 1e3 * (time.perf_counter() - started) / len(out), out


def fidelity(pictures: list[bytes], references: list[np.ndarray]) -> float:
    errors = [np.abs(cv2.imdecode(np.frombuffer(p, np.uint8), cv2.IMREAD_COLOR).astype(np.int16) - r).mean()
              for p, r in zip(pictures, references)]
    return round(float(np.mean(errors)), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--video", help="a 1080p H.264 file (made there if it is not)")
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    video = Path(args.video) if args.video else Path(tempfile.mkdtemp(prefix="bench-snap-")) / "words1080.mp4"
    if not video.exists():
        make_video(video, 4.0, 72)
    nv12 = decoded_frames(video, args.frames)
    height, width = nv12[0].shape[0] * 2 // 3, nv12[0].shape[1]
    references = [cv2.cvtColor(f, cv2.COLOR_YUV2BGR_NV12) for f in nv12]

    from jetpipe.runtime.cuda import CudaDevice
    from jetpipe.runtime.kernels import compile_module

    cv2.setNumThreads(1)
    device = CudaDevice(0)
    with device.active():
        module = compile_module()
        on_device = []
        for f in nv12:
            address = device.alloc(f.nbytes)
            device.cuda.memcpy_htod(address, f)
            on_device.append(Frame(None, "nv12", address=int(address), device=True, hw=(height, width)))
    gpu = GpuJpeg(device, module, args.quality, 2, (height, width))
    cpu = CpuJpeg(args.quality, 2, (height, width))

    def snapshot(encoder, frame):
        def make():
            held = encoder.hold(frame)
            try:
                return encoder.picture(held)
            finally:
                encoder.release(held)
        return make

    arms = {
        "opencv": lambda: [snapshot(cpu, Frame(f, "nv12")) for f in nv12],
        "opencv_encode": lambda: [lambda r=r: cpu.encode_image(r) for r in references],
        "gpu": lambda: [snapshot(gpu, f) for f in on_device],
        "gpu_host_image": lambda: [lambda r=r: gpu.encode_image(r) for r in references],
    }
    timed(arms["gpu"]())  # warm-up: the encoder's first pictures allocate its own buffers
    timed(arms["opencv"]()[:4])
    rows = []
    for k in range(args.rounds):
        for name, pictures in arms.items():
            ms, out = timed(pictures())
            rows.append({"arm": name, "round": k + 1, "ms_per_picture": round(ms, 3),
                         "mean_abs_diff": fidelity(out, references), "kb_per_picture": round(
                             sum(map(len, out)) / len(out) / 1e3, 1)})
            print(json.dumps(rows[-1]), flush=True)
    median = {name: statistics.median(r["ms_per_picture"] for r in rows if r["arm"] == name) for name in arms}
    speedup = round(median["opencv"] / median["gpu"], 1)
    print(f"median ms a picture: {median}; the GPU's snapshot against OpenCV's on one core: {speedup}x "
          f"(encode alone: {round(median['opencv_encode'] / median['gpu'], 1)}x)")
    facts = {"gpu": device.name, "frames": len(nv12), "size": f"{width}x{height}", "quality": args.quality,
             "video": str(video), "encoder": gpu.describe}
    if args.json:
        Path(args.json).write_text(json.dumps({"facts": facts, "rows": rows, "median_ms": median,
                                               "speedup_vs_opencv": speedup}, indent=1) + "\n")
    gpu.close()
    device.close()


if __name__ == "__main__":
    main()
