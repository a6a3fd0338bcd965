"""Running a benchmark's child process: one helper for the scripts that measure each case in a fresh process
(a fresh CUDA context, a checkout of their own, a clean RSS)."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass


@dataclass
class Child:
    returncode: int
    stdout: str
    stderr: str
    seconds: float  # wall time

    def last_error_line(self) -> str:
        return (self.stderr.strip().splitlines() or ["?"])[-1]


def run(argv: list[str], cwd=None, env: dict | None = None, timeout: float | None = None) -> Child:
    started = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return Child(done.returncode, done.stdout, done.stderr, round(time.monotonic() - started, 1))


def last_json(argv: list[str], on_error: dict, timeout: float | None = None) -> dict:
    """The last JSON line the child printed on stdout; `on_error` with the child's last stderr line as
    "error" where it failed or printed none."""
    child = run(argv, timeout=timeout)
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    if child.returncode != 0 or not lines:
        return {**on_error, "error": child.last_error_line()}
    return json.loads(lines[-1])
