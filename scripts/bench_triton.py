#!/usr/bin/env python3
"""`jetpipe serve` through a Triton server on the same host against the local backend, in one run.

  python scripts/bench_triton.py BUNDLE [--streams 8] [--seconds 20] [--size 1920x1080] [--local onnxruntime-cpu]
                                 [--triton-python .venv-triton/bin/python] [--server-instances 1]
                                 [--hosts pytriton,python-backend] [--json out.json]

The server is tests/triton_server.py (nvidia-pytriton's tritonserver hosting the bundle's ONNX through ONNX
Runtime in its Python backend: through pytriton, or as a model repository with a model.py, `--hosts`) in the
Triton venv, reached through system shared memory and through plain gRPC (`?shm=off`); each run serves
`--streams` unpaced synthetic NV12 streams, offered as fast as the pipeline takes frames (saturated, none
dropped; before 2026-11-25, session 22, they were live and the frames beyond were made and dropped),
for `--seconds`, results to a JSONL file; frames/s, p50/p99 latency and the client's CPU per frame are
printed for each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root)]


def serve(bundle: Path, backend: str, args, folder: Path) -> dict:
    from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
    from jetpipe.pipelines.service.daemon import Pipeline

    width, height = args.size.split("x")
    config = validate(PipelineConfig(
        bundle=bundle, sources=[SourceConfig(f"synthetic://{width}x{height}@0/nv12") for _ in range(args.streams)],
        sinks=[f"jsonl:{folder / 'out.jsonl'}"], backend=backend, duration=args.seconds, metrics_listen="",
        log_every_s=1e9, max_frame_hw=(int(height), int(width))))
    cpu = time.process_time()
    summary = Pipeline(config).run()
    processed = sum(summary["processed"])
    return {"backend": summary["backend"], "frames": processed, "fps": summary["throughput_fps"],
            "failed": sum(summary["failed"]), "latency_ms": summary["latency_ms"]["total"],
            "client_cpu_ms_per_frame": round(1e3 * (time.process_time() - cpu) / max(1, processed), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--size", default="1920x1080")
    parser.add_argument("--local", default="onnxruntime-cpu", help="the local backend compared")
    parser.add_argument("--triton-python", type=Path, default=root / ".venv-triton" / "bin" / "python")
    parser.add_argument("--server-instances", type=int, default=1, help="model instances on the server")
    parser.add_argument("--transports", default="system,off",
                        help="?shm= values to run (cuda: CUDA shared memory, with the GPU runtime)")
    parser.add_argument("--hosts", default="pytriton",
                        help="how the server hosts the model, comma-separated: pytriton, python-backend")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        report["local"] = serve(args.bundle, args.local, args, folder)
        print(json.dumps({"local": report["local"]}), flush=True)
        from tests.triton_server import TritonServer

        runs = [(host, shm) for host in args.hosts.split(",") for shm in args.transports.split(",")]
        for host in args.hosts.split(","):
            server = TritonServer(args.bundle, "model", folder / f"triton-{host}.log", args.triton_python, gpu=True,
                                  instances=args.server_instances, host=host)
            server.start()
            try:
                for shm in args.transports.split(","):
                    name, uri = f"triton_{host}_{shm}", f"{server.uri}?shm={shm}"
                    report[name] = serve(args.bundle, uri, args, folder)
                    print(json.dumps({name: report[name]}), flush=True)
            finally:
                server.stop()
    for name in (f"triton_{host}_{shm}" for host, shm in runs):
        report[f"{name}_vs_local"] = round(report[name]["fps"] / max(1e-9, report["local"]["fps"]), 3)
    print(json.dumps({k: v for k, v in report.items() if k.endswith("_vs_local")}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
