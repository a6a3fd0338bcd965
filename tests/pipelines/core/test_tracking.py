"""Object tracking: each word of the synthetic camera keeps one ID while it is visible; IDs are not reused."""

import json

import numpy as np
import pytest

from jetpipe.pipelines.core.tracking import Tracker
from jetpipe.pipelines.ingest.sources import SyntheticCamera
from jetpipe.tasks.agreement_metrics import greedy_match, iou_matrix


def _words(camera: SyntheticCamera, index: int):
    """(word index, box) of every word fully inside frame `index`: the ground truth."""
    shifted = camera.boxes - [camera.offset(index), 0, camera.offset(index), 0]
    inside = np.flatnonzero((shifted[:, 0] >= 0) & (shifted[:, 2] <= camera.info.width))
    return inside, shifted[inside]


def _track(tracker, frames, rng, drop=0.1, weak=0.1, jitter=1.0):
    """Feed noisy detections of the ground truth; returns {word: set of IDs given to it}."""
    ids_of = {}
    for words, boxes in frames:
        keep = rng.random(len(words)) >= drop  # missed detections
        words, boxes = words[keep], boxes[keep] + rng.normal(0, jitter, (keep.sum(), 4))
        scores = np.where(rng.random(len(words)) < weak, 0.3, 0.85)  # some blurred, weak ones
        for word, track_id in zip(words, tracker.update(boxes, scores)):
            if track_id is not None:
                ids_of.setdefault(int(word), set()).add(track_id)
    return ids_of


@pytest.mark.parametrize("kind", ["bytetrack", "iou"])
def test_every_word_keeps_one_id_over_300_frames(kind):
    camera = SyntheticCamera(640, 480, 0, "nv12", seed=3, step=1)  # 1 px per frame, no wrap in 300 frames
    frames = [_words(camera, i) for i in range(300)]
    ids_of = _track(Tracker(kind), frames, np.random.default_rng(0), weak=0.1 if kind == "bytetrack" else 0)
    assert len(ids_of) >= 4  # the words that stay in view were tracked
    switches = {word: ids for word, ids in ids_of.items() if len(ids) != 1}
    assert switches == {}, switches  # no ID switch
    all_ids = [i for ids in ids_of.values() for i in ids]
    assert len(all_ids) == len(set(all_ids))  # no ID given to two words


def test_ids_are_never_reused_after_tracks_end():
    tracker, seen = Tracker("bytetrack", max_lost=2), []
    for _ in range(6):  # a box appears for 6 frames, then nothing for 4
        for frame in range(10):
            boxes = [[100, 100, 160, 130]] if frame < 6 else []
            ids = tracker.update(boxes, [0.9] * len(boxes))
            seen += [i for i in ids if i is not None]
    assert sorted(set(seen)) == list(range(1, 7))  # six objects, six IDs, counting up


def test_bytetrack_follows_fast_motion_that_plain_iou_loses():
    """A word speeding up to 45 px per frame soon overlaps its last box too little for IoU matching; the
    Kalman prediction, which has learnt its velocity, still lands on it."""
    xs = np.cumsum([20] + [min(10 + 4 * i, 45) for i in range(20)])
    ids = {}
    for kind in ("bytetrack", "iou"):
        tracker = Tracker(kind)
        ids[kind] = [tracker.update([[x, 200, x + 50, 220]], [0.9])[0] for x in xs]
    assert set(ids["bytetrack"]) == {1}
    assert ids["iou"][:3] == [1, 1, 1] and None in ids["iou"]


def test_weak_detections_keep_a_track_alive_only_in_bytetrack():
    frames = [np.array([[10.0 + 2 * i, 10, 60.0 + 2 * i, 40]]) for i in range(12)]
    scores = [0.9] * 4 + [0.3] * 4 + [0.9] * 4  # four blurred frames in the middle
    results = {}
    for kind in ("bytetrack", "iou"):
        tracker = Tracker(kind, max_lost=1)
        results[kind] = [tracker.update(b, [s])[0] for b, s in zip(frames, scores)]
    assert set(results["bytetrack"]) == {1}  # one ID, the weak frames included
    assert results["iou"][4:8] == [None] * 4 and results["iou"][-1] not in (None, results["iou"][1])


def test_greedy_matching_takes_the_best_pairs_first():
    a = np.array([[0, 0, 10, 10], [20, 0, 30, 10]], float)
    b = np.array([[21, 0, 31, 10], [1, 0, 11, 10], [100, 100, 110, 110]], float)
    assert sorted(greedy_match(iou_matrix(a, b), 0.3)) == [(0, 1), (1, 0)]


def test_the_daemon_gives_each_detected_word_one_track_id(det_bundle, tmp_path):
    """PP-OCRv4 det on the synthetic camera through `serve`'s pipeline, every frame processed: the JSONL
    records' track_ids follow the camera's words (ground truth) without a switch."""
    from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
    from jetpipe.pipelines.service.daemon import Pipeline

    out = tmp_path / "results.jsonl"
    config = validate(PipelineConfig(bundle=det_bundle, sources=[SourceConfig("synthetic://640x480@0/nv12")],
                                     sinks=[f"jsonl:{out}"], frames=48, tracker="bytetrack", metrics_listen="",
                                     backend="onnxruntime-cpu"))
    pipeline = Pipeline(config)
    camera = SyntheticCamera(640, 480, 0, "nv12", seed=0, step=4)
    camera.live = False  # a file's backpressure: every frame is processed, in order
    pipeline.streams.slots[0].source = camera
    pipeline.run()
    ids_of, records = {}, [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["frame"] for r in records] == list(range(48))
    for record in records:
        words, truth = _words(camera, record["frame"])
        found = np.array(record["results"]["boxes"]).reshape(-1, 4)
        for row, col in greedy_match(iou_matrix(truth, found), 0.5):
            track_id = record["results"]["track_ids"][col]
            if track_id is not None:
                ids_of.setdefault(int(words[row]), set()).add(track_id)
    assert len(ids_of) >= 3 and all(len(ids) == 1 for ids in ids_of.values()), ids_of


def _textured(height: int, width: int, seed: int) -> np.ndarray:
    import cv2

    noise = np.random.default_rng(seed).integers(0, 256, (height, width), dtype=np.uint8)
    return cv2.GaussianBlur(noise, (0, 0), 2.0)


def _panned(ground: np.ndarray, people: np.ndarray, x: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A 1280 x 720 NV12 frame of `ground` seen from x pixels along, and the boxes (40 x 120, bottom-centre at
    each point) of the people standing on it who are in view, with their mask over `people`."""
    import cv2

    picture = cv2.warpAffine(ground, np.array([[1.0, 0, -x], [0, 1.0, 0]]), (1280, 720))
    nv12 = np.concatenate([picture, np.full((360, 1280), 128, np.uint8)])
    seen = people - [x, 0]
    shown = (seen[:, 0] > 30) & (seen[:, 0] < 1250)
    seen = seen[shown]
    return nv12, np.column_stack([seen[:, 0] - 20, seen[:, 1] - 120, seen[:, 0] + 20, seen[:, 1]]), shown


def test_the_cameras_motion_is_measured_from_the_background_and_not_the_objects():
    """A textured background seen through a camera panning, then zooming and turning, with 30 objects of their
    own texture moving together against it (a crowd walking one way; their boxes left out, as the tracker's
    detections are): the measured motion maps every corner of the 1080p frame within a pixel of the true
    one."""
    import cv2

    from jetpipe.pipelines.core.tracking.camera import CameraMotion

    ground = _textured(1400, 2400, 0)
    card = _textured(120, 80, 1)
    camera = CameraMotion()
    corners = np.array([[0, 0, 1], [1920, 0, 1], [1920, 1080, 1], [0, 1080, 1]], np.float64)
    view = np.array([[1.0, 0.0, -200.0], [0.0, 1.0, -150.0]])  # ground -> frame
    steps = [np.array([[1.0, 0.0, dx], [0.0, 1.0, dy]]) for dx, dy in ((-12, 3), (-9, -4), (7, 2), (15, 5))]
    angle, zoom = np.radians(0.8), 1.01
    steps.append(np.array([[zoom * np.cos(angle), -zoom * np.sin(angle), 4.0],
                           [zoom * np.sin(angle), zoom * np.cos(angle), -6.0]]))
    rng = np.random.default_rng(2)
    starts = rng.uniform([100, 100], [1700, 850], (30, 2))
    for k, step in enumerate([None, *steps]):
        if step is not None:
            view = np.vstack([step, [0, 0, 1]]) @ np.vstack([view, [0, 0, 1]])
            view = view[:2]
        frame = cv2.warpAffine(ground, view, (1920, 1080))
        boxes = []
        for x, y in starts + k * np.array([25.0, -10.0]):  # the objects move on their own, not with the ground
            frame[int(y):int(y) + 120, int(x):int(x) + 80] = card
            boxes.append([x, y, x + 80, y + 120])
        motion = camera.estimate(frame, np.array(boxes))
        if step is None:
            assert motion is None  # the first frame: nothing to compare with
            continue
        assert motion is not None
        error = np.abs(corners @ motion.T - corners @ step.T).max()
        assert error < 1.0, (k, error, motion.round(3).tolist())


def test_a_moving_cameras_tracks_follow_its_frames():
    """The tracker step with a stream marked moving_camera: host NV12 frames of a textured scene panning 45
    pixels a frame at 10 fps, six people standing in it (their boxes move with the picture, 40 pixels wide):
    each keeps one ID of their own over 20 frames, measured from the frames; the same stream not marked mixes
    them up. Frames in GPU memory: their luma copied out by the runtime (frame_to_host), measured alike."""
    from types import SimpleNamespace

    from jetpipe.pipelines.core.steps import TrackStep
    from jetpipe.runtime.api import Frame
    from jetpipe.tasks.detections import Detections

    ground = _textured(1000, 3200, 3)
    people = np.array([[300, 500], [700, 420], [1100, 600], [1500, 380], [1900, 640], [2000, 500]], np.float64)

    def frames(k: int):
        nv12, boxes, shown = _panned(ground, people, 45.0 * k)
        return nv12, boxes, np.flatnonzero(shown)

    held = {}

    def copy_out(frame, out):  # stands in for the GPU runtime's frame_to_host: its first out.nbytes
        out[...] = held[frame.address].reshape(-1)[:out.size].reshape(out.shape)

    def ids(moving: bool, device: bool = False, to_host=None) -> dict[int, set]:
        step = TrackStep("botsort", 1, moving=lambda slot: moving, to_host=to_host)
        kept: dict[int, set] = {}
        for k in range(20):
            nv12, boxes, person = frames(k)
            held[k + 1] = nv12
            frame = Frame(None, "nv12", device=True, address=k + 1, hw=(720, 1280)) if device else Frame(nv12, "nv12")
            found = Detections(boxes, np.full(len(boxes), 0.9), np.zeros(len(boxes)))
            step.run([SimpleNamespace(stream=0, pts=k / 10, t_capture=0.0, frame=frame)], [found])
            for who, track in zip(person.tolist(), found.tracker_id.tolist()):
                if track != -1:  # a person coming into view is confirmed by its second frame
                    kept.setdefault(who, set()).add(track)
        return kept, step.camera_counts

    following, counts = ids(True)
    def one_each(kept: dict) -> bool:  # every person one ID of their own
        return all(len(tracks) == 1 for tracks in kept.values()) and len(set().union(*kept.values())) == len(kept)

    assert len(following) == 6 and one_each(following), following
    assert counts["measured"] == 19  # every frame but the first
    fixed, _ = ids(False)
    assert not one_each(fixed), fixed
    on_the_gpu, counts = ids(True, device=True, to_host=copy_out)  # NVDEC's frames: their luma copied out
    assert one_each(on_the_gpu) and counts["measured"] == 19, on_the_gpu
    _, counts = ids(True, device=True)  # a runtime that cannot copy frames out
    assert counts["on_the_gpu"] == 20 and counts["measured"] == 0


def test_a_moving_camera_in_the_config_is_measured_while_serving(det_bundle, tmp_path):
    """moving_camera = true in a [[source]] table reaches the tracker: each frame after the first is measured
    (or counted as not measurable), in the run's summary."""
    import json

    from jetpipe.cli import main
    from tests.pipelines.conftest import write_panning_video

    video = write_panning_video(tmp_path / "panning.avi", 5)
    config = tmp_path / "moving.toml"
    config.write_text(f'[pipeline]\nbundle = "{det_bundle}"\ntracker = "botsort"\n'
                      f'[[source]]\nuri = "{video.path}"\nmoving_camera = true\n')
    summary = tmp_path / "summary.json"
    assert main(["serve", str(config), "--metrics", "", "--summary", str(summary)]) == 0
    counts = json.loads(summary.read_text())["summary"]["moving_cameras"]
    assert counts["measured"] + counts["not_measured"] == video.frames and counts["on_the_gpu"] == 0, counts
    assert counts["measured"] >= video.frames // 2, counts


def test_a_standing_person_under_a_pan_crosses_no_line():
    """Issue 65's target: people standing still while a moving camera pans 12 pixels a frame sweep across a
    line drawn on the picture; with moving_camera the rules look at them in the first frame's view, where they
    stand still: no crossing. The same frames from a stream not marked count them all crossing."""
    from types import SimpleNamespace

    from jetpipe.pipelines.core.events.engine import Engine
    from jetpipe.pipelines.core.events.rules import Line
    from jetpipe.pipelines.core.steps import TrackStep
    from jetpipe.runtime.api import Frame
    from jetpipe.tasks.detections import Detections

    ground = _textured(1000, 3200, 4)
    people = np.array([[700, 500], [900, 420], [1100, 600], [1250, 380]], np.float64)  # right of the line

    def crossings(moving: bool) -> int:
        step = TrackStep("botsort", 1, moving=lambda slot: moving)
        engine = Engine()
        engine.rules = [engine.rule(Line("middle", [[0.5, 0.0], [0.5, 1.0]]), None)]
        counted = 0
        for k in range(64):
            nv12, boxes, _ = _panned(ground, people, 12.0 * k)
            found = Detections(boxes, np.full(len(boxes), 0.9), np.zeros(len(boxes)))
            step.run([SimpleNamespace(stream=0, pts=k / 10, t_capture=0.0, frame=Frame(nv12, "nv12"))], [found])
            counted += len(engine.decide([(0, k / 10, (720, 1280), found)]))
        return counted

    assert crossings(moving=True) == 0
    assert crossings(moving=False) == len(people)  # the picture moved past the line: each counted once


def test_a_moving_cameras_rules_are_drawn_where_its_first_view_is_now():
    """The rules of a moving camera lie in its first frame's view: the frames' sinks and the preview draw them
    where that view is in each frame (the camera panned 300 px right: the line drawn 300 px further left);
    a fixed camera's frame (no view) draws them where they were given."""
    from jetpipe.pipelines.core.events import EventStep
    from jetpipe.pipelines.core.events.rules import Line
    from jetpipe.pipelines.outputs.sinks.fanout import SinkFanout
    from jetpipe.runtime.api import Frame
    from jetpipe.tasks.detections import Detections

    step = EventStep([Line("middle", [[0.5, 0.0], [0.5, 1.0]])], None, lambda slot: slot, lambda *a: None)
    panned = np.array([[1.0, 0.0, 300.0], [0.0, 1.0, 0.0]])  # this frame's pixels -> the first frame's
    (_, moved, _), = step.scene(0, (720, 1280), panned)
    (_, fixed, _), = step.scene(0, (720, 1280))
    assert np.allclose(fixed, [(640, 0), (640, 720)]) and np.allclose(moved, [(340, 0), (340, 720)])

    drawn = []
    viewer = type("Viewer", (), {"offer": lambda self, stream, frame, record, to_host, wait: drawn.append(record)})
    fanout = SinkFanout([])
    fanout.add_viewer(viewer())
    fanout.show_scene(step.scene)
    found = Detections(np.zeros((0, 4)), np.zeros(0), np.zeros(0))
    found.view = panned
    record = type("Record", (), {"detections": found, "scene": None})()
    fanout.offer(0, Frame(np.zeros((720, 1280, 3), np.uint8), "bgr"), record, None, wait=False)
    assert np.allclose(drawn[0].scene[0][1], moved)


def test_the_filters_inverses_by_cofactors_are_lapacks():
    """The innovation covariances' inverses, a thousand at once (LAPACK pays a call a matrix): the same to
    rounding, for well-conditioned covariances and for general matrices; none for no tracks."""
    from jetpipe.pipelines.core.tracking.kalman import inverse4

    rng = np.random.default_rng(3)
    general = rng.normal(size=(1000, 4, 4))
    covariances = general @ general.transpose(0, 2, 1) + np.eye(4) * rng.uniform(1, 400, (1000, 1, 1))
    for matrices in (covariances, general):
        assert np.allclose(inverse4(matrices), np.linalg.inv(matrices), rtol=1e-8, atol=1e-10)
    assert inverse4(np.zeros((0, 4, 4))).shape == (0, 4, 4)


@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("shape", ["text lines", "people", "mixed"])
def test_the_candidate_pairs_are_every_same_frame_pair_that_overlaps(shape, axis):
    """pairs.Candidates' sweep (along x or y, whichever gives fewer, or the one botsort kept from an earlier
    pass) finds exactly the pairs a brute force finds: rows of wide, low boxes (a text line's reach covers half
    a frame's width), tall narrow ones, and both with a few huge boxes; negative coordinates (grown past the
    edges), frames without detections."""
    from jetpipe.pipelines.core.tracking.pairs import Candidates

    rng = np.random.default_rng({"text lines": 1, "people": 2, "mixed": 3}[shape])
    aspect = {"text lines": (4.0, 12.0), "people": (0.25, 0.6), "mixed": (0.2, 12.0)}[shape]

    def boxes(n):
        h = rng.uniform(10, 120, n)
        w = h * rng.uniform(*aspect, n)
        if shape == "mixed":
            w[::17], h[::17] = 1500.0, 900.0
        x, y = rng.uniform(-200, 1900, n), rng.uniform(-100, 1080, n)
        return np.stack([x, y, x + w, y + h], axis=1)

    for _ in range(40):
        frames = int(rng.integers(1, 9))
        tracks, dets = int(rng.integers(0, 300)), int(rng.integers(0, 300))
        track_box, det_box = boxes(tracks), boxes(dets)
        track_frame, det_frame = rng.integers(0, frames, tracks), rng.integers(0, max(1, frames - 1), dets)
        found = Candidates(track_box, track_frame, det_box, det_frame, axis)
        assert found.axis in ((0, 1) if axis is None else (axis,))
        a, b = track_box[:, None], det_box[None]
        overlap = (a[..., 0] <= b[..., 2]) & (b[..., 0] <= a[..., 2]) & (a[..., 1] <= b[..., 3]) & \
            (b[..., 1] <= a[..., 3]) & (track_frame[:, None] == det_frame[None])
        t, d = np.nonzero(overlap)  # track-major, detections in their order
        assert found.track.tolist() == t.tolist() and found.det.tolist() == d.tolist()


def test_the_kalman_filter_by_blocks_gives_the_same_numbers_as_by_matrices():
    """Tracks whose coordinates do not mix are filtered on their covariance's four 2 x 2 blocks (botsort's
    table): to the bit what the 8 x 8 filter gives, over many steps at mixed rates; a rotated camera's tracks
    (x and y mixed) go on as matrices."""
    from jetpipe.pipelines.core.tracking import kalman

    rng = np.random.default_rng(5)
    cells = (slice(None), kalman.BLOCK_ROWS, kalman.BLOCK_COLS)
    mean, cov = kalman.initiate(np.cumsum(rng.uniform(1, 80, (300, 4)), axis=1))
    others = np.ones((8, 8), bool)
    others[kalman.BLOCK_ROWS, kalman.BLOCK_COLS] = False
    for _ in range(40):
        dt = rng.choice([1 / 30, 1 / 10, 2 / 30, 0.5], len(mean))
        by_matrix = kalman.predict(mean, cov, dt)
        by_block = kalman.predict_blocks(mean, cov[cells], dt)
        assert np.array_equal(by_matrix[0], by_block[0]) and np.array_equal(by_matrix[1][cells], by_block[1])
        boxes = np.cumsum(rng.uniform(1, 80, (len(mean), 4)), axis=1)
        mean, cov = kalman.update(*by_matrix, boxes)
        block_mean, blocks = kalman.update_blocks(*by_block, boxes)
        assert np.array_equal(mean, block_mean) and np.array_equal(cov[cells], blocks)
        assert not cov[:, others].any()


def test_a_rotating_cameras_tracks_are_filtered_as_matrices():
    from jetpipe.pipelines.core.tracking import BotSortTable
    from jetpipe.pipelines.core.tracking.botsort import _move_tracks

    table = BotSortTable()
    box = np.array([[100.0, 100.0, 140.0, 200.0], [400.0, 100.0, 440.0, 200.0]])
    table.update([(0, box, np.array([0.9, 0.9]), 0.0)])
    turn, still = np.radians(2.0), np.array([[1.0, 0.0, 3.0], [0.0, 1.0, 0.0]])
    rotation = np.array([[np.cos(turn), -np.sin(turn), 0.0], [np.sin(turn), np.cos(turn), 0.0]])
    _move_tracks(table, np.array([0, 1]), np.stack([rotation, still]))
    assert table.mixed.tolist() == [True, False]
    assert table.cov[0, 0, 1] != 0 and table.cov[1, 0, 1] == 0  # x and y mixed by the rotation only
    ids = table.update([(0, box + 2.0, np.array([0.9, 0.9]), 1 / 30)])[0]
    assert ids.tolist() == [1, 2] and table.cov[0, 0, 1] != 0


def test_the_assignment_is_each_frames_optimum_of_its_allowed_pairs():
    """pairs.assign (every frame's contended pairs numbered at once, a solver call a frame) against each frame
    solved apart on its own matrix: the same matches, on frames with pairs alone, pairs in contention, and pairs
    not allowed."""
    from scipy.optimize import linear_sum_assignment

    from jetpipe.pipelines.core.tracking.pairs import INFEASIBLE, assign

    rng = np.random.default_rng(11)
    for _ in range(60):
        tracks, dets, frames = int(rng.integers(1, 80)), int(rng.integers(1, 80)), int(rng.integers(1, 6))
        track_frame = rng.integers(0, frames, tracks)
        det_frame = rng.integers(0, frames, dets)
        t, d = np.nonzero((track_frame[:, None] == det_frame[None]) & (rng.uniform(size=(tracks, dets)) < 0.15))
        similarity = rng.uniform(0, 1, len(t))
        allowed = rng.uniform(size=len(t)) < 0.85
        rows, cols = assign(t, d, similarity, allowed, track_frame)
        expected = []
        for frame in range(frames):
            at = allowed & (track_frame[t] == frame)
            if not at.any():
                continue
            t_ids, t_local = np.unique(t[at], return_inverse=True)
            d_ids, d_local = np.unique(d[at], return_inverse=True)
            cost = np.full((len(t_ids), len(d_ids)), INFEASIBLE)
            cost[t_local, d_local] = -similarity[at]
            r, c = linear_sum_assignment(cost)
            expected += [(int(t_ids[i]), int(d_ids[j])) for i, j in zip(r, c) if cost[i, j] < INFEASIBLE]
        assert sorted(zip(rows.tolist(), cols.tolist())) == sorted(expected)


@pytest.mark.parametrize("frames", [20, 40, 97])
def test_a_tracks_motion_and_direction_are_read_from_its_history_ring_after_it_wrapped(frames):
    """botsort keeps a track's last HISTORY (32) observations as a ring, the k-th in column k % 32, read by
    their times: its speed over motion_s (what a lost track goes on at) and its direction (OC-SORT's term) come
    out the same before the ring is full and after it wrapped once or more. The box walks at 60 px/s, then its
    last 0.7 s at 150: only the right observations give 150 over the last motion_s (0.5 s)."""
    from jetpipe.pipelines.core.tracking import BotSortTable
    from jetpipe.pipelines.core.tracking.botsort import _direction_agreement

    table, x = BotSortTable(), 100.0
    for k in range(frames):
        x += (5.0 if k > frames - 22 else 2.0) if k else 0.0  # px a frame at 30 fps
        table.update([(0, [[x, 300, x + 60, 450]], [0.9], k / 30)])
    velocity, _, sizes = table._known_motion(np.array([0]))
    assert velocity[0] == pytest.approx([150.0, 0.0]) and sizes[0] == pytest.approx([60.0, 150.0])
    ahead, behind = [x + 20, 300, x + 80, 450], [x - 20, 300, x + 40, 450]
    agreement = _direction_agreement(table, np.array([0, 0]), np.array([ahead, behind]), np.ones(2))
    assert agreement[0] == pytest.approx(0.1) and agreement[1] == pytest.approx(-0.1)  # inertia / 2 either way


def test_pairs_in_contention_share_a_track_or_a_detection_and_the_others_are_matched_whatever_their_similarity():
    """botsort weighs direction only for the pairs in contention: a pair alone is matched at any similarity."""
    from jetpipe.pipelines.core.tracking.pairs import assign, in_contention

    track, det = np.array([0, 1, 1, 2, 3]), np.array([0, 1, 2, 2, 3])
    assert in_contention(track, det).tolist() == [False, True, True, True, False]
    frames = np.zeros(4, np.int64)
    for similarity in (np.array([0.9, 0.5, 0.4, 0.6, 0.8]), np.array([-5.0, 0.5, 0.4, 0.6, -7.0])):
        rows, cols = assign(track, det, similarity, np.ones(5, bool), frames)
        assert list(zip(rows.tolist(), cols.tolist())) == [(0, 0), (1, 1), (2, 2), (3, 3)]
