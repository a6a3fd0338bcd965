"""A frame record's coordinates written by numpy: the same bytes json.dumps writes, for every array it takes and
every array it leaves to json.dumps."""

import json

import numpy as np
import pytest

from jetpipe.pipelines.core.record import BatchJson, FrameRecord
from jetpipe.tasks.detections import Detections, Ground
from jetpipe.tasks.json_numbers import rounded_json, rounded_json_many


def _dumps(values: np.ndarray) -> str:
    return json.dumps(values.tolist(), separators=(",", ":"))


@pytest.mark.parametrize("shape", [(1,), (5,), (1, 4), (60, 4), (60, 4, 2), (3, 17, 2), (2, 1, 3, 2)])
@pytest.mark.parametrize("scale", [0.9, 10, 2000, 999_999])
def test_tenths_are_written_as_json_writes_them(shape, scale):
    rng = np.random.default_rng(abs(hash((shape, scale))) % 2**32)
    values = np.round(rng.uniform(-scale / 4, scale, shape), 1)  # unclipped quadrilaterals lie past the edges
    flat = values.reshape(-1)
    flat[::7] = np.floor(flat[::7])          # whole numbers ("5.0", "-3.0")
    flat[1::11] = 0.0                        # zero ("0.0")
    flat[2::13] = -0.0                       # negative zero ("-0.0", as repr writes it)
    assert rounded_json(values, 1) == _dumps(values)


@pytest.mark.parametrize("edge", [-2000.0, -2000.1, 9999.9, 10000.0, 123456.7, -0.1])
def test_tenths_at_the_tables_edges_and_past_them(edge):
    values = np.array([[edge, 0.0, -0.0, 5.5]])
    assert rounded_json(values, 1) == _dumps(values)


def test_scores_are_written_as_json_writes_them():
    rng = np.random.default_rng(4)
    scores = np.round(rng.uniform(0, 1, 500), 4)
    scores[:6] = [0.0, 1.0, 0.5, 1e-4, 0.9999, -0.0]
    assert rounded_json(scores, 4) == _dumps(scores)
    for outside in ([1.5, 0.5], [-0.25, 0.5], [0.12345, 0.5]):  # past the table, or not rounded: json.dumps
        assert rounded_json(np.array(outside), 4) == _dumps(np.array(outside))


@pytest.mark.parametrize("values", [
    [[np.nan, 1.0]], [[np.inf, 2.0]], [[-np.inf, 2.0]], [[1.25, 1.0]], [[1e6, 1.0]], [[-1e6, 1.0]], [[1e300, 0.0]],
    [[1, 2]], np.zeros((0, 4)), np.float32([[1.5, 2.5]]), 3.5, np.full((2, 1, 1, 1, 2), 1.5),
], ids=["nan", "infinity", "minus infinity", "hundredths", "a million", "minus a million", "huge", "ints", "empty",
        "float32", "a scalar", "five dimensions"])
def test_what_the_fast_path_does_not_take_is_written_by_json(values):
    values = np.asarray(values)
    assert rounded_json(values, 1) == _dumps(values)


def test_a_busy_frame_records_json_is_the_same_bytes_as_before():
    rng = np.random.default_rng(7)
    n = 80
    corner = rng.uniform(0, 1800, (n, 2))
    boxes = np.hstack([corner, corner + rng.uniform(5, 300, (n, 2))]).astype(np.float32)
    quads = np.round(rng.uniform(-40, 1960, (n, 4, 2)), 1)  # unclipped: past the frame's edges
    det = Detections(boxes, rng.uniform(0.2, 1, n), rng.integers(0, 3, n), labels=("a", "b", "c"),
                     data={"quads": quads}, layout=("boxes", "scores", "classes", "labels", "quads"))
    det.tracker_id = np.where(rng.uniform(size=n) < 0.7, np.arange(n), -1)
    det.ground = Ground.at(n, np.arange(0, n, 2), rng.uniform(0, 50, (n // 2, 2)), rng.uniform(0, 90, n // 2),
                           rng.uniform(0, 360, n // 2))
    det.secondary["text"] = ["word"] * n
    record = FrameRecord(3, "rtsp://cam/3", 100, 3.3, 1e9, 1e9 + 0.02, {"queue": 1.2, "total": 9.0},
                         "text-detection", det)
    assert record.json() == json.dumps(record.as_dict(), separators=(",", ":"))
    # a results dict a task gave as lists is written as it came
    given = FrameRecord(1, "cam", 1, None, 1.0, 2.0, {}, "raw", {"boxes": [[0.25, 1, 2, 3]], "scores": [0.5],
                                                                  "anything": {"x": [1, 2]}})
    assert given.json() == json.dumps(given.as_dict(), separators=(",", ":"))
    empty = FrameRecord(1, "cam", 1, None, 1.0, 2.0, {}, "text-detection",
                        Detections(layout=("boxes", "scores", "quads"), data={"quads": np.zeros((0, 4, 2))}))
    assert empty.json() == json.dumps(empty.as_dict(), separators=(",", ":"))


def test_the_separator_tables_kept_stay_within_their_bound(monkeypatch):
    from jetpipe.tasks import json_numbers

    monkeypatch.setattr(json_numbers, "_separators", {})
    monkeypatch.setattr(json_numbers, "_cached_bytes", 0)
    monkeypatch.setattr(json_numbers, "MAX_CACHED_BYTES", 20_000)
    for n in range(1, 200):  # frames of every object count: a table a shape, until the bound
        values = np.round(np.random.default_rng(n).uniform(0, 1900, (n, 4, 2)), 1)
        assert rounded_json(values, 1) == _dumps(values)
    kept = json_numbers._separators.values()
    assert 0 < len(kept) < 199 and sum(s.texts.nbytes for s in kept) <= 20_000


@pytest.mark.parametrize("inner", [(), (4,), (4, 2), (1, 3, 2)])
def test_a_batchs_arrays_written_together_are_each_its_own_text(inner):
    """A batch's frames' boxes (or scores, quads) in one pass: each frame's text as alone, whatever its count (none,
    one, many), and beside arrays the pass cannot take (NaN, past the tables, float32, another shape)."""
    rng = np.random.default_rng(len(inner))
    arrays = [np.round(rng.uniform(-300, 2500, (n, *inner)), 1) for n in (60, 0, 1, 7, 60, 33)]
    arrays[3].reshape(-1)[::3] = -0.0
    assert rounded_json_many(arrays, 1) == [_dumps(a) for a in arrays]
    odd = [*arrays, arrays[0].astype(np.float32), np.round(rng.uniform(0, 9, (5, 3)), 1), np.array(2.5)]
    assert rounded_json_many(odd, 1) == [_dumps(np.asarray(a)) for a in odd]
    arrays[4].reshape(-1)[5] = np.nan  # one array the tables cannot write: each written alone, the same
    assert rounded_json_many(arrays, 1) == [_dumps(a) for a in arrays]
    scores = [np.round(rng.uniform(0, 1, (n, *inner)), 4) for n in (9, 1, 40)]
    assert rounded_json_many(scores, 4) == [_dumps(a) for a in scores]


def test_a_batchs_records_write_the_json_each_would_alone():
    """The daemon's batch of records: their results made together at the first json() (BatchJson), each record
    the same bytes as alone, and made once."""
    rng = np.random.default_rng(11)
    found = []
    for n in (50, 0, 3, 80):
        boxes = np.sort(rng.uniform(0, 1900, (n, 4)), axis=1).astype(np.float32)
        det = Detections(boxes, rng.uniform(0.2, 1, n), layout=("boxes", "scores", "quads"),
                         data={"quads": np.round(rng.uniform(-40, 1960, (n, 4, 2)), 1)})
        det.tracker_id = np.where(rng.uniform(size=n) < 0.7, np.arange(n), -1)
        found.append(det)
    found[0].xyxy[3, 1], found[2].xyxy[0, 2] = np.nan, 1e7  # written alone (json.dumps), the others together
    found.append(Detections.from_results({"boxes": [[0.25, 1, 2, 3]], "scores": [0.5], "anything": [1]}))
    batch = BatchJson(found)
    records = []
    for k, det in enumerate(found):
        records.append(FrameRecord(k, f"cam{k}", 7, 0.2, 1e9, 1e9 + 0.01, {"total": 3.0}, "text-detection", det))
        records[-1].batch_json = (batch, k)
    alone = [json.dumps(r.as_dict(), separators=(",", ":")) for r in records]
    assert records[2].json() == alone[2] and batch.found is None  # all made at the first, the arrays let go
    assert [r.json() for r in records] == alone
