#!/usr/bin/env python3
"""P1: 1920x1080 NV12 -> 640x640 letterboxed, normalized NCHW float32, per frame.

Side by side, one run: jetpipe's fused kernel (frames in device memory, and
frames in mapped host memory as on a Jetson), OpenCV on the CPU (cvtColor +
resize + normalize + transpose; 1 thread and all threads), the same written
with torch GPU ops (if torch is present), and a device-to-device copy of the
input frames (the floor). GPU times: CUDA events, median of --repeat runs
after warm-up, rotating over several frame sets so the L2 cache does not hold them.

    python scripts/bench_preprocess.py [--batches 1,8,32] [--repeat 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jetpipe.frames import ColourMatrix, from_bgr  # noqa: E402
from jetpipe.geometry import affine  # noqa: E402
from jetpipe.spec import PRESETS  # noqa: E402
from jetpipe.synth import render_text_image  # noqa: E402

H, W, OUT = 1080, 1920, (640, 640)
SPEC = PRESETS["ppocr-det"]
ROTATE = 4  # frame sets cycled through


def gpu_median(device, stream, fn, repeat: int) -> float:
    """Median ms of fn(i) enqueued on stream, timed with events."""
    start, end = device.cuda.Event(), device.cuda.Event()
    for i in range(10):
        fn(i)
    stream.synchronize()
    times = []
    for i in range(repeat):
        start.record(stream)
        fn(i)
        end.record(stream)
        end.synchronize()
        times.append(end.time_since(start))
    return float(np.median(times))


def opencv_frame(nv12: np.ndarray, mean, std) -> np.ndarray:
    """What users write: cvtColor + resize + pad + normalize + transpose."""
    import cv2

    bgr = cv2.cvtColor(nv12, cv2.COLOR_YUV2BGR_NV12)
    resized = cv2.resize(bgr, (640, 360), interpolation=cv2.INTER_LINEAR)
    canvas = np.zeros((640, 640, 3), np.uint8)
    canvas[140:500] = resized
    x = (canvas.astype(np.float32) / 255.0 - mean) / std
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def bench_opencv(frames, threads: int, seconds: float = 3.0) -> float:
    import cv2

    cv2.setNumThreads(threads)
    print(f"OpenCV with {cv2.getNumThreads()} thread(s)", flush=True)
    mean, std = np.array(SPEC.mean, np.float32), np.array(SPEC.std, np.float32)
    opencv_frame(frames[0], mean, std)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        opencv_frame(frames[count % len(frames)], mean, std)
        count += 1
    return (time.perf_counter() - start) * 1000 / count


def torch_preprocess(torch, nv12_batch, mul, add):
    """NV12 (B, H*3/2, W) uint8 on the GPU -> (B, 3, 640, 640) float32, with torch ops."""
    import torch.nn.functional as F

    b = nv12_batch.shape[0]
    y = nv12_batch[:, :H].float()
    uv = nv12_batch[:, H:].view(b, H // 2, W // 2, 2).float()
    u = uv[..., 0].repeat_interleave(2, 1).repeat_interleave(2, 2) - 128.0
    v = uv[..., 1].repeat_interleave(2, 1).repeat_interleave(2, 2) - 128.0
    yy = (y - 16.0) * (255.0 / 219.0)
    k = 255.0 / 224.0
    r = (yy + 1.402 * k * v).clamp(0, 255)
    g = (yy - 0.344136 * k * u - 0.714136 * k * v).clamp(0, 255)
    bl = (yy + 1.772 * k * u).clamp(0, 255)
    bgr = torch.stack([bl, g, r], 1)
    resized = F.interpolate(bgr, size=(360, 640), mode="bilinear", align_corners=False)
    out = torch.zeros((b, 3, 640, 640), device=nv12_batch.device)
    out[:, :, 140:500] = resized
    return out * mul.view(1, 3, 1, 1) + add.view(1, 3, 1, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--batches", default="1,8,32", type=lambda s: [int(v) for v in s.split(",")])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from jetpipe.runtime.cuda import CudaDevice
    from jetpipe.runtime.kernels import compile_module

    base = [from_bgr(render_text_image(100 + i, (H, W)).bgr, "nv12") for i in range(ROTATE)]
    rows = []
    cpu1 = bench_opencv(base, 1)
    cpu_all = bench_opencv(base, -1)  # -1: OpenCV's default thread count (0 would disable threading)
    device = CudaDevice()
    with device.active():
        module = compile_module()
        stream = device.stream()
        for batch in args.batches:
            row = {"batch": batch, **bench_gpu(device, module, stream, base, batch, args.repeat)}
            torch_ms = bench_torch(base, batch, args.repeat)
            row.update(torch_gpu_ops_us=torch_ms * 1e3 if torch_ms else None,
                       opencv_1_thread_us=cpu1 * 1e3, opencv_all_threads_us=cpu_all * 1e3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    name = device.name
    device.close()
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps({"gpu": name, "rows": rows}, indent=2))


def bench_gpu(device, module, stream, base, batch: int, repeat: int) -> dict:
    """Our kernel on device frames and on mapped host frames, and the D2D copy floor (us per frame)."""
    from jetpipe.runtime.kernels import GpuPreprocessor

    n, frame_bytes, matrix = batch * ROTATE, base[0].nbytes, ColourMatrix.of()
    src = device.alloc(n * frame_bytes)
    mapped = device.pinned((n, frame_bytes), np.uint8, mapped=True)
    for i in range(n):
        device.cuda.memcpy_htod(int(src) + i * frame_bytes, base[i % ROTATE])
        mapped[i] = base[i % ROTATE].reshape(-1)
    copy_dst = device.alloc(batch * frame_bytes)
    out = device.alloc(batch * 3 * OUT[0] * OUT[1] * 4)
    result = {}
    for label, first in (("jetpipe_kernel_us", int(src)), ("jetpipe_kernel_mapped_us",
                                                            device.device_pointer(mapped))):
        sets = []
        for r in range(ROTATE):
            pre = GpuPreprocessor(device, module, batch, OUT, SPEC)
            for i in range(batch):
                pre.set_frame(i, "nv12", H, W, first + (r * batch + i) * frame_bytes, matrix)
            sets.append(pre)
        ms = gpu_median(device, stream, lambda i, sets=sets: sets[i % ROTATE].launch(batch, int(out), stream),
                        repeat)
        result[label] = ms * 1e3 / batch

    def copy(i):
        source = int(src) + (i % ROTATE) * batch * frame_bytes
        device.cuda.memcpy_dtod_async(copy_dst, source, batch * frame_bytes, stream)

    result["d2d_copy_us"] = gpu_median(device, stream, copy, repeat) * 1e3 / batch
    return result


def bench_torch(base, batch: int, repeat: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    frames = torch.stack([torch.from_numpy(f) for f in base * batch]).cuda()
    sets = [frames[r * batch:(r + 1) * batch] for r in range(ROTATE)]
    mul, add = (torch.tensor(v, device="cuda") for v in affine(SPEC))
    for r in range(ROTATE):
        torch_preprocess(torch, sets[r], mul, add)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(repeat):
        start.record()
        torch_preprocess(torch, sets[i % ROTATE], mul, add)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times)) / batch


def print_table(rows) -> None:
    print("\nper frame, us        " + "".join(f"batch {r['batch']:>3}   " for r in rows))
    labels = [("jetpipe_kernel_us", "jetpipe kernel"), ("jetpipe_kernel_mapped_us", "  (mapped frames)"),
              ("d2d_copy_us", "D2D copy (floor)"), ("torch_gpu_ops_us", "torch GPU ops"),
              ("opencv_1_thread_us", "OpenCV 1 thread"), ("opencv_all_threads_us", "OpenCV all threads")]
    for key, label in labels:
        cells = [f"{r[key]:>10.1f}  " if r[key] is not None else f"{'n/a':>10}  " for r in rows]
        print(f"{label:<21}" + "".join(cells))
    for r in rows:
        print(f"batch {r['batch']}: kernel / copy = {r['jetpipe_kernel_us'] / r['d2d_copy_us']:.2f}x")


if __name__ == "__main__":
    main()
