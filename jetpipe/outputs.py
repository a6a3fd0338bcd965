"""Output folders the project writes (bundles, reports): staged, swapped in, never someone else's.

A folder is written into a hidden sibling `.NAME.tmp-PID-*` and renamed into place
when complete. An existing folder is replaced only with --force and only when
it holds nothing but what the project writes there (`owned` says what that is):
a user's folder, the current folder and the input being read are refused.
Staging folders left by a killed run are cleaned up by the next run.

One run writes a folder at a time: check_destination claims it (a `.NAME.lock` file beside it holding the
run's pid, made with O_EXCL) until staging() has swapped it in; a second run meanwhile is refused with the
first one's pid, and a lock whose process has died is taken over. An output given as a symbolic link to a
folder is written where the link points (the link stays).
"""

from __future__ import annotations

import atexit
import contextlib
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


def check_writable(path: Path, flag: str) -> None:
    """Fail now, before any work, if `path` could not be created: test its nearest existing ancestor."""
    ancestor = Path(os.path.abspath(path)).parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise JetpipeError(f"{flag} {path}: {ancestor} is not a folder: choose another {flag}")
    try:
        fd, probe = tempfile.mkstemp(dir=ancestor, prefix=".jetpipe-write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise JetpipeError(f"{flag} {path}: cannot write in {ancestor} ({exc.strerror}): "
                           f"choose a writable {flag}") from None


def target(out: Path) -> Path:
    """Where an output is written: a symbolic link's folder (the link is kept), else `out` itself."""
    return Path(os.path.realpath(out)) if out.is_symlink() else out


_claimed: set[Path] = set()  # lock files this process holds


def _lock_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.lock")


def claim(out: Path, flag: str) -> None:
    """Make this run the one writer of `out` until staging() swaps it in (or the process ends)."""
    lock = _lock_path(out)
    if lock in _claimed:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):  # a second try after taking over a dead run's lock
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                holder = lock.read_text().strip()
            except OSError:
                holder = ""
            if _owner_alive(holder):
                raise JetpipeError(f"{flag} {out} is being written by another jetpipe run (pid {holder}): wait for "
                                   f"it to finish or choose another {flag}") from None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock)  # its run died (or it is this process's own, left by a failed run)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        _claimed.add(lock)
        return
    raise JetpipeError(f"{flag} {out}: another run keeps claiming it; try again")


def release(out: Path) -> None:
    lock = _lock_path(out)
    if lock in _claimed:
        _claimed.discard(lock)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)


@atexit.register
def release_all() -> None:
    """Give up every output this process claimed (a command that failed before writing its output)."""
    for lock in list(_claimed):
        with contextlib.suppress(OSError):
            os.unlink(lock)
    _claimed.clear()


def check_destination(out: Path, force: bool, flag: str, what: str, owned: Owned,
                      protected: tuple[Path, ...] = ()) -> None:
    """Refuse to write `out` where that would lose anything the project did not write; claim it.

    Runs first thing, before any work; recovers what a killed run left (clean_stale) before judging.
    """
    out = target(out)
    resolved = out.resolve()
    if resolved == Path.cwd().resolve() or resolved in Path.cwd().resolve().parents:
        raise JetpipeError(f"{flag} {out} is the current folder (or holds it): choose a new folder for the {what}")
    for other in protected:
        other = other.resolve()
        if resolved == other or other in resolved.parents or resolved in other.parents:
            raise JetpipeError(f"{flag} {out} overlaps {other}, which this command reads: choose another {flag}")
    check_writable(out, flag)
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
