"""A recording made by several serving processes: each worker of a daemon on several GPUs (`--gpus`,
`--workers-per-gpu`) records its own streams into a part of its own, DIR/worker{N}: a whole recording (its
segments, its index, its share of the budget), kept by that process alone. A one-process serve records into DIR
itself. What reads a recording (the review API, `jetpipe export recording`) reads every part.

Why parts, not one index written by every worker: a budget is kept by counting what its writer wrote since it
last looked, before each GOP (budget.py); one process cannot see another's writes between its looks, so two
writers of one folder could pass its size together. Each part's budget is exact, and the parts' budgets add up
to the whole.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from jetpipe.pipelines.outputs.recording.index import INDEX_NAME

PART = re.compile(r"worker(\d{1,3})")  # a worker's part: its number among the daemon's workers


def part_folder(folder: Path, worker: int) -> Path:
    """Worker number `worker`'s part of the recording (or the clips', the snapshots') in `folder`."""
    return folder / f"worker{worker}"


def parts_of(folder: Path) -> list[tuple[str, Path]]:
    """(tag, folder) of each part of the recording in `folder` that holds an index: "" for the folder's own (a
    one-process serve's), the worker's number for DIR/workerN; never through a link."""
    found = [("", folder)] if _has_index(folder) else []
    try:
        entries = sorted(folder.iterdir(), key=lambda p: p.name)
    except OSError:
        return found
    for entry in entries:
        named = PART.fullmatch(entry.name)
        if named and not entry.is_symlink() and entry.is_dir() and _has_index(entry):
            found.append((str(int(named.group(1))), entry))
    return found


def read_only(part: Path, timeout: float = 5.0) -> sqlite3.Connection:
    """A read-only connection to a part's index (WAL: it reads while the part's recorder writes)."""
    return sqlite3.connect(f"file:{part / INDEX_NAME}?mode=ro", uri=True, timeout=timeout)


def _has_index(folder: Path) -> bool:
    index = folder / INDEX_NAME
    return index.is_file() and not index.is_symlink()
