"""Command-line values -> Python values, with errors that name the flag (the library takes parsed values)."""

from __future__ import annotations

import argparse
from pathlib import Path

from jetpipe.errors import JetpipeError


def parse_channel_values(text: str, what: str) -> tuple[float, ...]:
    """'0.485,0.456,0.406' -> (0.485, 0.456, 0.406), or one value for a gray network ('0.5' -> (0.5,)),
    with an error naming the flag."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) not in (1, 3):
        raise JetpipeError(f"--{what} {text!r} must be three comma-separated numbers, e.g. 0.5,0.5,0.5 "
                           "(or one, for a gray network)")
    return values


def parse_size(text: str, flag: str = "--input-size") -> tuple[int, int]:
    """'640x480' -> (640, 480) as (height, width)."""
    parts = text.lower().split("x")
    try:
        h, w = (int(p) for p in parts)
    except ValueError:
        raise JetpipeError(f"{flag} {text!r} must look like HxW, e.g. 640x640") from None
    if h <= 0 or w <= 0:
        raise JetpipeError(f"{flag} {text!r}: height and width must be positive")
    return h, w


def parse_input_size(text: str) -> tuple[tuple[int, int], tuple[int, int] | None]:
    """'48x320' -> ((48, 320), None); '48x80:320:960' (width min:opt:max, TensorRT's profile, for text
    recognizers that take any width) -> ((48, 320), (80, 960))."""
    height, _, width = text.lower().partition("x")
    widths = width.split(":")
    if len(widths) == 1:
        return parse_size(text), None
    try:
        low, opt, high = (int(w) for w in widths)
        h = int(height)
    except ValueError:
        raise JetpipeError(f"--input-size {text!r} must look like HxW or HxMIN:OPT:MAX (a width range), "
                           "e.g. 48x320 or 48x80:320:960") from None
    if h <= 0 or not 0 < low <= opt <= high:
        raise JetpipeError(f"--input-size {text!r}: the height and widths must be positive, with "
                           "MIN <= OPT <= MAX")
    return (h, opt), (low, high)


def parse_batches(text: str) -> tuple[int, ...]:
    """'1,2,4,8' -> (1, 2, 4, 8)."""
    try:
        return tuple(int(b) for b in text.split(","))
    except ValueError:
        raise JetpipeError(f"--batch {text!r}: comma-separated integers, e.g. 1,2,4,8") from None


def parse_targets(text: str) -> tuple[str, ...]:
    """'sm86,SM89' -> ('sm86', 'sm89'); the convert step names what is not a target."""
    return tuple(part.strip().lower() for part in text.split(",") if part.strip())


def positive_seconds(text: str) -> float:
    """argparse type for durations: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0")
    return value


MAX_LABELS = 100_000  # class names or alphabet entries (PP-OCR's Chinese alphabet: 6623)


def read_labels(path: Path) -> tuple[str, ...]:
    """--labels FILE: one class name (or recognizer character) a line, UTF-8; a line of one space is a space."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JetpipeError(f"--labels {path}: no such file: pass a text file with one label a line") from None
    except (UnicodeDecodeError, IsADirectoryError, PermissionError) as exc:
        raise JetpipeError(f"--labels {path}: cannot read it as UTF-8 text ({exc.__class__.__name__}): pass a text "
                           "file with one label a line") from None
    labels = tuple(line.rstrip("\r") for line in text.split("\n"))
    labels = labels[:-1] if labels and labels[-1] == "" else labels
    if not labels:
        raise JetpipeError(f"--labels {path} is empty: one label a line")
    if len(labels) > MAX_LABELS:
        raise JetpipeError(f"--labels {path} has {len(labels)} lines; at most {MAX_LABELS}")
    return labels
