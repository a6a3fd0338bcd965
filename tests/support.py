"""Helpers the tests share: a free port, waiting for a condition, a `jetpipe serve` process, CUDA MPS's control
socket."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
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
