"""JSON text of a results' coordinate arrays, made by numpy: the same bytes json.dumps writes for their lists.

A busy frame's boxes and quadrilaterals are hundreds of numbers; json.dumps of their nested lists costs
~0.4 us a number (a list object a box or corner, a repr a number) and was most of a frame record's JSON.
Coordinates are float64 rounded to a tenth of a pixel, which repr writes as digits, a point and one digit
("0.0", "-5.0", "1234.5": the double nearest k/10 prints as k/10). For such an array the text is built here
as characters: each number's sign and digits in a row of a character table (leading zeros masked out),
then the separators its place in the array calls for (`,`, `],[`, ...: a table made once per shape and kept),
the whole table read out through its mask at once. Any other array (NaN, other values or types) is written by
json.dumps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

COMPACT = (",", ":")
WHOLE_DIGITS = 6        # the fast path's numbers are below a million (pixels of any picture)
POWERS = 10 ** np.arange(WHOLE_DIGITS - 1, -1, -1, dtype=np.uint32)  # the digits' places, highest first
MAX_CACHED_BYTES = 16 << 20  # separator tables kept, one per shape (the boxes' (N, 4), the quads' (N, 4, 2) for
#                              each N seen: ~24 kB each at N = 300), up to this much; beyond it, made at each use
ZERO, POINT, MINUS = ord("0"), ord("."), ord("-")


@dataclass(frozen=True)
class _Separators:
    """What follows each number of an array of one shape (`,` inside the innermost list, `],[` at its end, ...,
    and all the closing brackets after the last), as a padded character table and its mask."""
    opening: str
    chars: np.ndarray   # (size, width) uint8
    shown: np.ndarray   # (size, width) bool


_separators: dict[tuple, _Separators] = {}
_cached_bytes = 0


def tenths_json(values: np.ndarray) -> str:
    """The compact JSON text json.dumps gives values.tolist(), made by numpy where the values are float64
    tenths below a million either side of 0 (boxes, quadrilaterals)."""
    if values.dtype == np.float64 and values.size and values.ndim:
        largest = np.abs(values).max()  # (NaN fails the comparison)
        if largest < 10 ** WHOLE_DIGITS and np.array_equal(np.round(values, 1), values):
            return _tenths_text(values, len(str(int(largest))))
    return json.dumps(values.tolist(), separators=COMPACT)


def _tenths_text(values: np.ndarray, digits: int) -> str:
    """values' text, their whole parts at most `digits` long: a sign where the sign bit is set (repr's "-0.0"
    too), the whole part's digits without leading zeros, the point, the tenth, then the separators."""
    flat = values.ravel()
    whole, tenth = np.divmod(np.rint(np.abs(flat) * 10).astype(np.uint32), 10)
    powers = POWERS[-digits:]
    separators = _separators_of(values.shape)
    table = np.empty((len(flat), 1 + digits + 2 + separators.chars.shape[1]), np.uint8)
    shown = np.empty(table.shape, bool)
    table[:, 0], shown[:, 0] = MINUS, np.signbit(flat)
    table[:, 1:digits + 1] = whole[:, None] // powers % 10 + ZERO
    shown[:, 1:digits + 1] = whole[:, None] >= powers
    shown[:, digits] = True  # the units' digit, even 0
    table[:, digits + 1], table[:, digits + 2] = POINT, tenth + ZERO
    shown[:, digits + 1:digits + 3] = True
    table[:, digits + 3:], shown[:, digits + 3:] = separators.chars, separators.shown
    return separators.opening + table[shown].tobytes().decode("ascii")


def _separators_of(shape: tuple) -> _Separators:
    global _cached_bytes
    found = _separators.get(shape)
    if found is None:
        found = _make_separators(shape)
        if _cached_bytes + 2 * found.chars.size <= MAX_CACHED_BYTES:
            _separators[shape] = found
            _cached_bytes += 2 * found.chars.size
    return found


def _make_separators(shape: tuple) -> _Separators:
    """Each number's count of the lists it ends (the innermost axes at their last index, counted outwards),
    then the text that count calls for: "," inside a list, "],[" at its end, ..., all the brackets at the last."""
    depth, size = len(shape), int(np.prod(shape))
    flat, stride = np.arange(size), 1
    closed, still = np.zeros(size, np.intp), np.ones(size, bool)
    for axis in range(depth - 1, -1, -1):
        still &= flat // stride % shape[axis] == shape[axis] - 1
        closed += still
        stride *= shape[axis]
    texts = ["]" * k + "," + "[" * k for k in range(depth)] + ["]" * depth]
    width = max(len(t) for t in texts)
    chars, shown = np.zeros((depth + 1, width), np.uint8), np.zeros((depth + 1, width), bool)
    for k, text in enumerate(texts):
        chars[k, :len(text)] = np.frombuffer(text.encode(), np.uint8)
        shown[k, :len(text)] = True
    return _Separators("[" * depth, chars[closed], shown[closed])
