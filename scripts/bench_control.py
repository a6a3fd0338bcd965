#!/usr/bin/env python3
"""The control API under a crowd (issue 63): 1,000 concurrent POST /rules, then DELETE, then GET from loopback,
against a daemon serving a camera, beside the same run without them (arms alternated).

  python scripts/bench_control.py BUNDLE [--requests 1000] [--camera synthetic://320x240@2/nv12]
                                         [--seconds 20] [--repeats 2] [--backend auto] [--json out.json]

Reported per run: each flood's answers by status (a reset or a time-out is named, never hidden) and its wall
time, and the camera's frames: processed, dropped, latency p50 / p99 (the target: the p99 within 2x of the
idle run's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _ask(host: str, port: int, method: str, path: str, body) -> int | str:
    data = json.dumps(body).encode() if body is not None else b""
    try:
        reader, writer = await asyncio.open_connection(host, port)
        head = f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(data)}\r\n"
        writer.write((head + ("Content-Type: application/json\r\n" if data else "") + "\r\n").encode() + data)
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 60)
        writer.close()
        return int(status.split()[1]) if status else "no answer"
    except (OSError, asyncio.TimeoutError) as exc:
        return type(exc).__name__


def flood(port: int, requests: int) -> dict:
    """POST, DELETE, GET /rules, `requests` at once each: {method: {"answers": {status: n}, "seconds": s}}."""
    line = {"kind": "line", "points": [[0.5, 0], [0.5, 1]]}
    asks = {"POST": lambda i: ("/rules", {**line, "name": f"r{i}", "streams": [i % 50]}),
            "DELETE": lambda i: (f"/rules/r{i}", None), "GET": lambda i: ("/rules", None)}
    result = {}
    for method, ask in asks.items():
        started = time.monotonic()
        answers = asyncio.run(_gather(port, method, ask, requests))
        result[method] = {"answers": dict(Counter(map(str, answers))), "seconds": round(time.monotonic() - started, 2)}
    return result


async def _gather(port, method, ask, requests):
    return await asyncio.gather(*(_ask("127.0.0.1", port, method, *ask(i)) for i in range(requests)))


def run(args, crowd: bool) -> dict:
    from jetpipe.pipelines.config import ControlConfig, PipelineConfig, SourceConfig, validate
    from jetpipe.pipelines.service.daemon import Pipeline

    port = _free_port()
    config = validate(PipelineConfig(bundle=Path(args.bundle), sources=[SourceConfig(args.camera)],
                                     metrics_listen=f"127.0.0.1:{port}", backend=args.backend, tracker="bytetrack",
                                     control=ControlConfig(enabled=True, max_streams=1), duration=args.seconds,
                                     log_every_s=1e9))
    pipeline = Pipeline(config)
    floods = {}
    if crowd:
        def later():
            time.sleep(min(3.0, args.seconds / 4))
            floods.update(flood(port, args.requests))
        threading.Thread(target=later, daemon=True).start()
    summary = pipeline.run()
    total = summary["latency_ms"]["total"]
    return {"run": "crowd" if crowd else "idle", "processed": sum(summary["processed"]),
            "dropped": sum(summary["dropped"]), "p50_ms": total.get("0.5"), "p99_ms": total.get("0.99"),
            "max_ms": total.get("max"), "floods": floods}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--camera", default="synthetic://320x240@2/nv12")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args()
    rows = []
    for _ in range(args.repeats):
        for crowd in (False, True):
            rows.append(run(args, crowd))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
