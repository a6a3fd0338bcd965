#!/usr/bin/env python3
"""PyNvVideoCodec's ThreadedDecoder against Demuxer + Decode, as a capture thread uses them (issue 27).

  python scripts/diag/threaded_decoder.py CLIP.mp4            (a 1080p H.264 file)
  python scripts/diag/threaded_decoder.py --faults CLIP.mp4 YUV444.mp4

--faults: does a ThreadedDecoder survive a file with garbage over 5 % of its bytes mid-file, a truncated file,
a 4:4:4 H.264 file (each in a process of its own: a crash is its exit code)?

N Python threads (8, 32, 64), each reading frames of its own decoder into a device slot (a device-to-device copy
and a synchronize, as jetpipe's NVDEC source does), for 4 s, with a pure-Python thread spinning beside them: the
frames/s, and the spinner's rate over its rate alone (the GIL left for the rest of a pipeline). First, one
ThreadedDecoder to the end of the file and again after reconfigure_decoder (looping loses or repeats nothing?).
"""
import json
import sys
import threading
import time

import pycuda.driver as cuda
import PyNvVideoCodec as nvc

FAULT_CHILD = r"""
import sys, PyNvVideoCodec as nvc
td = nvc.ThreadedDecoder(sys.argv[1], 3, gpu_id=0, use_device_memory=True)
count = 0
while True:
    frames = td.get_batch_frames(1)
    if not frames:
        break
    count += 1
print("frames", count)
td.end()
"""
DECODE_CHILD = r"""
import sys, PyNvVideoCodec as nvc
demuxer = nvc.CreateDemuxer(filename=sys.argv[1])
decoder = nvc.CreateDecoder(gpuid=0, codec=demuxer.GetNvCodecId(), usedevicememory=True)
count, errors = 0, 0
for packet in demuxer:
    try:
        count += len(decoder.Decode(packet))
    except Exception:
        errors += 1
print("frames", count, "errors", errors)
"""


def faults(clip: str, yuv444: str) -> None:
    import random
    import subprocess
    import tempfile

    data = open(clip, "rb").read()
    bad, rng = bytearray(data), random.Random(1)
    for i in range(len(data) // 3, len(data) // 3 + len(data) // 20, 97):
        bad[i:i + 40] = bytes(rng.getrandbits(8) for _ in range(40))
    with tempfile.TemporaryDirectory() as tmp:
        files = {"corrupt": f"{tmp}/corrupt.mp4", "truncated": f"{tmp}/truncated.mp4", "yuv444": yuv444}
        open(files["corrupt"], "wb").write(bad)
        open(files["truncated"], "wb").write(data[:len(data) * 2 // 3])
        for name, path in files.items():
            for kind, child in (("threaded", FAULT_CHILD), ("decode", DECODE_CHILD)):
                done = subprocess.run([sys.executable, "-c", child, path], capture_output=True, text=True,
                                      timeout=120)
                said = done.stderr.strip().splitlines()[-2:] if done.stderr else []
                print(json.dumps({"file": name, "decoder": kind, "exit": done.returncode,
                                  "out": done.stdout.strip(), "stderr": said}))


if sys.argv[1] == "--faults":
    faults(sys.argv[2], sys.argv[3])
    sys.exit(0)
clip, seconds = sys.argv[1], 4.0
cuda.init()
ctx = cuda.Device(0).retain_primary_context()
ctx.push()

def spin_for(d):
    n, end = 0, time.perf_counter() + d
    while time.perf_counter() < end:
        n += 1
    return n

def eos_and_loop():
    td = nvc.ThreadedDecoder(clip, buffer_size=4, gpu_id=0, cuda_context=ctx.handle, cuda_stream=0,
                             use_device_memory=True)
    meta = td.get_stream_metadata()
    count, t0 = 0, time.perf_counter()
    while True:
        frames = td.get_batch_frames(1)
        if not frames:
            break
        count += len(frames)
    first = time.perf_counter() - t0
    td.reconfigure_decoder(clip)
    again = 0
    while True:
        frames = td.get_batch_frames(4)
        if not frames:
            break
        again += len(frames)
    f = None
    td.reconfigure_decoder(clip)
    f = td.get_batch_frames(1)[0]
    out = {"frames_first_pass": count, "second_pass_after_reconfigure": again, "first_pass_s": round(first, 3),
           "meta": str(meta)[:300], "frame_attrs": [a for a in dir(f) if not a.startswith("_")][:40],
           "pts": f.getPTS() if hasattr(f, "getPTS") else None}
    td.end()
    return out

def run(kind, n):
    ctx.push()
    stop, counts = threading.Event(), [0] * n
    ready = threading.Barrier(n + 1)
    def worker(i):
        ctx.push()
        stream = cuda.Stream()
        slot = cuda.mem_alloc(1920 * 1080 * 3 // 2)
        if kind == "threaded":
            td = nvc.ThreadedDecoder(clip, buffer_size=8, gpu_id=0, cuda_context=ctx.handle,
                                     cuda_stream=stream.handle, use_device_memory=True)
            def nxt():
                fr = td.get_batch_frames(1)
                if not fr:
                    td.reconfigure_decoder(clip)
                    fr = td.get_batch_frames(1)
                return fr[0]
        else:
            dm = nvc.CreateDemuxer(filename=clip)
            dec = nvc.CreateDecoder(gpuid=0, codec=dm.GetNvCodecId(), cudacontext=ctx.handle,
                                    cudastream=stream.handle, usedevicememory=True)
            state = {"p": iter(dm), "q": []}
            def nxt():
                while not state["q"]:
                    p = next(state["p"], None)
                    if p is None or p.bsl == 0:
                        state["p"] = iter(nvc.CreateDemuxer(filename=clip))
                        continue
                    state["q"].extend(dec.Decode(p))
                return state["q"].pop(0)
        for _ in range(10):
            nxt()
        ready.wait()
        while not stop.is_set():
            f = nxt()
            cuda.memcpy_dtod_async(slot, f.GetPtrToPlane(0), 1920 * 1080 * 3 // 2, stream)
            stream.synchronize()
            counts[i] += 1
        if kind == "threaded":
            td.end()
        cuda.Context.pop()
    ts = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    ready.wait()
    time.sleep(0.5)
    c0 = sum(counts)
    beside = spin_for(seconds)
    fps = (sum(counts) - c0) / seconds
    stop.set()
    for t in ts:
        t.join()
    cuda.Context.pop()
    return {"kind": kind, "threads": n, "fps": round(fps), "spinner_share": round(beside / ALONE, 3)}

ALONE = spin_for(seconds)
print(json.dumps(eos_and_loop()), flush=True)
for n in (8, 32, 64):
    for kind in ("decode", "threaded"):
        print(json.dumps(run(kind, n)), flush=True)
ctx.pop()
