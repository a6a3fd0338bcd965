"""Helpers the tests share: a free port, waiting for a condition, a `jetpipe serve` process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

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
