"""One recording writes a folder at a time. A second one would repair the first's open segments at its start
(finish them as they stand, or delete those with nothing playable yet), and both would count the same budget.

The recording holds an advisory lock (flock) on DIR/.recording.lock for as long as it writes; the kernel lets it
go when the process ends, kill -9 included. A recording that finds it held waits for WAIT_S (a stopping serve's
recording process writes its last GOPs within CLOSE_WAIT_S, then is killed), then refuses in one line.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from pathlib import Path

from jetpipe.pipelines.config import ConfigError

LOCK_NAME = ".recording.lock"
WAIT_S = 15.0  # more than a stopping serve's recording process takes to end (recorder.CLOSE_WAIT_S + 2)
RETRY_S = 0.1


def hold_folder(folder: Path, wait_s: float | None = None) -> int:
    """The folder's lock, held (its descriptor: release_folder's); ConfigError where another recording holds it
    past wait_s (WAIT_S), or where the lock file is a link or not a plain file."""
    path = folder / LOCK_NAME
    try:  # never through a link; O_NONBLOCK: a FIFO put there does not hang the start
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{path} is a symbolic link: a recording never opens its files through a link; "
                              "remove it") from None
        raise ConfigError(f"record folder {folder}: {exc.strerror}: name a folder this user can write") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{path} is not a plain file: remove it")
    wait_s = WAIT_S if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise ConfigError(f"record folder {folder} is being recorded by another jetpipe (waited "
                                  f"{wait_s:.0f} s for it to end): stop it, or record into another folder") from None
            time.sleep(RETRY_S)


def release_folder(fd: int) -> None:
    os.close(fd)  # (the lock goes with its last descriptor)
