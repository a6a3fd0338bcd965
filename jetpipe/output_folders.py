"""Output folders the project writes (bundles, reports): staged, swapped in, never someone else's.

A folder is written into a hidden sibling `.NAME.tmp-PID-*` and renamed into place
when complete. An existing folder is replaced only with --force and only when
it holds nothing but what the project writes there (`owned` says what that is):
a user's folder, the current folder and the input being read are refused.
Staging folders left by a killed run are cleaned up by the next run.

One run writes a folder at a time: check_destination claims it (an flock on a `.NAME.lock` file beside it,
which holds the run's pid for the message) until staging() has swapped it in; a second run meanwhile is
refused with the first one's pid; the kernel drops the lock of a run that died. An output given as a symbolic link to a
folder is written where the link points (the link stays).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from jetpipe.errors import JetpipeError

log = logging.getLogger(__name__)

# names a folder holds -> the names the project wrote there, or None when it is not the project's
Owned = Callable[[Path], "set[str] | None"]


STAGING_SUFFIX = 40  # what staging adds to an output's name (".NAME.tmp-PID-xxxxxxxx", ".NAME.lock"), at most


def check_writable(path: Path, flag: str, staged: bool = False) -> None:
    """Fail now, before any work, if `path` could not be created: test its nearest existing ancestor, and that
    every name on the way fits the file system (staged: with room for the staging folder's longer name)."""
    ancestor = Path(os.path.abspath(path)).parent
    while not _exists(ancestor):
        ancestor = ancestor.parent
    _check_name_lengths(Path(os.path.abspath(path)), ancestor, flag, STAGING_SUFFIX if staged else 0)
    if not ancestor.is_dir():
        raise JetpipeError(f"{flag} {path}: {ancestor} is not a folder: choose another {flag}")
    try:
        fd, probe = tempfile.mkstemp(dir=ancestor, prefix=".jetpipe-write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise JetpipeError(f"{flag} {path}: cannot write in {ancestor} ({exc.strerror}): "
                           f"choose a writable {flag}") from None


def check_new_file(path: Path, flag: str, where: str | None = None) -> None:
    """A file a run will create, checked before any work: writable (check_writable), its folder there (no
    writer of ours creates folders), and nothing of that name yet, a dangling link included (what is written
    would land where it points). where: the messages' subject (default "FLAG PATH")."""
    where = where or f"{flag} {path}"
    check_writable(path, flag)
    if not path.parent.is_dir():
        raise JetpipeError(f"{where}: folder {path.parent} does not exist: create it first")
    if os.path.lexists(path):
        raise JetpipeError(f"{where}: {path} exists: name a new file (jetpipe never overwrites one)")


def target(out: Path) -> Path:
    """Where an output is written: a symbolic link's folder (the link is kept), else `out` itself."""
    return Path(os.path.realpath(out)) if out.is_symlink() else out


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long to look up: not there
        return False


def _check_name_lengths(path: Path, ancestor: Path, flag: str, extra: int) -> None:
    """A name longer than the file system takes (255 bytes on most) failed mid-way with a traceback."""
    try:
        name_max = os.pathconf(ancestor, "PC_NAME_MAX")
        path_max = os.pathconf(ancestor, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    for part in path.relative_to(ancestor).parts:
        room = name_max - (extra if part == path.name else 0)
        if len(os.fsencode(part)) > room:
            raise JetpipeError(f"{flag} {_shortened(path)}: a name of {len(os.fsencode(part))} bytes ({part[:24]}...); "
                               f"names here hold at most {room}: choose a shorter {flag}")
    if len(os.fsencode(str(path))) + extra > path_max:
        raise JetpipeError(f"{flag} {_shortened(path)}: the path is {len(os.fsencode(str(path)))} bytes, more than "
                           f"this file system takes ({path_max - extra}): choose a shorter {flag}")


def _shortened(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 80 else f"{text[:40]}...{text[-24:]}"


_held: dict[Path, int] = {}  # lock file -> the descriptor holding its flock, for each output this process claimed


def _lock_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.lock")


def claim(out: Path, flag: str) -> None:
    """Make this run the one writer of `out` until staging() swaps it in (or the process ends).

    The claim is an flock on `.NAME.lock`, not the file's existence: the kernel drops it when its process dies
    however it dies, and there is no moment where a second run sees a lock file not yet holding its pid and
    takes it for a dead run's (the race a pid-in-a-file lock had; CI found it).
    """
    lock = _lock_path(out)
    if lock in _held:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()  # empty while the holder writes it
            os.close(fd)
            by = f" (pid {holder})" if holder.isdigit() else ""
            raise JetpipeError(f"{flag} {out} is being written by another jetpipe run{by}: wait for it to finish "
                               f"or choose another {flag}") from None
        if _still_named(fd, lock):
            break
        os.close(fd)  # its holder removed it between our open and our flock: lock the file there now
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _held[lock] = fd


def _still_named(fd: int, lock: Path) -> bool:
    try:
        named = os.stat(lock)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def release(out: Path) -> None:
    _release(_lock_path(out))


def _release(lock: Path) -> None:
    fd = _held.pop(lock, None)
    if fd is None:
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(lock)  # removed while still locked, so a run that opened it sees it unnamed and retries
    os.close(fd)


@atexit.register
def release_all() -> None:
    """Give up every output this process claimed (a command that failed before writing its output)."""
    for lock in list(_held):
        with contextlib.suppress(OSError):
            _release(lock)


def check_destination(out: Path, force: bool, flag: str, what: str, owned: Owned,
                      protected: tuple[Path, ...] = ()) -> None:
    """Refuse to write `out` where that would lose anything the project did not write; claim it.

    Runs first thing, before any work; recovers what a killed run left (clean_stale) before judging.
    """
    check_writable(out, flag, staged=True)  # names first: a too-long one fails every lookup after
    out = target(out)
    resolved = out.resolve()
    if resolved == Path.cwd().resolve() or resolved in Path.cwd().resolve().parents:
        raise JetpipeError(f"{flag} {out} is the current folder (or holds it): choose a new folder for the {what}")
    for other in protected:
        other = other.resolve()
        if resolved == other or other in resolved.parents or resolved in other.parents:
            raise JetpipeError(f"{flag} {out} overlaps {other}, which this command reads: choose another {flag}")
    check_writable(out, flag, staged=True)
    claim(out, flag)
    try:
        _check_existing(out, force, flag, what, owned)
    except BaseException:
        release(out)
        raise


def _check_existing(out: Path, force: bool, flag: str, what: str, owned: Owned) -> None:
    clean_stale(out)
    if not out.exists():
        return
    if not out.is_dir():
        raise JetpipeError(f"{flag} {out} exists and is not a folder: remove it or choose another {flag}")
    entries = {p.name for p in out.iterdir()}
    if not entries:
        return
    ours = owned(out)
    if ours is None:
        raise JetpipeError(f"{flag} {out} exists and is not a {what}: --force replaces only a {what}; "
                           f"choose another {flag}")
    foreign = sorted(entries - ours)
    if foreign:
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise JetpipeError(f"{flag} {out} is a {what} with other files in it ({shown}): move them out or "
                           f"choose another {flag} (--force replaces only what jetpipe wrote)")
    if not force:
        raise JetpipeError(f"{flag} {out} already exists: pass --force to replace it, or choose another {flag}")


def _staging_prefix(out: Path, kind: str) -> str:
    return f".{out.name}.{kind}-"


def clean_stale(out: Path) -> None:
    """Remove staging folders of `out` left by runs that died; put back an old folder a swap left aside."""
    if not out.parent.is_dir():
        return
    for kind in ("tmp", "old"):
        prefix = _staging_prefix(out, kind)
        for path in sorted(out.parent.iterdir()):
            if not path.name.startswith(prefix) or _owner_alive(path.name[len(prefix):]):
                continue
            if kind == "old" and not out.exists():
                try:
                    os.replace(path, out)
                    log.warning("restored %s from %s (a run was stopped while swapping it)", out, path.name)
                except OSError as exc:
                    log.warning("could not restore %s from %s: %s", out, path, exc.strerror)
            else:
                shutil.rmtree(path, ignore_errors=True)
                log.info("removed %s, left by a run that was stopped", path)


def _owner_alive(suffix: str) -> bool:
    pid = suffix.split("-", 1)[0]
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def staging(out: Path) -> Iterator[Path]:
    """Yield a temp folder; on success it replaces `out`, on any failure (or signal) it is removed.

    The caller has run check_destination() (which claimed `out`; released here). The swap of the old and
    the new folder runs with SIGINT/SIGTERM held back, so a signal cannot leave neither.
    """
    out = target(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f"{_staging_prefix(out, 'tmp')}{os.getpid()}-"))
    try:
        yield tmp
        _make_readable(tmp)
        with _signals_held():
            old = None
            if out.exists():
                old = out.with_name(f"{_staging_prefix(out, 'old')}{os.getpid()}")
                os.replace(out, old)
            os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        release(out)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _make_readable(folder: Path) -> None:
    """mkdtemp/mkstemp create owner-only entries; an output gets the usual modes (umask applies)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)
