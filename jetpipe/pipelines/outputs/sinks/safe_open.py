"""How a sink opens the files it writes: it makes them, or appends to one it was told to, never through a link.

A sink's path may lie in a folder others can write (/tmp, a shared export). A name there may already be a
symbolic link to /etc/passwd or a user's file, or another program's file. So a sink
  - creates its file (O_CREAT | O_EXCL: refused where anything of that name exists, a dangling link too),
  - appends only where told to (`?append=1`) and only to a regular file, not a link (O_NOFOLLOW),
and an encoder process that opens the path itself gets a file the sink has just made (`claim`). In a
sticky folder such as /tmp nobody else can then swap that file for a link.
"""

from __future__ import annotations

import errno
import os
import stat
from contextlib import contextmanager
from pathlib import Path

from jetpipe.errors import JetpipeError

NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC  # made here, never through a link
# O_RDWR: its first line is read (is it JSONL?); O_NONBLOCK: a FIFO is not waited on; no effect on a file
_APPEND = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MODE = 0o644


def create(path: Path, spec: str, hint: str = "name a new file") -> int:
    """A descriptor of a new file at `path` made by this call; one line (JetpipeError) where anything of
    that name is there already, a link included, or it cannot be made."""
    try:
        return os.open(path, NEW_FILE, MODE)
    except FileExistsError:
        what = "a symbolic link" if os.path.islink(path) else "there already"
        raise JetpipeError(f"sink {spec}: {path} is {what}: {hint} (a sink never writes into a file it did not "
                           "make)") from None
    except OSError as exc:
        raise JetpipeError(f"sink {spec}: cannot create {path} ({exc.strerror}): choose a writable path") from None


def claim(path: Path, spec: str) -> None:
    """Make the (empty) file an encoder process will write, so that it writes into the sink's own file."""
    os.close(create(path, spec))


def open_append(path: Path, spec: str) -> int:
    """A descriptor appending to the regular file at `path` (created when missing); one line where it is a
    link or not a regular file."""
    try:
        fd = os.open(path, _APPEND)
    except FileNotFoundError:
        return create(path, spec)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise JetpipeError(f"sink {spec}: {path} is a symbolic link: name the file itself (a sink never "
                               "writes through a link)") from None
        raise JetpipeError(f"sink {spec}: cannot open {path} for appending ({exc.strerror}): choose a writable "
                           "path") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise JetpipeError(f"sink {spec}: {path} is not a regular file: name a file")
    return fd


def write_whole(path: Path, data) -> None:
    """`data` as a new file at `path`, whole or not at all: written under a temporary name this call makes
    (refused where anything has it, a link too), then linked to `path`, which must not exist (FileExistsError:
    nothing is overwritten); a reader never sees half a file. Raises OSError (a full disk) leaving nothing."""
    part = path.with_name(f".{path.name}.part")
    fd = os.open(part, NEW_FILE, MODE)  # only a file this call made is unlinked below
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.link(part, path)
    finally:
        part.unlink(missing_ok=True)


@contextmanager
def linked_when_whole(path: Path):
    """For a writer that opens its file by name (FFmpeg's MP4 muxer: faststart's second pass reopens it): a
    temporary name beside `path`, made here first (refused where anything has it, a link too; in a sticky folder
    nobody else can swap it for a link meanwhile), given to the block; linked to `path` when the block ends
    (FileExistsError where anything has that name: nothing is overwritten), and removed whatever happens. Only a
    file this call made is ever removed."""
    part = path.with_name(f".{path.name}.part")
    os.close(os.open(part, NEW_FILE, MODE))
    try:
        yield part
        os.link(part, path)
    finally:
        part.unlink(missing_ok=True)
