#!/usr/bin/env python3
"""The instance masks' outline kernel (seg_outlines) alone, on a -seg export's real outputs (issue 24).

  python scripts/diag/outlines.py yolov8n-seg.onnx [--objects 30]

The export with bench_pipeline's busy head (`objects` boxes a frame, blobs on its prototypes) runs on ONNX
Runtime's CPU provider over 8 random 640x640 inputs; its outputs go through the yolo-seg reduction on the GPU.
Printed: the reduction's and the outline kernel's milliseconds a batch (CUDA events, 20 launches), at the task's
tolerance and unsimplified, and for the slowest boxes the kernel's cycles by part (clock64 in a copy of the
kernel: padding the mask into shared memory, the scan with its traces, the finish: tracing again where the
chain did not fit, simplifying, writing the points): border following is one thread's work, so the slowest
box is the kernel's time.
"""
import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

root = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(root), str(root / "scripts")]

TIMED = {  # clock64 marks added to a copy of the kernel (its text must hold these lines)
    "    extern __shared__ unsigned held[];":
        "    long long t0 = clock64(), t1 = 0, t2 = 0;\n    extern __shared__ unsigned held[];",
    "            warp_largest(m, &scan);\n":
        "            t1 = clock64();\n            warp_largest(m, &scan);\n            t2 = clock64();\n",
    "    spill = __shfl_sync(0xffffffff, spill, 0);\n":
        "    long long t3 = clock64();\n    spill = __shfl_sync(0xffffffff, spill, 0);\n"
        "    if (lane == 0 && t1) { long long* dt = diag_times + ((size_t)frame * p.limit + box) * 5;\n"
        "        dt[0] = t1 - t0; dt[1] = t2 - t1; dt[2] = t3 - t2; dt[3] = n; dt[4] = count; }\n",
}


def outputs(model: Path, objects: int, batch: int = 8):
    import onnxruntime as ort
    from bench_pipeline import busy_head

    with tempfile.TemporaryDirectory() as tmp:
        busy = busy_head(model, objects, Path(tmp) / "busy.onnx")
        session = ort.InferenceSession(str(busy), providers=["CPUExecutionProvider"])
        x = np.random.default_rng(0).random((batch, 3, 640, 640), np.float32)
        return session.run(None, {session.get_inputs()[0].name: x})


def timed_source(limit: int) -> str:
    runtime = root / "jetpipe" / "runtime"
    text = (runtime / "postprocess.cu").read_text()
    header = (runtime / "outline.cuh").read_text() + f"\n__device__ long long diag_times[{limit} * 8 * 5];\n"
    text = text.replace('#include "outline.cuh"', header)
    kernel = text.index('extern "C" __global__ void seg_outlines(')
    body = text[kernel:]
    for line, marked in TIMED.items():
        assert line in body, f"seg_outlines no longer has {line.strip()!r}: update TIMED"
        body = body.replace(line, marked, 1)
    return text[:kernel] + body


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("model", type=Path)
    a.add_argument("--objects", type=int, default=30)
    args = a.parse_args()
    head, protos = outputs(args.model, args.objects)
    from pycuda.compiler import SourceModule

    from jetpipe.runtime import postprocess_gpu as pg
    from jetpipe.runtime.api import TensorSpec
    from jetpipe.runtime.cuda import CudaDevice
    from jetpipe.runtime.kernels import SOURCE, compile_module
    from jetpipe.tasks.segmentation_yolo import YoloSegmentation

    batch, classes = len(head), head.shape[1] - 4 - protos.shape[1]
    post = YoloSegmentation(classes=classes, coefficients=protos.shape[1], input_hw=(640, 640))
    device = CudaDevice()
    with device.active():
        specs = [TensorSpec(f"out{i}", np.dtype(np.float32), o.shape[1:]) for i, o in enumerate((head, protos))]
        reducer = pg.make_reducer(post.reduction(), device, compile_module(SOURCE.with_name(pg.SOURCE_NAME)),
                                  batch, 1, specs)
        stream, cuda = device.stream(), device.cuda
        buffers = [device.alloc(o.nbytes) for o in (head, protos)]
        for buffer, array in zip(buffers, (head, protos)):
            cuda.memcpy_htod(buffer, np.ascontiguousarray(array, np.float32))
        addresses = [int(b) for b in buffers]
        start, end = cuda.Event(), cuda.Event()

        def ms(launch, repeats=20):
            launch()
            stream.synchronize()
            start.record(stream)
            for _ in range(repeats):
                launch()
            end.record(stream)
            end.synchronize()
            return end.time_since(start) / repeats

        print(f"reduction (NMS, masks, outlines): {ms(lambda: reducer.launch(0, batch, addresses, stream)):.3f} ms "
              f"a batch of {batch}")
        out, mapped = reducer.device_out[0], reducer.mapped_address[0]
        timed = SourceModule(timed_source(reducer.limit), no_extern_c=True, options=["-O3"],
                             include_dirs=[str(root / "jetpipe" / "runtime")])
        for name, function, tolerance in (("outlines", reducer.outline, 0.5), ("outlines unsimplified",
                                                                                reducer.outline, 0.0)):
            def launch(function=function, tolerance=tolerance):
                for counter in (out["point_used"], out["spilled"], reducer.chain_used):
                    cuda.memset_d32_async(counter, 0, batch, stream)
                function.prepared_async_call(
                    (reducer.limit, batch), (32, 1, 1), stream, reducer.params, reducer.seg_params, out["counts"],
                    out["detections"], reducer.words, reducer.chains, np.int32(reducer.chain_cap),
                    reducer.chain_used, mapped["points"], np.int32(pg.OUTLINE_POINTS), out["point_used"],
                    out["outlines"], mapped["masks"], out["spilled"], np.float64(tolerance),
                    reducer.segment_distance, shared_size=pg.OUTLINE_SHARED_BYTES)
            print(f"{name}: {ms(launch):.3f} ms")
        function = timed.get_function("seg_outlines")
        function.prepare("PPPPPPiPPiPPPPdi")
        reducer.outline = function
        reducer.launch(0, batch, addresses, stream)
        stream.synchronize()
        cycles = np.zeros((batch, reducer.limit, 5), np.int64)
        cuda.memcpy_dtoh(cycles, timed.get_global("diag_times")[0])
        kept = cycles[cycles[:, :, 4] > 0]
        print("slowest boxes, cycles: pad, scan (with its traces), finish; points; mask words")
        for row in kept[np.argsort(-kept[:, :3].sum(1))[:6]]:
            print("   ", row.tolist())
        print("median:", np.median(kept, axis=0).tolist())
    device.close()


if __name__ == "__main__":
    main()
