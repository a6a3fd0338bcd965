"""JSON text of a results' number arrays, made from tables of text: the same bytes json.dumps writes for their
lists.

A busy frame's boxes, quadrilaterals and scores are hundreds of numbers; json.dumps of their nested lists costs
~0.4 us a number (a list object a box or corner, a repr a number), and building the characters with numpy
~0.2 us. Coordinates are float64 rounded to a tenth of a pixel, scores to four places: the double nearest
k / 10**places, which repr writes as the shortest text of that fraction ("0.0", "-5.0", "1234.5", "0.8731").
The text of every such number in a range is made once (a table of str objects, indexed by k); an array's text
is its numbers' texts taken from the table and interleaved with the separators its shape calls for (`,` inside
the innermost list, `],[` at its end, ...: a table made once per shape and kept), joined in one call: no
Python loop over the numbers. Any other array (NaN, values out of the tables' ranges, other types) is written
by json.dumps.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

import numpy as np

COMPACT = (",", ":")
# the texts made once: tenths from -2,000.0 to 9,999.9 (pixels of pictures up to 8K, quadrilaterals unclipped past
# their edges; ~8 MB), and four places from 0 to 1 (scores)
RANGES = {1: (-20_000, 100_000), 4: (0, 10_001)}
MAX_CACHED_BYTES = 16 << 20  # separator tables kept, one per shape (the boxes' (N, 4), the quads' (N, 4, 2) for
#                              each N seen: ~4 kB each at N = 60), up to this much; beyond it, made at each use


@dataclass(frozen=True)
class _Texts:
    """repr(k / 10**places) for every k of [low, high), and "-0.0" after them (repr's negative zero)."""
    low: int
    high: int
    scale: float
    texts: np.ndarray  # object: str


@dataclass(frozen=True)
class _Separators:
    """What follows each number of an array of one shape (`,` inside the innermost list, `],[` at its end, ...,
    and all the closing brackets after the last), and the brackets before the first."""
    opening: str
    texts: np.ndarray  # object: str, one a number


_tables: dict[int, _Texts] = {}
_tables_made = threading.Lock()  # the sinks' threads may write their first records at once
_separators: dict[tuple, _Separators] = {}
_cached_bytes = 0


def rounded_json(values: np.ndarray, places: int) -> str:
    """The compact JSON text json.dumps gives values.tolist(), from the tables where the values are float64
    rounded to `places` (1: tenths, 4: from 0 to 1) within the table's range."""
    if values.dtype == np.float64 and values.size and values.ndim:
        table = _texts(places)
        flat = values.ravel()
        scaled = flat * table.scale  # (NaN and infinities fail the comparisons)
        if scaled.min() >= table.low and scaled.max() < table.high - 0.5 and \
                np.array_equal(np.round(values, places), values):
            index = np.rint(scaled).astype(np.intp) - table.low
            index[np.signbit(flat) & (index == -table.low)] = len(table.texts) - 1  # -0.0
            separators = _separators_of(values.shape)
            words = np.empty(2 * len(flat), object)
            words[0::2], words[1::2] = table.texts[index], separators.texts
            return separators.opening + "".join(words.tolist())
    return json.dumps(values.tolist(), separators=COMPACT)


def _texts(places: int) -> _Texts:
    table = _tables.get(places)
    if table is None:
        with _tables_made:
            table = _tables.get(places)
            if table is None:
                low, high = RANGES[places]
                scale = 10.0 ** places
                texts = np.array([repr(k / scale) for k in range(low, high)] + ["-0.0"], object)
                table = _tables[places] = _Texts(low, high, scale, texts)
    return table


def _separators_of(shape: tuple) -> _Separators:
    global _cached_bytes
    found = _separators.get(shape)
    if found is None:
        found = _make_separators(shape)
        if _cached_bytes + found.texts.nbytes <= MAX_CACHED_BYTES:
            _separators[shape] = found
            _cached_bytes += found.texts.nbytes
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
    texts = np.array(["]" * k + "," + "[" * k for k in range(depth)] + ["]" * depth], object)
    return _Separators("[" * depth, texts[closed])
