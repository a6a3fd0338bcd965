"""The ground plane: calibrations refused where they cannot be right, positions through a known camera, speeds
against the truth (speed_scenes: a pinhole camera, 5-80 km/h, 2 % box jitter, 10 % of frames missed), speed
rules, and speeds in the records of a served video."""

import json
import math

import numpy as np
import pytest

from jetpipe.calibration import speed_scenes
from jetpipe.pipelines.core.events.engine import Engine
from jetpipe.pipelines.core.events.rules import Line, Zone
from jetpipe.pipelines.core.ground import Calibration, CalibrationError, check, from_table
from jetpipe.tasks.detections import Detections, Ground

SQUARE = [[100, 900], [900, 900], [700, 300], [300, 300]]
METRES = [[0, 0], [8, 0], [8, 30], [0, 30]]


@pytest.mark.parametrize("table, message", [
    ({"stream": 0, "image": SQUARE[:3], "world": METRES[:3]}, "3 points: a ground plane needs at least 4"),
    ({"stream": 0, "image": SQUARE, "world": METRES[:3]}, "4 image points and 3 world points"),
    ({"stream": 0, "image": [[0, 0], [100, 0], [200, 0], [50, 80]], "world": METRES},
     "image points 1, 2 and 3 lie on one line"),
    ({"stream": 0, "image": SQUARE, "world": [[0, 0], [8, 0], [8, 30], [0, 30.01]][:3] + [[16, 0]]},
     "world points 1, 2 and 4 lie on one line"),
    ({"stream": 0, "image": [*SQUARE, [500, 600]], "world": [*METRES, [4, 25]]}, "do not fit one ground plane"),
    ({"stream": 0, "image": [*SQUARE, [500, 900], [500, 600]], "world": [*METRES, [4, 0], [4, 25]]},
     "point 6 is the odd one out"),
    ({"stream": 0, "image": [[100, 900], [900, 900], [900, 100], [100, 100]],
      "world": [[0, 0], [8, 0], [0, 30], [8, 30]]}, "both sides of the horizon"),
    ({"stream": 0, "image": SQUARE, "world": METRES, "units": "normalized"}, "from 0 to 1"),
    ({"stream": 0, "image": SQUARE, "world": METRES, "units": "feet"}, "units 'feet'"),
    ({"stream": 0, "image": SQUARE, "world": METRES, "window_s": 0.1}, "window_s 0.1: seconds from 0.3"),
    ({"stream": 0, "image": SQUARE, "world": [[0, 0], [8, 0], [8, math.nan], [0, 30]]}, "finite numbers"),
    ({"stream": -1, "image": SQUARE, "world": METRES}, "stream -1"),
    ({"stream": 0, "image": SQUARE}, "world is required"),
    ({"stream": 0, "image": SQUARE, "world": METRES, "height": 6}, "unknown key 'height'"),
    ({"stream": True, "image": SQUARE, "world": METRES}, "stream = True: expected int"),
])
def test_calibrations_that_cannot_be_right_are_one_line(table, message):
    with pytest.raises(CalibrationError, match=None) as caught:
        from_table(table, "[[calibration]] #1")
    text = str(caught.value)
    assert message in text and "\n" not in text, text


def test_a_calibration_from_a_known_camera_maps_the_ground_to_the_centimetre():
    """Four corners clicked to the pixel: any other point of the ground within a few centimetres at 10-40 m;
    the sky has no position."""
    camera = speed_scenes.Camera()
    calibration = speed_scenes.calibration(camera)
    ground = np.array([[x, y, 0.0] for x in (-6.0, 0.0, 3.5) for y in (12.0, 20.0, 35.0)])
    pixels = camera.project(ground)
    found, ok = calibration.plane.to_ground(pixels[:, 0], pixels[:, 1])
    assert ok.all() and np.abs(found - ground[:, :2]).max() < 0.15  # a pixel is ~10 cm at 35 m
    sky = camera.project(np.array([[0.0, 100.0, 20.0]]))  # above the horizon
    assert not calibration.plane.in_front(sky).any()


@pytest.mark.parametrize("seed, fps", [(1, 30.0), (2, 30.0), (3, 30.0), (1, 10.0), (2, 10.0), (3, 10.0)])
def test_speeds_through_a_known_camera_are_within_3_kmh(seed, fps):
    """5-80 km/h, box edges jittered by 2 % of the box, 10 % of the frames missed (the issue's target: at most
    3 km/h off, 1 km/h on average), in every speed band, at 30 and 10 fps; and most object-frames have a
    speed."""
    report = speed_scenes.evaluate(seed, speed_scenes.Noise(fps=fps))
    assert report["max_error_kmh"] <= 3.0 and report["mean_error_kmh"] <= 1.0, report
    for band in report["by_speed"].values():
        assert band["n"] > 20 and band["max"] <= 3.0, report
    assert report["with_speed"] >= 0.7 * report["object_frames"]


def test_the_running_fit_is_the_least_squares_fit_of_the_window(monkeypatch):
    """Three tracks at once: frames missed at random, one clock going back (its samples start over), the sums
    made anew at new origins every REORIGIN_S (5 s here), times from 0 to 1e6 s: every velocity the slope
    numpy's polyfit gives of the samples within the window (or the MIN_FIT newest), to 1e-6 m/s."""
    from jetpipe.pipelines.core.ground import window

    monkeypatch.setattr(window, "REORIGIN_S", 5.0)
    rng = np.random.default_rng(4)
    fits = window.WindowFits()
    fits.grow(8)
    rows = np.array([1, 5, 7])
    kept: dict[int, list] = {1: [], 5: [], 7: []}
    t = np.array([0.0, 100.0, 1e6])
    for k in range(400):
        t = t + rng.uniform(0.02, 0.1, 3)
        if k == 200:
            t[1] -= 50.0  # the clock went back: what was kept of this track is dropped
            kept[5] = []
        xy = np.column_stack([3.0 * t + rng.normal(0, 0.3, 3), -2.0 * t + 1e4 + rng.normal(0, 0.3, 3)])
        seen = rng.random(3) > 0.2
        velocity, enough = fits.add(rows[seen], t[seen], xy[seen], np.full(seen.sum(), 1.5))
        for i, row in enumerate(rows[seen].tolist()):
            j = int(np.flatnonzero(rows == row)[0])
            kept[row] = kept[row][-window.RING + 1:] + [(t[j], *xy[j])]
            while len(kept[row]) > window.MIN_FIT and kept[row][0][0] < t[j] - 1.5 - window.EDGE_S:
                kept[row].pop(0)  # out of the window, beyond the MIN_FIT newest
            samples = np.array(kept[row])
            if len(samples) < window.MIN_SAMPLES:
                assert not enough[i]
                continue
            slope = [np.polyfit(samples[:, 0], samples[:, c], 1)[0] for c in (1, 2)]
            assert enough[i] and np.allclose(velocity[i], slope, atol=1e-6), (k, row)
    assert fits.origin_t[7] > 1e6 + 15  # the origin moved on (24 s of frames)


def test_a_window_too_short_for_the_jitter_misses_the_target():
    """The target is not met by any window: a 0.5 s fit of the same detections is off by more (the test above
    can fail)."""
    report = speed_scenes.evaluate(1, window_s=0.5)
    assert report["max_error_kmh"] > 3.0


def _frame(t: float, boxes: list, tracks: list) -> tuple:
    found = Detections(np.array(boxes, np.float64).reshape(-1, 4), [0.9] * len(boxes), [0] * len(boxes),
                       layout=("boxes", "scores", "classes"), tracker_id=tracks)
    return 0, t, (1000, 1000), found


def _flat_calibration(metres_per_pixel: float = 0.1) -> Calibration:
    """The picture is the ground seen from above: a pixel is `metres_per_pixel` both ways."""
    s = metres_per_pixel
    calibration = Calibration(0, [[0, 0], [1000, 0], [1000, 1000], [0, 1000]],
                              [[0, 0], [1000 * s, 0], [1000 * s, 1000 * s], [0, 1000 * s]])
    check(calibration, "test")
    return calibration


class _Picture:
    def size(self):
        return (1000, 1000)


def _packet(slot: int, t: float):
    from types import SimpleNamespace

    return SimpleNamespace(stream=slot, pts=t, t_capture=1e9 + t, frame=_Picture())


def test_speed_heading_and_position_of_a_track_and_none_before_its_window():
    """10 pixels a frame at 10 fps and 0.1 m a pixel: 10 m/s, 36 km/h, heading 0 (along the world's x); none
    before its positions span half the 1.5 s window; an untracked box and an uncalibrated stream have none."""
    from jetpipe.pipelines.core.ground import GroundStep

    step = GroundStep([_flat_calibration()], stream_id=lambda slot: slot)
    speeds = []
    for k in range(20):
        x = 100 + 10 * k
        found = [_frame(k / 10, [[x - 5, 490, x + 5, 500], [0, 0, 10, 10]], [7, -1])[3] for _ in range(2)]
        step.run([_packet(0, k / 10), _packet(1, k / 10)], found)
        speeds.append(found[0].ground.speed_kmh[0])
        assert np.isnan(found[0].ground.position[1]).all() and found[1].ground is None
    assert np.allclose(found[0].ground.position[0], [(100 + 190) * 0.1, 50.0])
    first = int(np.flatnonzero(np.isfinite(speeds))[0])
    assert first == 8  # 0.8 s of positions: half the window (and not before)
    assert np.allclose(speeds[first:], 36.0) and found[0].ground.heading_deg[0] == pytest.approx(0.0, abs=1e-6)
    assert found[0].to_results()["speed_kmh"] == [36.0, None]


def _speeding_engine(*rules) -> Engine:
    engine = Engine()
    engine.rules = [engine.rule(rule, None) for rule in rules]
    return engine


def _tracked(t: float, x: float, speed: float, track: int = 1) -> tuple:
    stream, t, hw, found = _frame(t, [[x - 20, 420, x + 20, 500]], [track])
    found.ground = Ground.at(1, np.array([0]), np.array([[x / 10, 50.0]]), np.array([speed]), np.array([0.0]))
    return stream, t, hw, found


def test_a_line_gives_a_speed_event_for_a_crossing_above_its_limit_only():
    fast = Line("fast", [[0.5, 0.0], [0.5, 1.0]], speed_limit_kmh=30)
    slow = Line("slow", [[0.5, 0.0], [0.5, 1.0]], speed_limit_kmh=50)
    engine = _speeding_engine(fast, slow)
    happened = [h for k in range(20) for _, h in engine.decide([_tracked(k / 10, 400 + 10 * k, 42.0)])]
    kinds = sorted((h.rule, h.type) for h in happened)
    assert kinds == [("fast", "line_cross"), ("fast", "speed"), ("slow", "line_cross")]
    speeding = next(h for h in happened if h.type == "speed")
    assert speeding.fields == {"direction": "in", "limit_kmh": 30} and speeding.seen.speed_kmh == 42.0


def test_a_zone_gives_one_speed_event_a_visit():
    zone = Zone("road", [[0, 0], [1, 0], [1, 1], [0, 1]], speed_limit_kmh=30, enter_frames=1)
    engine = _speeding_engine(zone)
    speeds = [20, 20, 35, 40, 38, 20, 45]  # above the limit in three runs: one event for the visit
    happened = [h for k, v in enumerate(speeds) for _, h in engine.decide([_tracked(k / 10, 300, v)])]
    speeding = [h for h in happened if h.type == "speed"]
    assert len(speeding) == 1 and speeding[0].seen.speed_kmh == 35 and speeding[0].t == pytest.approx(0.2)


def test_records_carry_positions_speeds_and_headings_and_read_back():
    found = Detections([[0, 0, 10, 10], [1, 1, 5, 5]], [0.9, 0.8], [0, 1], layout=("boxes", "scores", "classes"),
                       tracker_id=[1, -1])
    found.ground = Ground.at(2, np.array([0]), np.array([[1.234, 5.678]]), np.array([42.26]), np.array([90.4]))
    results = found.to_results()
    assert results["ground_m"] == [[1.23, 5.68], None] and results["speed_kmh"] == [42.3, None]
    assert results["heading_deg"] == [90, None]
    assert Detections.from_results(results).to_results() == results
    assert found[np.array([False, True])].to_results()["speed_kmh"] == [None]


# --- through the configuration and the daemon ---------------------------------------------------------------

def _config(tmp_path, bundle, tables: str, source: str = "synthetic") -> str:
    config = tmp_path / "speed.toml"
    config.write_text(f'[pipeline]\nbundle = "{bundle}"\n[[source]]\nuri = "{source}"\n{tables}')
    return str(config)


CALIBRATED = ('[[calibration]]\nstream = 0\nimage = [[0, 0], [640, 0], [640, 360], [0, 360]]\n'
              'world = [[0, 0], [64, 0], [64, 36], [0, 36]]\n')


@pytest.mark.parametrize("tables, message", [
    ('[[line]]\nname = "l"\npoints = [[0.5, 0], [0.5, 1]]\nspeed_limit_kmh = 50\n', "no stream has a [[calibration]]"),
    (CALIBRATED + '[[line]]\nname = "l"\npoints = [[0.5, 0], [0.5, 1]]\nstreams = [1]\nspeed_limit_kmh = 50\n',
     "stream 1 has no [[calibration]]"),
    (CALIBRATED.replace("stream = 0", "stream = 2"), "calibration of stream 2: the stream does not exist"),
    (CALIBRATED + CALIBRATED, "the stream has two calibrations"),
    (CALIBRATED + '[[zone]]\nname = "z"\npoints = [[0, 0], [1, 0], [1, 1]]\nspeed_limit_kmh = -1\n',
     "speed_limit_kmh -1: km/h from 0"),
    ('[[calibration]]\nstream = 0\nimage = [[0, 0], [640, 0]]\nworld = [[0, 0], [1, 0]]\n', "2 points"),
    ('[calibration]\nstream = 0\n', "[calibration] is one table"),
])
def test_bad_calibrations_and_speed_rules_are_one_line_before_anything_runs(det_bundle, tmp_path, capsys, tables,
                                                                          message):
    from jetpipe.cli import main

    assert main(["serve", _config(tmp_path, det_bundle, tables), "--frames", "1", "--metrics", ""]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_moving_camera_has_no_ground_plane(det_bundle, tmp_path, capsys):
    from jetpipe.cli import main

    config = tmp_path / "moving.toml"
    config.write_text(f'[pipeline]\nbundle = "{det_bundle}"\ntracker = "botsort"\n[[source]]\nuri = "synthetic"\n'
                      f'moving_camera = true\n{CALIBRATED}')
    assert main(["serve", str(config), "--frames", "1", "--metrics", ""]) == 2
    err = capsys.readouterr().err
    assert "a ground plane is measured from a fixed view" in err and len(err.strip().splitlines()) == 1, err


def test_a_speed_rule_above_the_horizon_is_refused(det_bundle, tmp_path, capsys):
    from jetpipe.cli import main

    tilted = ('[[calibration]]\nstream = 0\nimage = [[100, 350], [540, 350], [400, 200], [240, 200]]\n'
              'world = [[0, 0], [8, 0], [8, 30], [0, 30]]\n'
              '[[line]]\nname = "l"\nunits = "pixels"\npoints = [[0, 20], [640, 20]]\nspeed_limit_kmh = 50\n')
    assert main(["serve", _config(tmp_path, det_bundle, tilted), "--frames", "1", "--metrics", ""]) == 2
    assert "above stream 0's horizon" in capsys.readouterr().err


def test_served_words_carry_their_speed_and_a_speed_line_fires_per_crossing(det_bundle, tmp_path):
    """The words pan leftwards 8 pixels a frame at 5 fps (40 px/s); with a pixel 0.1 m of ground, 14.4 km/h
    heading 180 degrees. Every speed given is within 1.5 km/h of it; a line limited to 10 km/h gives a speed
    event with each crossing, one limited to 20 km/h none."""
    from jetpipe.cli import main
    from tests.pipelines.conftest import W, write_panning_video

    video = write_panning_video(tmp_path / "panning-5fps.avi", 5)
    x = video.x_line
    tables = CALIBRATED + "".join(
        f'[[line]]\nname = "{name}"\npoints = [[{x}, 0], [{x}, 1]]\nspeed_limit_kmh = {limit}\n'
        for name, limit in (("fast", 10), ("slow", 20)))
    out, summary = tmp_path / "speed.jsonl", tmp_path / "summary.json"
    assert main(["serve", _config(tmp_path, det_bundle, tables, str(video.path)), "--metrics", "",
                 "--sink", f"jsonl:{out}", "--summary", str(summary)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    frames = [r["results"] for r in records if "schema" not in r]
    speeds = [s for r in frames for s in r["speed_kmh"] if s is not None]
    headings = [h for r in frames for h in r["heading_deg"] if h is not None]
    assert W == 640 and len(speeds) > 50 and max(abs(s - 14.4) for s in speeds) <= 1.5, speeds
    assert all(abs(h - 180) <= 5 for h in headings)
    events = [r for r in records if r.get("schema") == "jetpipe.event/1"]
    crossings = [e for e in events if e["type"] == "line_cross" and e["rule"] == "fast"]
    speeding = [e for e in events if e["type"] == "speed"]
    assert len(crossings) == video.crossings >= 2
    assert len(speeding) == len(crossings) and {e["rule"] for e in speeding} == {"fast"}
    assert all(e["limit_kmh"] == 10 and abs(e["speed_kmh"] - 14.4) <= 1.5 and e["direction"] == "out"
               for e in speeding)
    counts = json.loads(summary.read_text())["summary"]["events"]["counts"]
    assert counts["fast"] == {"out": len(crossings), "speed": len(crossings)} and counts["slow"] == {
        "out": len(crossings)}
