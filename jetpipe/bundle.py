"""Bundles: a folder with the processed ONNX, the engine (where built) and a manifest.

Written into a temporary sibling folder and renamed into place (jetpipe.output_folders),
so an interrupted build never leaves a partial bundle, and `--force` never loses
the old bundle before the new one is complete. The manifest carries the sha256
of every file and a digest of itself; every command that loads a bundle checks
both (load()), so an edited manifest or a swapped file is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

from jetpipe import output_folders
from jetpipe.errors import BundleError

MANIFEST = "manifest.json"
MODEL_FILE = "model.onnx"
ENGINE_FILE = "model.engine"
CALIBRATION_FILE = "calibration.json"
FORMAT_VERSION = 2  # 2: manifest digest, every file required
DIGEST_KEY = "manifest_sha256"


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


def owned_files(folder: Path) -> set[str] | None:
    """What a bundle folder holds that convert wrote (None: not a bundle)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or "format" not in manifest or not isinstance(manifest.get("files"), dict):
        return None
    return {MANIFEST, *manifest["files"]}


def check_destination(out: Path, force: bool, flag: str = "-o") -> None:
    """flag: the option that named `out`, for the messages (`jetpipe demo`'s is --bundle-dir)."""
    output_folders.check_destination(out, force, flag, "bundle", owned_files)


def _digest(manifest: dict) -> str:
    """sha256 of the manifest's canonical JSON, without the digest itself."""
    body = {k: v for k, v in json.loads(json.dumps(manifest)).items() if k != DIGEST_KEY}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def finish_manifest(folder: Path, manifest: dict) -> dict:
    """Record the sha256 of every file in the folder and of the manifest itself; write manifest.json."""
    manifest["files"] = {p.name: sha256_file(p) for p in sorted(folder.iterdir())
                         if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")}
    manifest[DIGEST_KEY] = _digest(manifest)
    write_json(folder / MANIFEST, manifest)
    return manifest


def read_manifest(bundle: str | Path) -> dict:
    """The manifest, checked against its own digest (the files are checked by verify())."""
    bundle = Path(bundle)
    path = bundle / MANIFEST
    if not bundle.is_dir():
        raise BundleError(f"bundle {bundle} not found: pass a folder written by `jetpipe convert`")
    if not path.is_file():
        raise BundleError(f"{bundle} has no {MANIFEST}: is it a bundle written by `jetpipe convert`?")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path} is not valid JSON ({exc}); rebuild the bundle") from exc
    found = manifest.get("format") if isinstance(manifest, dict) else None
    if found != FORMAT_VERSION:
        raise BundleError(f"{bundle} has bundle format {found!r}; this jetpipe "
                          f"reads format {FORMAT_VERSION}: rebuild it with `jetpipe convert`")
    if manifest.get(DIGEST_KEY) != _digest(manifest):
        raise BundleError(f"{path} was changed after `jetpipe convert` wrote it (its digest does not match): "
                          "rebuild the bundle with `jetpipe convert`")
    return manifest


def required_files(manifest: dict) -> set[str]:
    """Files a bundle must list and hold: the model, and the engine / calibration where it has them."""
    required = {MODEL_FILE}
    engine = manifest.get("engine") or {}
    if engine.get("built"):
        required.add(engine.get("file") or ENGINE_FILE)
    if manifest.get("calibration"):
        required.add(CALIBRATION_FILE)
    return required


def verify(bundle: str | Path, manifest: dict | None = None) -> list[str]:
    """Problems found comparing the files with the manifest's hashes (empty = intact)."""
    bundle = Path(bundle)
    manifest = manifest or read_manifest(bundle)
    files = manifest.get("files") or {}
    problems = [f"{name}: not listed in the manifest" for name in sorted(required_files(manifest) - set(files))]
    for name, expected in files.items():
        path = bundle / name
        if Path(name).name != name or not path.is_file():
            problems.append(f"{name}: missing")
        elif sha256_file(path) != expected:
            problems.append(f"{name}: sha256 differs from the manifest (modified or corrupted)")
    return problems


def load(bundle: str | Path) -> dict:
    """The manifest of an intact bundle: its digest and every file's sha256 checked, else BundleError."""
    manifest = read_manifest(bundle)
    problems = verify(bundle, manifest)
    if problems:
        raise BundleError(f"bundle {bundle} fails verification ({problems[0]}): rebuild it with `jetpipe convert`")
    return manifest
