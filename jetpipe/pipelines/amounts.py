"""Sizes and durations as people write them in a config or on the command line: "200MB", "50GB", "7d", "12h".

Sizes are decimal (MB = 10^6 bytes, as disks are sold and `df -H` shows them); KiB/MiB/GiB/TiB are binary. A
bare number is bytes, or seconds. Each parser raises ValueError with the one line a user needs."""

from __future__ import annotations

import re

_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]i?b?|b)?\s*", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
               "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40,
               "tib": 2**40}
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|m|min|h|d|w)?\s*", re.IGNORECASE)
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_bytes(text: str | int | float) -> int:
    """'200MB' -> 200_000_000; '1.5GiB' -> 1_610_612_736; 4096 -> 4096."""
    return int(_amount(text, _SIZE, _SIZE_UNITS, "size", "bytes", "200MB, 50GB or 512MiB"))


def parse_seconds(text: str | int | float) -> float:
    """'7d' -> 604800.0; '90m' -> 5400.0; 30 -> 30.0 ('m' is minutes: months are not a fixed length)."""
    return float(_amount(text, _DURATION, _DURATION_UNITS, "duration", "seconds", "7d, 12h, 30m or 90s"))


def _amount(text, pattern: re.Pattern, units: dict, kind: str, unit: str, examples: str) -> int | float:
    """A number of `unit` from 0, or a number with one of `units`; ValueError naming the `kind` otherwise."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a {kind}: write e.g. {examples}")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"{text!r} is not a {kind}: give {unit} from 0, or e.g. {examples}")
        return text  # as given: a byte count stays exact
    found = pattern.fullmatch(str(text))
    if found is None:
        raise ValueError(f"{text!r} is not a {kind}: write e.g. {examples}")
    return float(found.group(1)) * units[(found.group(2) or "").lower()]


def say_bytes(count: float) -> str:
    """4.2e9 -> '4.2 GB' (decimal, as parse_bytes reads it back)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(count) >= size:
            return f"{count / size:.3g} {unit}"
    return f"{int(count)} B"
