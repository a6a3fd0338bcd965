"""JSON text of a results' number arrays, made from tables of text: the same bytes json.dumps writes for their
lists.

A busy frame's boxes, quadrilaterals and scores are hundreds of numbers; json.dumps of their nested lists costs
~0.4 us a number (a list object a box or corner, a repr a number). Coordinates are float64 rounded to a tenth of a
pixel, scores to four places: the double nearest k / 10**places, which repr writes as the shortest text of that
fraction ("0.0", "-5.0", "1234.5", "0.8731"), never more than 7 characters in the tables' ranges. The text of
every such number in a range is made once, padded with spaces to 8 bytes: one uint64 a number. An array's text is
a matrix of uint64, a row per innermost list: its numbers' texts gathered from the table (all but the last with a
comma in their eighth byte, always a space), then what follows the list (`],[`, `]],[[`, ..., or the closing
brackets: a table made once per shape and kept); its bytes, the spaces deleted (bytes.translate), are the text.
No Python object a number: a table of str objects gathered and joined (the way before) cost twice as much, most
of it reading each string's memory. Any other array (NaN, values out of the tables' ranges, other types, more
than 4 dimensions) is written by json.dumps.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

import numpy as np

COMPACT = (",", ":")
# the texts made once: tenths from -2,000.0 to 9,999.9 (pixels of pictures up to 8K, quadrilaterals unclipped past
# their edges; ~2 MB), and four places from 0 to 1 (scores)
RANGES = {1: (-20_000, 100_000), 4: (0, 10_001)}
SLOT = 8  # bytes a text: the longest number ("-2000.0") or separator of 4 dimensions ("]]],[[["), and a byte more
MAX_DEPTH = 4
WORD = np.dtype("<u8")  # a slot, little-endian on any machine: a text's first character its low byte
COMMA = np.uint64(ord(" ") ^ ord(",")) << np.uint64(8 * (SLOT - 1))  # a slot's last byte, a space, made a comma
MAX_CACHED_BYTES = 16 << 20  # separator tables kept, one per shape (the boxes' (N, 4), the quads' (N, 4, 2) for
#                              each N seen: 8 bytes an innermost list), up to this much; beyond it, made at each use


@dataclass(frozen=True)
class _Texts:
    """The text of k / 10**places for every k of [low, high], as uint64 slots, at 2 * (k - low) + the number's
    sign bit (repr writes negative zero "-0.0")."""
    low: float
    high: float
    scale: float
    slots: np.ndarray  # WORD


@dataclass(frozen=True)
class _Separators:
    """What follows each innermost list of an array of one shape (`],[` inside the next list, `]],[[` at its end,
    ..., all the closing brackets after the last) as uint64 slots, and the brackets before the first."""
    opening: str
    texts: np.ndarray  # WORD, one an innermost list


_tables: dict[int, _Texts] = {}
_tables_made = threading.Lock()  # the sinks' threads may write their first records at once
_separators: dict[tuple, _Separators] = {}
_cached_bytes = 0


def rounded_json(values: np.ndarray, places: int) -> str:
    """The compact JSON text json.dumps gives values.tolist(), from the tables where the values are float64
    rounded to `places` (1: tenths, 4: from 0 to 1) within the table's range."""
    if values.dtype == np.float64 and values.size and 0 < values.ndim <= MAX_DEPTH:
        table = _texts(places)
        index = _indices(values.ravel(), table)
        if index is not None:
            return _text(index.reshape(-1, values.shape[-1]), table, _separators_of(values.shape))
    return json.dumps(values.tolist(), separators=COMPACT)


def rounded_json_many(arrays: list[np.ndarray], places: int, round_first: bool = False) -> list[str]:
    """[rounded_json(a, places) for a in arrays], the arrays of one shape but their first axis (a batch's frames'
    boxes, say) written in one pass: a frame's ~60 boxes cost about as much in calls as in numbers, so a batch's
    frames together take less than half the time. An array the pass cannot take (empty, another shape or type,
    a value outside the tables) is written alone, as rounded_json writes it. round_first: each array written as
    np.round(a.astype(np.float64), places) is (the floats rounded together, not each apart)."""
    texts: list = [None] * len(arrays)
    floats = ("f",) if round_first else ()
    together = [k for k, a in enumerate(arrays)
                if (a.dtype == np.float64 or a.dtype.kind in floats) and a.size and 0 < a.ndim <= MAX_DEPTH]
    inner = arrays[together[0]].shape[1:] if together else ()
    together = [k for k in together if arrays[k].shape[1:] == inner]
    if len(together) > 1:
        table = _texts(places)
        flat = np.concatenate([arrays[k].ravel() for k in together])
        if round_first:
            flat = np.round(flat.astype(np.float64, copy=False), places)
        index = _indices(flat, table)
        if index is not None:
            write = _texts_nd if inner else _texts_1d  # 1-D: lists of their own lengths
            write(index, table, [arrays[k] for k in together], together, texts)
    return [text if text is not None else
            rounded_json(np.round(array.astype(np.float64), places) if round_first else array, places)
            for text, array in zip(texts, arrays)]


def _indices(flat: np.ndarray, table: _Texts) -> np.ndarray | None:
    """Each value's text in the table (None where any is not k / 10**places within its range)."""
    k = np.rint(flat * table.scale)
    np.minimum(k, table.high, out=k)  # out of range: k / scale no longer equals the value
    np.maximum(k, table.low, out=k)
    if not (k / table.scale == flat).all():  # np.round's arithmetic; NaN and infinities fail it
        return None
    index = (k - table.low).astype(np.intp)
    index *= 2
    index += np.signbit(flat)
    return index


def _texts_1d(index, table: _Texts, arrays: list, into: list, texts: list) -> None:
    """1-D arrays (texts[into[i]]: arrays[i]'s): their numbers' slots in a row, a comma after all but each array's
    last; the bytes cut at the arrays' ends."""
    slots = table.slots[index]
    ends = np.cumsum([len(a) for a in arrays])
    comma = np.ones(len(slots), bool)
    comma[ends - 1] = False
    slots[comma] ^= COMMA
    raw = slots.tobytes()
    for start, end, k in zip([0, *ends[:-1].tolist()], ends.tolist(), into):
        texts[k] = "[" + raw[SLOT * start:SLOT * end].translate(None, b" ").decode("ascii") + "]"


def _texts_nd(index, table: _Texts, arrays: list, into: list, texts: list) -> None:
    """Arrays of one shape but their first axis (texts[into[i]]: arrays[i]'s): one matrix of slots, a row an
    innermost list, each array's separators after its rows; its bytes cut at the arrays' rows."""
    width = arrays[0].shape[-1]
    separators = [_separators_of(a.shape) for a in arrays]
    rows = np.cumsum([0] + [len(found.texts) for found in separators]).tolist()
    raw = _text(index.reshape(-1, width), table, _Separators("", np.concatenate([f.texts for f in separators])),
                decode=False)
    row = SLOT * (width + 1)
    for at, k in enumerate(into):
        texts[k] = separators[at].opening + raw[rows[at] * row:rows[at + 1] * row].translate(None, b" ").decode(
            "ascii")


def _text(index: np.ndarray, table: _Texts, separators: _Separators, decode: bool = True):
    """index: (innermost lists, their length) into the table."""
    width = index.shape[1]
    slots = np.empty((len(index), width + 1), WORD)
    slots[:, :width] = table.slots[index]
    slots[:, :width - 1] ^= COMMA
    slots[:, width] = separators.texts
    if not decode:  # the slots' bytes as they are (rounded_json_many cuts them into its arrays' texts)
        return slots.tobytes()
    return separators.opening + slots.tobytes().translate(None, b" ").decode("ascii")


def make_tables() -> None:
    """The numbers' tables made now (a serve's start-up, where a sink writes the frames' records): made at the
    first record instead, they held that sink's thread for ~75 ms of Python (2 MB of text, 240,000 reprs) while
    the first frames came in."""
    for places in RANGES:
        _texts(places)


def _slots(texts: list[str]) -> np.ndarray:
    """The texts padded with spaces to SLOT bytes (at least one: a number's last byte takes its comma)."""
    assert max(map(len, texts)) < SLOT
    return np.frombuffer("".join(text.ljust(SLOT) for text in texts).encode("ascii"), WORD)


def _texts(places: int) -> _Texts:
    table = _tables.get(places)
    if table is None:
        with _tables_made:
            table = _tables.get(places)
            if table is None:
                table = _tables[places] = _make_texts(places)
    return table


def _make_texts(places: int) -> _Texts:
    low, high = RANGES[places]
    scale = 10.0 ** places
    texts = []
    for k in range(low, high):
        text = repr(k / scale)
        texts += [text, "-" + text if k == 0 else text]  # the sign bit set: only zero's text changes
    return _Texts(float(low), float(high - 1), scale, _slots(texts))


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
    """Each innermost list's count of the lists it ends (itself, then the outer axes at their last index, counted
    outwards), then the text that count calls for: "],[" inside the next list out, "]],[[" at its end, ..., all the
    brackets at the last."""
    depth, lists = len(shape), int(np.prod(shape[:-1]))
    flat, stride = np.arange(lists), 1
    closed, still = np.ones(lists, np.intp), np.ones(lists, bool)
    for axis in range(depth - 2, -1, -1):
        still &= flat // stride % shape[axis] == shape[axis] - 1
        closed += still
        stride *= shape[axis]
    texts = ["]" * k + "," + "[" * k for k in range(depth)] + ["]" * depth]
    return _Separators("[" * depth, _slots(texts)[closed])
