"""Snapshots of events: the frame of each event as a JPEG (its boxes outlined, crops where asked), a
snapshot_ready record naming its events, through the daemon on the panning video; the encoders' pictures
checked by decoding them; files never overwritten, never half-written, the folder kept within its size."""

import os
import time
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest

from jetpipe.frames import from_bgr
from jetpipe.runtime.api import Frame
from jetpipe.runtime.jpeg import CpuJpeg, clip_box
from tests.pipelines.outputs.test_clips import _serve, _serve_argv


def _green_outline(picture: np.ndarray, box) -> float:
    """The share of the box's outline (its top and bottom rows, inside the frame) that is green."""
    x0, y0, x1, y1 = box
    rows = np.concatenate([picture[y0 + 1, x0 + 4:x1 - 4], picture[y1 - 2, x0 + 4:x1 - 4]]).astype(int)
    green = (rows[:, 1] > 200) & (rows[:, 0] < 80) & (rows[:, 2] < 80)
    return float(green.mean()) if len(rows) else 0.0


def test_events_get_a_picture_of_their_frame_with_their_boxes(det_bundle, tmp_path, panning_video):
    """Each crossing's frame is written once as a JPEG that decodes at the frame's size, the crossing word's box
    outlined in green, with a snapshot_ready record naming its events; crops are the boxes' pixels."""
    folder = tmp_path / "snaps"
    x = panning_video.x_line
    records, summary = _serve(det_bundle, tmp_path, panning_video.path,
                              ["--line", f"door:{x},0,{x},1", "--snapshots", str(folder)])
    events = {r["event_id"]: r for r in records if r.get("schema") == "jetpipe.event/1"}
    ready = [r for r in records if r.get("schema") == "jetpipe.snapshot/1"]
    assert len(events) == panning_video.crossings >= 2
    assert sorted(e for r in ready for e in r["events"]) == sorted(events)  # every event in one picture
    assert {k: summary["snapshots"][k] for k in ("written", "failed", "dropped", "encoder")} == \
        {"written": len(ready), "failed": 0, "dropped": 0, "encoder": "cpu"}
    source = cv2.VideoCapture(str(panning_video.path))
    frames = []
    while (got := source.read())[0]:
        frames.append(got[1])
    for record in ready:
        assert record["type"] == "snapshot_ready" and Path(record["path"]).parent == folder
        picture = cv2.imread(record["path"])
        assert picture.shape == frames[record["frame"]].shape
        assert record["bytes"] == Path(record["path"]).stat().st_size
        for event_id in record["events"]:
            event = events[event_id]
            assert event["frame"] == record["frame"] and event["stream"] == record["stream"]
            assert _green_outline(picture, clip_box(event["box"], picture.shape[:2])) > 0.9
        # away from the boxes, the picture is the frame (JPEG's loss aside)
        assert np.abs(picture[:8].astype(int) - frames[record["frame"]][:8]).mean() < 6
    assert sorted(p.name for p in folder.iterdir()) == sorted(Path(r["path"]).name for r in ready)  # no temp left


def test_crops_are_the_boxes_pixels(det_bundle, tmp_path, panning_video):
    folder = tmp_path / "snaps"
    config = tmp_path / "serve.toml"
    x = panning_video.x_line
    config.write_text(f'[pipeline]\nbundle = "{det_bundle}"\n[[source]]\nuri = "{panning_video.path}"\n'
                      f'[snapshots]\nfolder = "{folder}"\ncrop = true\nbox = false\nquality = 95\n'
                      f'[[line]]\nname = "door"\npoints = [[{x}, 0], [{x}, 1]]\n')
    records, _ = _serve_argv(tmp_path, [str(config)])
    events = {r["event_id"]: r for r in records if r.get("schema") == "jetpipe.event/1"}
    ready = [r for r in records if r.get("schema") == "jetpipe.snapshot/1"]
    assert ready and sorted(e for r in ready for e in r["crops"]) == sorted(events)
    for record in ready:
        whole = cv2.imread(record["path"])
        for event_id, path in record["crops"].items():
            x0, y0, x1, y1 = clip_box(events[event_id]["box"], whole.shape[:2])
            crop = cv2.imread(path)
            assert crop.shape == (y1 - y0, x1 - x0, 3)
            assert np.abs(crop.astype(int) - whole[y0:y1, x0:x1]).mean() < 8  # box = false: nothing drawn


def test_snapshot_options_are_checked_before_anything_runs(det_bundle, tmp_path, capsys):
    from jetpipe.cli import main

    afile = tmp_path / "a-file"
    afile.write_text("")
    base = ["serve", "--bundle", str(det_bundle), "--source", "synthetic", "--metrics", ""]
    for extra, message in ([["--snapshots", str(afile / "sub")], "snapshots folder"],
                           [["--snapshots", str(afile)], "is not a folder this user can write"]):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    config = tmp_path / "serve.toml"
    for table, message in (('quality = 0', "snapshots quality = 0: from 1 to 100"),
                           ('encoder = "nvenc"', "snapshots encoder = 'nvenc': choose auto, gpu, cpu"),
                           ('on = ["door_opened"]', "snapshots on = ['door_opened']: event types from"),
                           ('buffers = 1000', "snapshots buffers = 1000: from 1 to 256"),
                           ('encoder = "gpu"', "JPEG encoder 'gpu': the CPU runtime has no GPU")):
        config.write_text(f'[pipeline]\nbundle = "{det_bundle}"\nbackend = "onnxruntime-cpu"\n[[source]]\n'
                          f'uri = "synthetic"\n[snapshots]\nfolder = "{tmp_path / "s"}"\n{table}\n')
        assert main(["serve", str(config), "--metrics", ""]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (table, err)


def _frame(height=120, width=160, fmt="nv12"):
    bgr = np.zeros((height, width, 3), np.uint8)
    bgr[:, :, 2] = np.linspace(0, 255, width, dtype=np.uint8)  # red ramp left to right
    bgr[:, :, 0] = np.linspace(0, 255, height, dtype=np.uint8)[:, None]  # blue ramp top to bottom
    return bgr, Frame(from_bgr(bgr, fmt) if fmt != "bgr" else bgr, fmt)


@pytest.mark.parametrize("fmt", ["nv12", "i420", "bgr"])
def test_the_cpu_encoder_pictures_the_frame_a_box_and_a_crop(fmt):
    bgr, frame = _frame(fmt=fmt)
    encoder = CpuJpeg(95, 2, (240, 320))
    held = encoder.hold(frame)
    assert encoder.hold(frame) is not None and encoder.hold(frame) is None  # two buffers: the third is a drop
    whole = cv2.imdecode(np.frombuffer(encoder.picture(held, [(20, 30, 80, 90)]), np.uint8), cv2.IMREAD_COLOR)
    assert whole.shape == bgr.shape
    assert _green_outline(whole, (20, 30, 80, 90)) > 0.9
    assert np.abs(whole[:20].astype(int) - bgr[:20]).mean() < 6
    crop = cv2.imdecode(np.frombuffer(encoder.picture(held, crop=(20, 30, 80, 90)), np.uint8), cv2.IMREAD_COLOR)
    assert crop.shape == (60, 60, 3) and np.abs(crop.astype(int) - bgr[30:90, 20:80]).mean() < 6
    encoder.release(held)
    assert encoder.hold(frame) is not None


def test_boxes_are_clipped_to_the_frame():
    assert clip_box([-5.5, 10.2, 50.7, 300], (120, 160)) == (0, 10, 51, 120)
    assert clip_box([170, 10, 200, 20], (120, 160)) is None


def _event(frame_no, box, event_id, stream=0):
    return SimpleNamespace(type="line_cross", stream=stream, frame=frame_no, pts=frame_no / 2, box=box,
                           event_id=event_id, track_id=1)


def test_a_full_encoder_drops_and_one_frames_events_share_a_picture(tmp_path):
    """Events of one frame make one picture; with every buffer waiting, the next event's picture is dropped and
    counted, never waited for; a name an earlier run wrote is never written over."""
    from jetpipe.pipelines.outputs.snapshots import Snapshots

    class Slow(CpuJpeg):
        def picture(self, held, boxes=(), crop=None):
            gate.wait(10)
            return super().picture(held, boxes, crop)

    import threading
    gate = threading.Event()
    delivered = []
    config = SimpleNamespace(folder=str(tmp_path), on=["line_cross"], box=True, crop=False, buffers=1,
                             max_total_mb=100.0, max_age_h=0.0)
    (tmp_path / "stream0-00000001-1.jpg").write_bytes(b"an earlier run's")
    snapshots = Snapshots(config, Slow(90, 1, (120, 160)), delivered.append)
    try:
        _, frame = _frame()
        snapshots.take(_event(1, [10, 10, 50, 50], "a"), frame)
        deadline = time.monotonic() + 10
        while not snapshots.work.empty() and time.monotonic() < deadline:
            time.sleep(0.01)  # the thread took frame 1's picture: it waits at the gate
        snapshots.take(_event(2, [10, 10, 50, 50], "b"), frame)  # the one buffer is busy: dropped
        gate.set()
        deadline = time.monotonic() + 10
        while not delivered and time.monotonic() < deadline:
            time.sleep(0.01)
        snapshots.take(_event(3, [10, 10, 50, 50], "c"), frame)
        snapshots.take(_event(3, [60, 60, 90, 90], "d"), frame)
    finally:
        snapshots.close()
    assert snapshots.dropped == 1 and snapshots.failed == 0
    assert [r.events for r in delivered] == [["a"], ["c", "d"]]
    assert (tmp_path / "stream0-00000001-1.jpg").read_bytes() == b"an earlier run's"
    assert delivered[0].path != str(tmp_path / "stream0-00000001-1.jpg")


def test_the_folder_keeps_its_size_and_only_snapshots_go(tmp_path):
    from jetpipe.pipelines.outputs.retention import keep_within
    from jetpipe.pipelines.outputs.snapshots import SNAPSHOT_NAME

    theirs = tmp_path / "stream0-notes.jpg"
    theirs.write_bytes(b"x" * 200_000)
    now = time.time()
    for k in range(4):
        picture = tmp_path / f"stream0-{k:08d}-{k + 1}.jpg"
        picture.write_bytes(b"j" * 100_000)
        os.utime(picture, (now - 100 + k, now - 100 + k))
    assert keep_within(tmp_path, SNAPSHOT_NAME, 0.25, 0.0) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stream0-00000002-3.jpg", "stream0-00000003-4.jpg",
                                                          "stream0-notes.jpg"]


def test_a_link_named_like_a_snapshot_is_neither_counted_nor_removed(tmp_path):
    """Someone else's symbolic link in the folder, under a snapshot's name, stays (and so does its target)."""
    from jetpipe.pipelines.outputs.retention import keep_within
    from jetpipe.pipelines.outputs.snapshots import SNAPSHOT_NAME

    target = tmp_path.parent / f"{tmp_path.name}-target"
    target.write_bytes(b"t" * 300_000)
    link = tmp_path / "stream0-00000000-1.jpg"
    link.symlink_to(target)
    old = time.time() - 7200
    os.utime(link, (old, old), follow_symlinks=False)
    picture = tmp_path / "stream0-00000001-2.jpg"
    picture.write_bytes(b"j" * 100_000)
    assert keep_within(tmp_path, SNAPSHOT_NAME, 0.25, 1.0) == 0
    assert link.is_symlink() and target.stat().st_size == 300_000 and picture.exists()
