"""Records as JSON lines: `jsonl:PATH` (a file) and `stdout`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.outputs.sinks import safe_open
from jetpipe.pipelines.outputs.sinks.base import SinkBase, sink_options
from jetpipe.tasks import json_numbers


class JsonlSink(SinkBase):
    """One JSON line per record. `jsonl:PATH` creates PATH (refused where it exists); `jsonl:PATH?append=1` adds
    to a JSONL file (created when missing). Never through a symbolic link (safe_open)."""

    def __init__(self, spec: str):
        text, options = sink_options(spec, ("append",))
        if options.get("append", "0") not in ("0", "1"):
            raise JetpipeError(f"sink {spec}: append={options['append']!r}: 1 (add to the file) or 0")
        self.path, self.spec = Path(text), spec
        if not text:
            raise JetpipeError(f"sink {spec}: name the file, e.g. jsonl:results.jsonl")
        if self.path.parent and not self.path.parent.exists():
            raise JetpipeError(f"sink {spec}: folder {self.path.parent} does not exist")
        if options.get("append") == "1":
            fd = safe_open.open_append(self.path, spec)
            _check_jsonl(fd, spec)
        else:
            fd = safe_open.create(self.path, spec, hint="name a new file, or add ?append=1 to add to it")
        self.file = os.fdopen(fd, "a", buffering=1, encoding="utf-8")  # line-buffered: a crash loses a line
        json_numbers.make_tables()  # the frames' records' JSON: its tables made now, not at the first record

    def describe(self) -> str:
        return f"jsonl:{self.path}"

    def write(self, record) -> None:
        self.file.write(record.json() + "\n")

    def close(self) -> None:
        self.file.flush()
        self.file.close()


def _check_jsonl(fd: int, spec: str) -> None:
    """A file appended to must hold JSON lines already (or nothing): it starts with a JSON object."""
    head = os.pread(fd, 4096, 0).lstrip()
    if head and not head.startswith(b"{"):
        os.close(fd)
        raise JetpipeError(f"sink {spec}: the file does not hold JSON lines: name a new file, or a JSONL file "
                           "to add to")


class StdoutSink(SinkBase):
    def __init__(self):
        json_numbers.make_tables()  # the frames' records' JSON: its tables made now, not at the first record

    def describe(self) -> str:
        return "stdout"

    def write(self, record) -> None:
        sys.stdout.write(record.json() + "\n")

    def close(self) -> None:
        sys.stdout.flush()
