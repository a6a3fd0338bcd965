"""Folders of evidence kept within a size and an age: the clips' and the snapshots' (only the files named as
their writer names them are counted or removed; nothing else in the folder is touched, and a symbolic link
under such a name is someone else's: neither counted nor removed)."""

from __future__ import annotations

import re
import stat
import time
from pathlib import Path

AGE_LOOK_S = 60.0  # with an age limit, the folder is looked at this often at least


class Room:
    """A writer's folder kept within its size before each file is written (room made first: the folder never
    holds more than max_total_mb, which lets a recording's budget count it), looked at only where a running
    total of what was written says the new file may not fit, or an age limit is due."""

    def __init__(self, folder: Path, names: re.Pattern, max_total_mb: float, max_age_h: float):
        self.folder, self.names, self.max_total_mb, self.max_age_h = folder, names, max_total_mb, max_age_h
        self.total: int | None = None  # the named files' bytes, as of the last look plus what was written since
        self.looked_at = float("-inf")

    def make(self, nbytes: int) -> None:
        """Room for a file of at most nbytes, the oldest named files removed where needed."""
        aged = self.max_age_h and time.monotonic() - self.looked_at >= AGE_LOOK_S
        if self.total is None or aged or self.total + nbytes > self.max_total_mb * 1e6:
            left = max(0.0, self.max_total_mb - nbytes / 1e6)
            self.total = keep_within(self.folder, self.names, left, self.max_age_h, remaining=True)
            self.looked_at = time.monotonic()

    def wrote(self, nbytes: int) -> None:
        self.total = (self.total or 0) + nbytes


def keep_within(folder: Path, names: re.Pattern, max_total_mb: float, max_age_h: float,
                remaining: bool = False) -> int:
    """The oldest of the folder's files whose names match `names` removed until the rest hold at most
    max_total_mb and none is older than max_age_h (0: no age limit); the number removed (remaining: the bytes
    the named files left hold instead)."""
    named = ((_lstat(p), p) for p in folder.iterdir() if names.fullmatch(p.name))
    files = sorted(((info, p) for info, p in named if info is not None and stat.S_ISREG(info.st_mode)),
                   key=lambda f: f[0].st_mtime)  # each file's stat once, never through a link
    now, total, removed = time.time(), sum(info.st_size for info, _ in files), 0
    for info, path in files:
        old = max_age_h and now - info.st_mtime > max_age_h * 3600
        if not old and total <= max_total_mb * 1e6:
            break
        total -= info.st_size
        path.unlink(missing_ok=True)
        removed += 1
    return total if remaining else removed


def _lstat(path: Path):
    """The entry's own stat; None where it went meanwhile (another writer's retention, the user)."""
    try:
        return path.lstat()
    except FileNotFoundError:
        return None
