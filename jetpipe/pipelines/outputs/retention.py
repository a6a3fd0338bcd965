"""Folders of evidence kept within a size and an age: the clips' and the snapshots' (only the files named as
their writer names them are counted or removed; nothing else in the folder is touched, and a symbolic link
under such a name is someone else's: neither counted nor removed)."""

from __future__ import annotations

import re
import stat
import time
from pathlib import Path


def keep_within(folder: Path, names: re.Pattern, max_total_mb: float, max_age_h: float) -> int:
    """The oldest of the folder's files whose names match `names` removed until the rest hold at most
    max_total_mb and none is older than max_age_h (0: no age limit); the number removed."""
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
    return removed


def _lstat(path: Path):
    """The entry's own stat; None where it went meanwhile (another writer's retention, the user)."""
    try:
        return path.lstat()
    except FileNotFoundError:
        return None
