"""`jetpipe calibrate tracking`: trackers scored by TrackEval on the built-in scenes, or a served JSONL's tracks
against MOTChallenge ground truth; bad ground truth is one line and exit 2, with nothing written."""

import json

import numpy as np
import pytest

from jetpipe.calibration.tracking_scenes import make_scene
from jetpipe.cli import main

pytest.importorskip("trackeval", reason="TrackEval scores the trackers: pip install --no-deps trackeval")


def test_scene_report_compares_the_trackers(tmp_path, capsys):
    report = tmp_path / "report"
    assert main(["calibrate", "tracking", "--scenes", "pillars", "--fps", "10", "--seeds", "1,2",
                 "--report", str(report)]) == 0
    data = json.loads((report / "report.json").read_text())
    assert {(r["tracker"], r["seed"]) for r in data["rows"]} == {(t, s) for t in ("bytetrack", "botsort")
                                                                  for s in (1, 2)}
    by = {s["tracker"]: s for s in data["summary"]}
    assert by["botsort"]["IDF1"] > by["bytetrack"]["IDF1"] and by["botsort"]["worst_IDF1"] <= by["botsort"]["IDF1"]
    assert (report / "hota.png").stat().st_size > 0 and "| pillars@10fps | botsort |" in capsys.readouterr().out


def _served(scene, path):
    """The scene's ground truth written as a jetpipe JSONL (what a perfect tracker serves) and as gt.txt."""
    lines, gt = [], []
    for k, frame in enumerate(scene.frames):
        boxes = [[round(v, 1) for v in b] for b in frame.gt_boxes.tolist()]
        ids = [int(i) + 1 for i in frame.gt_ids]
        lines.append(json.dumps({"stream": 0, "frame": k, "results": {"boxes": boxes, "track_ids": ids}}))
        gt += [f"{k + 1},{i},{b[0]},{b[1]},{b[2] - b[0]},{b[3] - b[1]},1,1,1" for i, b in zip(ids, boxes)]
    path.write_text("\n".join(lines) + "\n")
    (path.parent / "gt.txt").write_text("\n".join(gt) + "\n")


def test_served_tracks_against_mot_ground_truth(tmp_path):
    _served(make_scene("crossing", 10.0, seconds=5, seed=3), tmp_path / "served.jsonl")
    report = tmp_path / "report"
    assert main(["calibrate", "tracking", "--gt", str(tmp_path / "gt.txt"), "--results",
                 str(tmp_path / "served.jsonl"), "--report", str(report)]) == 0
    (row,) = json.loads((report / "report.json").read_text())["rows"]
    assert row["IDF1"] == 100 and row["IDSW"] == 0 and row["MOTA"] == 100 and row["HOTA"] > 99


@pytest.mark.parametrize("row, said", [("1,2,3", "a MOTChallenge row is"), ("0,1,5,5,10,10", "start at 1"),
                                       ("1,1,5,5,-3,10", "positive"), ("1,x,5,5,3,10", "a MOTChallenge row is")])
def test_bad_ground_truth_is_one_line_and_nothing_written(tmp_path, capsys, row, said):
    (tmp_path / "gt.txt").write_text(f"1,1,5,5,10,10,1,1,1\n{row}\n")
    (tmp_path / "served.jsonl").write_text(json.dumps({"stream": 0, "frame": 0, "results": {"boxes": [],
                                                                                              "track_ids": []}}))
    code = main(["calibrate", "tracking", "--gt", str(tmp_path / "gt.txt"), "--results",
                 str(tmp_path / "served.jsonl"), "--report", str(tmp_path / "report")])
    err = capsys.readouterr().err
    assert code == 2 and said in err and "gt.txt:2" in err and "Traceback" not in err
    assert not (tmp_path / "report").exists()


def test_bad_flags_are_one_line(tmp_path, capsys):
    for flags in (["--trackers", "deepsort"], ["--fps", "0"], ["--seeds", "1.5"], ["--gt", str(tmp_path / "gt.txt")]):
        assert main(["calibrate", "tracking", *flags, "--report", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err


def test_a_rendered_scene_and_its_ground_truth_agree(tmp_path):
    """The video scene: as many frames as the ground truth covers, every ground-truth box inside the frame,
    and the sign behind a pillar left out while it is hidden."""
    import shutil
    import subprocess

    from jetpipe.calibration.tracking import read_mot
    from jetpipe.calibration.tracking_scenes import HEIGHT, WIDTH, render_scene

    if shutil.which("ffmpeg") is None or shutil.which("ffprobe") is None:
        pytest.skip("ffmpeg renders the scene (apt-get install ffmpeg)")
    gt = read_mot(render_scene("pillars", tmp_path / "scene.mp4", fps=10, seconds=6, seed=2))
    frames = subprocess.run(["ffprobe", "-v", "error", "-count_frames", "-show_entries", "stream=nb_read_frames",
                             "-of", "csv=p=0", str(tmp_path / "scene.mp4")], capture_output=True, text=True).stdout
    assert int(frames) == 60 and max(gt) <= 60
    boxes = np.concatenate([b for _, b in gt.values()])
    assert (boxes[:, 0] >= 0).all() and (boxes[:, 2] <= WIDTH).all() and (boxes[:, 3] <= HEIGHT).all()
    seen = [len(ids) for ids, _ in gt.values()]
    assert max(seen) >= 3  # several signs in view at once
