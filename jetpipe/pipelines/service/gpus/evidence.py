"""Each worker's own part of the recording's, the clips' and the snapshots' folders (recording/parts.py):
DIR/workerN, with 1/N of each budget (N: the daemon's workers). A worker's part holds only what that worker
writes, so it keeps the part within its share exactly, and the shares add up to the whole budget. A worker
started again after a death takes the same part (its recording repaired at its start, as after kill -9). The
face's review API reads every part.

The shares are equal, not by each worker's streams: streams are placed evenly, and a stream added later goes to
one worker's share. A worker whose streams need more than its share finds that at start-up, as one process does.
"""

from __future__ import annotations

from pathlib import Path

from jetpipe.pipelines.amounts import say_bytes
from jetpipe.pipelines.config import MIN_RECORD_BYTES, media_reserve
from jetpipe.pipelines.outputs.recording.parts import part_folder
from jetpipe.pipelines.service.gpus.plan import GpuError


def check(config, workers: int) -> None:
    """Each worker's share of the recording's budget holds its index and a segment beside its share of the clips and
    snapshots, and every part is a folder of ours (made where missing, never a link): one line otherwise."""
    if workers < 2:
        return
    record = config.record
    if record.folder:
        left = (record.max_size - media_reserve(config)) // workers
        if left < MIN_RECORD_BYTES:
            raise GpuError(f"--record {record.folder}: each of the {workers} workers records its streams within "
                           f"1/{workers} of --record-max-size {say_bytes(record.max_size)}, which leaves "
                           f"{say_bytes(left)} for its segments beside its clips and snapshots, less than "
                           f"{say_bytes(MIN_RECORD_BYTES)}: raise --record-max-size")
    for table, option in ((record, "--record"), (config.clips, "--clips"), (config.snapshots, "--snapshots")):
        for worker in range(workers if table.folder else 0):
            _make(part_folder(Path(table.folder), worker), option)


def share(part, worker: int, workers: int) -> None:
    """A worker's configuration (its own copy) pointed at its parts, with its shares of the budgets."""
    if workers < 2:
        return
    if part.record.folder:
        part.record.folder = str(part_folder(Path(part.record.folder), worker))
        part.record.max_size //= workers
    for table in (part.clips, part.snapshots):
        if table.folder:
            table.folder = str(part_folder(Path(table.folder), worker))
            table.max_total_mb /= workers


def _make(folder: Path, option: str) -> None:
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise GpuError(f"{option}: {folder} is a link or a file: a worker's part is a folder of its own, never "
                       "written through a link; move it away")
    try:
        folder.mkdir(exist_ok=True)
    except OSError as exc:
        raise GpuError(f"{option}: cannot make {folder} ({exc.strerror}): name a folder this user can write") from None
