"""Helpers the tests share: a free port, waiting for a condition, a `jetpipe serve` process, CUDA MPS's control
socket."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A port of loopback free now (a server started right after takes it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout: float = 120.0, what: str = "", every: float = 0.05) -> bool:
    """Until condition() is true (then True); fails the test naming `what` after `timeout` seconds (a loaded
    2-core machine is slow, never wrong: wait for the condition, not for a fixed time)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what or condition}"
        time.sleep(every)
    return True


BLOCKED_STDOUT_SERVE = """
import sys, threading, time
from jetpipe.cli import main
from jetpipe.pipelines.core import drain
from jetpipe.pipelines.outputs.sinks import fanout

drain.STAGE_STUCK_S = 1.0
run = fanout.SinkFanout.run

def watched(self):  # says when the records' queue is full: the writer is blocked in the stdout sink's write
    def watch():
        while not self.records.full():
            time.sleep(0.05)
        print("blocked", file=sys.stderr, flush=True)
    threading.Thread(target=watch, daemon=True).start()
    run(self)

fanout.SinkFanout.run = watched
sources = [arg for _ in range(4) for arg in ("--source", "synthetic:64x48@30")]
sys.exit(main(["serve", "--bundle", sys.argv[1], *sources, "--sink", "stdout", "--metrics", "", "--duration", "600",
               *sys.argv[2:]]))
"""


def serve_with_stdout_blocked(bundle, cwd, extra: list[str], env: dict | None = None) -> tuple:
    """`serve --sink stdout` (4 synthetic cameras, extra: more flags) whose stdout is never read: once the records'
    queue is full (the writer blocked in its write), two SIGTERMs. (exit code, the summary, stderr); fails where
    the process outlives 60 s after the signals."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.Popen([sys.executable, "-c", BLOCKED_STDOUT_SERVE, str(bundle), *extra], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True)
    reader.start()
    err: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while not err or err[-1].strip() != "blocked":
            err.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)  # the rest of stderr
    while not lines.empty():
        err.append(lines.get())
    said = [line for line in err if line.startswith('{"summary"')]
    return proc.returncode, json.loads(said[0])["summary"] if said else {}, "".join(err)


def serve_process(argv, cwd=None, env: dict | None = None) -> subprocess.Popen:
    """`python -m jetpipe serve ARGV` with this checkout first on the path, its output captured as text."""
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.Popen([sys.executable, "-m", "jetpipe", "serve", *map(str, argv)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class MpsControl:
    """A stand-in for CUDA MPS's control daemon as a client sees it: its `control` socket (AF_UNIX, seqpacket) in
    a folder of its own, listened on until stop(), which leaves the socket behind as the daemon's quit does."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="mps-")  # short: a socket's path has at most 107 bytes
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(os.path.join(self.folder, "control"))
        self.listener.listen(16)

    def stop(self) -> None:
        self.listener.close()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def jetson_pipeline_in_software(monkeypatch) -> None:
    """The GStreamer pipeline built for a Jetson, with software elements in nvv4l2decoder's and nvvidconv's places
    (no Jetson on hand); the test is skipped, with the package to install, where GStreamer lacks one of them."""
    from jetpipe.pipelines.ingest.sources import gstreamer

    if shutil.which("gst-inspect-1.0") is None:
        pytest.skip("GStreamer's tools are not installed (gstreamer1.0-tools)")
    for element in ("openh264dec", "mpegtsmux", "h264parse", "parsebin"):
        if subprocess.run(["gst-inspect-1.0", element], capture_output=True).returncode != 0:
            pytest.skip(f"GStreamer's {element} is not installed (gstreamer1.0-plugins-bad / -base)")
    monkeypatch.setattr(gstreamer, "DECODER", "openh264dec")
    monkeypatch.setattr(gstreamer, "TO_NV12", "videoconvert")
