#!/usr/bin/env python3
"""P1: 1920x1080 NV12 -> 640x640 letterboxed, normalized NCHW float32, per frame.

Side by side, one run: jetpipe's fused kernel (frames in device memory, and
frames in mapped host memory as on a Jetson), OpenCV on the CPU (cvtColor +
resize + normalize + transpose; 1 thread and all threads), the same written
with torch GPU ops (if torch is present), and a device-to-device copy of the
input frames (the floor). GPU times: CUDA events, median of --repeat runs
after warm-up, rotating over several frame sets so the L2 cache does not hold them.
Each timed run is queued behind a spin kernel (~100 us), so that the GPU reaches
the start event with the work already submitted: the time is the GPU's, as in a
pipeline where a batch is queued behind earlier work. Without it (the `*_submit_us`
figures, this script's only ones before 2026-11-26) the interval also holds the
host's time to submit the work: the Python call and the driver, a few us a launch.

    python scripts/bench_preprocess.py [--batches 1,8,32] [--sources 1080x1920,720x1280] [--repeat 200]
                                       [--json out.json]
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


SPIN_US = 100  # the GPU's wait before each timed run: longer than the host takes to submit one
SPIN_SOURCE = """
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
"""


class Spinner:
    """Holds a stream busy for SPIN_US (one thread spinning on the SM clock), so that what is submitted next
    waits on the GPU, not on the host."""

    def __init__(self, device):
        from pycuda.compiler import SourceModule

        self.function = SourceModule(SPIN_SOURCE, no_extern_c=True).get_function("spin")
        clock_khz = device.device.get_attribute(device.cuda.device_attribute.CLOCK_RATE)
        self.cycles = np.int64(SPIN_US * clock_khz // 1000)

    def __call__(self, stream) -> None:
        self.function(self.cycles, block=(1, 1, 1), grid=(1, 1), stream=stream)


def gpu_median(device, stream, fn, repeat: int, spinner: Spinner | None = None) -> float:
    """Median ms of fn(i) enqueued on stream, timed with events; with `spinner`, queued behind it (the GPU's
    time alone), else from the moment the start event is submitted (the host's submission inside)."""
    start, end = device.cuda.Event(), device.cuda.Event()
    for i in range(10):
        fn(i)
    stream.synchronize()
    times = []
    for i in range(repeat):
        if spinner is not None:
            spinner(stream)
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
    parser.add_argument("--sources", default="1080x1920,720x1280",
                        type=lambda s: [tuple(int(v) for v in hw.split("x")) for hw in s.split(",")],
                        help="frame sizes HxW (the CPU and torch peers run on 1080x1920 only)")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from jetpipe.runtime.cuda import CudaDevice
    from jetpipe.runtime.kernels import compile_module

    rows = []
    device = CudaDevice()
    with device.active():
        module = compile_module()
        stream = device.stream()
        peak = peak_bandwidth(device)
        spinner = Spinner(device)
        for hw in args.sources:
            base = [from_bgr(render_text_image(100 + i, hw).bgr, "nv12") for i in range(ROTATE)]
            peers = hw == (H, W)
            cpu1 = bench_opencv(base, 1) if peers else None
            cpu_all = bench_opencv(base, -1) if peers else None  # -1: OpenCV's default thread count
            for batch in args.batches:
                row = {"source": f"{hw[1]}x{hw[0]}", "batch": batch,
                       **bench_gpu(device, module, stream, base, batch, args.repeat, peak, spinner)}
                torch_ms = bench_torch(base, batch, args.repeat, spinner.cycles) if peers else None
                row.update(torch_gpu_ops_us=torch_ms * 1e3 if torch_ms else None,
                           opencv_1_thread_us=cpu1 * 1e3 if cpu1 else None,
                           opencv_all_threads_us=cpu_all * 1e3 if cpu_all else None)
                rows.append(row)
                print(json.dumps(row), flush=True)
    name = device.name
    device.close()
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps({"gpu": name, "peak_bandwidth_gb_s": peak / 1e9, "rows": rows}, indent=2))


def peak_bandwidth(device) -> float:
    """The GPU's DRAM bandwidth in bytes/s from its memory clock and bus width (double data rate)."""
    attr = device.cuda.device_attribute
    clock_khz = device.device.get_attribute(attr.MEMORY_CLOCK_RATE)
    bus_bits = device.device.get_attribute(attr.GLOBAL_MEMORY_BUS_WIDTH)
    return 2 * clock_khz * 1e3 * bus_bits / 8


def sampled_bytes(height: int, width: int, out_hw=OUT) -> int:
    """Bytes of an NV12 frame in the rows the letterbox resize reads (taps of weight 0 are not read: at an
    integer ratio, 1080 -> 360 rows, one row in three); every column's sector is read in those rows."""
    scale = max(height / out_hw[0], width / out_hw[1])
    rows = round(height / scale)
    luma = set()
    for cy in range(rows):
        s = (cy + 0.5) * (height / rows) - 0.5
        i0 = min(max(int(np.floor(s)), 0), height - 1)
        a = s - np.floor(s) if 0 <= s < height - 1 else 0.0
        luma.add(i0)
        if a != 0:
            luma.add(min(i0 + 1, height - 1))
    chroma = {r >> 1 for r in luma}
    return (len(luma) + len(chroma)) * width


def bench_gpu(device, module, stream, base, batch: int, repeat: int, peak: float, spinner: Spinner) -> dict:
    """Our kernel on device frames and on mapped host frames, and the D2D copy floor (us per frame, the GPU's
    time and, as `*_submit_us`, with the host's submission inside); the share of the DRAM bandwidth each uses
    on the bytes it must move (the kernel: the frame + its output, and the rows it reads + its output; the
    copy: the frame read and written)."""
    from jetpipe.runtime.kernels import GpuPreprocessor

    n, frame_bytes, matrix = batch * ROTATE, base[0].nbytes, ColourMatrix.of()
    height, width = base[0].shape[0] * 2 // 3, base[0].shape[1]  # NV12: the luma rows, then half as many
    src = device.alloc(n * frame_bytes)
    mapped = device.pinned((n, frame_bytes), np.uint8, mapped=True)
    for i in range(n):
        device.cuda.memcpy_htod(int(src) + i * frame_bytes, base[i % ROTATE])
        mapped[i] = base[i % ROTATE].reshape(-1)
    copy_dst = device.alloc(batch * frame_bytes)
    out = device.alloc(batch * 3 * OUT[0] * OUT[1] * 4)
    result = {}

    def timed(label, fn):
        result[label + "_us"] = gpu_median(device, stream, fn, repeat, spinner) * 1e3 / batch
        result[label + "_submit_us"] = gpu_median(device, stream, fn, repeat) * 1e3 / batch

    for label, first in (("jetpipe_kernel", int(src)), ("jetpipe_kernel_mapped", device.device_pointer(mapped))):
        sets = []
        for r in range(ROTATE):
            pre = GpuPreprocessor(device, module, batch, OUT, SPEC)
            for i in range(batch):
                pre.set_frame(i, "nv12", height, width, first + (r * batch + i) * frame_bytes, matrix)
            sets.append(pre)
        timed(label, lambda i, sets=sets: sets[i % ROTATE].launch(batch, int(out), stream))
        if label == "jetpipe_kernel" and REFERENCE.exists():
            before = reference_launcher(module_before(), batch, int(out), stream)
            timed("kernel_before", lambda i, b=before, s=sets: b(s[i % ROTATE]))

    def copy(i):
        source = int(src) + (i % ROTATE) * batch * frame_bytes
        device.cuda.memcpy_dtod_async(copy_dst, source, batch * frame_bytes, stream)

    timed("d2d_copy", copy)
    out_bytes = 3 * OUT[0] * OUT[1] * 4
    read_bytes = sampled_bytes(height, width)
    per_us = peak / 1e6 / 100  # bytes per microsecond at 1 % of the peak
    result.update(frame_bytes=frame_bytes, read_bytes=read_bytes, out_bytes=out_bytes)
    for suffix in ("", "_submit"):
        kernel_us, copy_us = result[f"jetpipe_kernel{suffix}_us"], result[f"d2d_copy{suffix}_us"]
        result.update({f"kernel_pct_frame_plus_out{suffix}": (frame_bytes + out_bytes) / kernel_us / per_us,
                       f"kernel_pct_read_plus_out{suffix}": (read_bytes + out_bytes) / kernel_us / per_us,
                       f"copy_pct{suffix}": 2 * frame_bytes / copy_us / per_us})
    return result


REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "runtime" / "preprocess_reference.cu"


def module_before():
    from jetpipe.runtime.kernels import compile_module

    return compile_module(REFERENCE)


def reference_launcher(module, batch: int, out: int, stream):
    """Launches the kernel as it was before issue 27 (one thread per output pixel; kept in the tests as the
    reference the current kernel equals bit for bit) on a GpuPreprocessor's frames."""
    from jetpipe.runtime.kernels import BLOCK

    function = module.get_function("preprocess_f32")
    function.prepare("PPiiifffffffi")
    grid = ((OUT[1] + BLOCK[0] - 1) // BLOCK[0], (OUT[0] + BLOCK[1] - 1) // BLOCK[1], batch)

    def launch(pre):
        pre._cuda.memcpy_htod_async(pre.device_params, pre.host_params[:batch], stream)
        function.prepared_async_call(grid, BLOCK, stream, pre.device_params, out, np.int32(OUT[1]),
                                     np.int32(OUT[0]), np.int32(batch), *pre.constants)
    return launch


def bench_torch(base, batch: int, repeat: int, spin_cycles: int) -> float | None:
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
        torch.cuda._sleep(int(spin_cycles))  # as Spinner: the GPU's time, not the host's
        start.record()
        torch_preprocess(torch, sets[i % ROTATE], mul, add)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times)) / batch


def print_table(rows) -> None:
    labels = [("jetpipe_kernel_us", "jetpipe kernel"), ("kernel_before_us", "  (before issue 27)"),
              ("jetpipe_kernel_mapped_us", "  (mapped frames)"),
              ("d2d_copy_us", "D2D copy (floor)"), ("torch_gpu_ops_us", "torch GPU ops"),
              ("opencv_1_thread_us", "OpenCV 1 thread"), ("opencv_all_threads_us", "OpenCV all threads"),
              ("kernel_pct_frame_plus_out", "kernel % DRAM (frame+out)"),
              ("kernel_pct_read_plus_out", "kernel % DRAM (read+out)"), ("copy_pct", "copy % DRAM"),
              ("jetpipe_kernel_submit_us", "kernel, submit inside"), ("d2d_copy_submit_us", "copy, submit inside"),
              ("kernel_pct_frame_plus_out_submit", "  kernel % (frame+out)"), ("copy_pct_submit", "  copy %")]
    print("\nper frame, us" + " " * 14 + "".join(f"{r['source']:>10} b{r['batch']:<3}" for r in rows))
    for key, label in labels:
        cells = [f"{r[key]:>14.1f}" if r.get(key) is not None else f"{'n/a':>14}" for r in rows]
        print(f"{label:<27}" + "".join(cells))
    for r in rows:
        print(f"{r['source']} batch {r['batch']}: kernel / copy = {r['jetpipe_kernel_us'] / r['d2d_copy_us']:.2f}x")


if __name__ == "__main__":
    main()
