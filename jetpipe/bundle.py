"""Bundles: a folder with the processed ONNX, the engine (where built) and a manifest.

Written into a temporary sibling folder and renamed into place, so an
interrupted build never leaves a partial bundle, and `--force` never loses the
old bundle before the new one is complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from jetpipe.errors import BundleError

MANIFEST = "manifest.json"
MODEL_FILE = "model.onnx"
ENGINE_FILE = "model.engine"
CALIBRATION_FILE = "calibration.json"
FORMAT_VERSION = 1


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temp file in the same folder and os.replace: never a half file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: Path, data: dict) -> None:
    atomic_write(path, (json.dumps(data, indent=2) + "\n").encode())


def check_destination(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise BundleError(f"output {out} already exists: pass --force to replace it, or choose another -o")
    if out.exists() and not out.is_dir():
        raise BundleError(f"output {out} exists and is not a folder: remove it or choose another -o")
    if out.parent.exists() and not out.parent.is_dir():
        raise BundleError(f"{out.parent} is not a folder: choose another -o")


@contextlib.contextmanager
def staging(out: Path, force: bool) -> Iterator[Path]:
    """Yield a temp folder; on success it replaces `out`, on any failure it is removed."""
    check_destination(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        yield tmp
        _make_readable(tmp)
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _make_readable(folder: Path) -> None:
    """mkdtemp/mkstemp create owner-only entries; a bundle gets the usual modes (umask applies)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)


def finish_manifest(folder: Path, manifest: dict) -> dict:
    """Record the sha256 of every file in the folder and write manifest.json."""
    manifest["files"] = {p.name: sha256_file(p) for p in sorted(folder.iterdir())
                         if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")}
    write_json(folder / MANIFEST, manifest)
    return manifest


def read_manifest(bundle: str | Path) -> dict:
    bundle = Path(bundle)
    path = bundle / MANIFEST
    if not bundle.is_dir():
        raise BundleError(f"bundle {bundle} not found: pass a folder written by `jetpipe convert`")
    if not path.is_file():
        raise BundleError(f"{bundle} has no {MANIFEST}: is it a bundle written by `jetpipe convert`?")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise BundleError(f"{path} is not valid JSON ({exc}); rebuild the bundle") from exc
    if manifest.get("format") != FORMAT_VERSION:
        raise BundleError(f"{bundle} has bundle format {manifest.get('format')!r}; this jetpipe "
                          f"reads format {FORMAT_VERSION}: rebuild it with `jetpipe convert`")
    return manifest


def verify(bundle: str | Path) -> list[str]:
    """Problems found comparing the files with the manifest's hashes (empty = intact)."""
    bundle = Path(bundle)
    manifest = read_manifest(bundle)
    problems = []
    for name, expected in manifest.get("files", {}).items():
        path = bundle / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif sha256_file(path) != expected:
            problems.append(f"{name}: sha256 differs from the manifest (modified or corrupted)")
    return problems
