"""Continuous recording: segments of a stream's own packets (fragmented MP4, checked with FFmpeg's tools), the
index that survives a killed process, the budget that is never exceeded, and the daemon's --record."""

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from jetpipe.pipelines.config import RecordConfig
from jetpipe.pipelines.ingest.packet_ring import Packet, PacketRing
from jetpipe.pipelines.ingest.sources.base import not_teed
from jetpipe.pipelines.outputs.recording.index import INDEX_NAME, RecordIndex
from jetpipe.pipelines.outputs.recording.lock import LOCK_NAME
from jetpipe.pipelines.outputs.recording.recorder import Recorder
from jetpipe.pipelines.outputs.recording.segments import SegmentFile, probe, repair, template_of, whole_length

needs_ffmpeg = pytest.mark.skipif(not (shutil.which("ffmpeg") and shutil.which("ffprobe")),
                                  reason="ffmpeg and ffprobe are not on PATH (apt-get install ffmpeg)")
FPS, GOP = 30, 15


def _video(path: Path, seconds: float = 6, bitrate: str = "300k") -> Path:
    subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-f", "lavfi", "-i", f"testsrc2=size=320x240:rate={FPS}",
                    "-t", str(seconds), "-c:v", "libx264", "-bf", "2", "-g", str(GOP), "-keyint_min", str(GOP),
                    "-b:v", bitrate, "-pix_fmt", "yuv420p", str(path)], check=True)
    return path


def _packets(path: Path, passes: int = 1) -> tuple[list[Packet], object]:
    """The file's packets in decode order, as the in-process source keeps them: times from its start, shifted
    across passes as a looped file's; and the time base."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        raw = [p for p in container.demux(stream) if p.size]
        start, base = stream.start_time or 0, stream.time_base
        length = max(p.pts for p in raw) - start + raw[0].duration
        packets = []
        for n in range(passes):
            shift = n * length - start
            packets += [Packet(float((p.pts + shift) * base), bytes(p), p.pts + shift, p.dts + shift, p.duration,
                               p.is_keyframe) for p in raw]
        return packets, base


def _probe_packets(path: Path) -> list[dict]:
    done = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v", "-show_packets", "-show_entries",
                           "packet=pts_time,dts_time,flags", "-of", "json", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["packets"]


def _decodes(path: Path) -> int:
    done = subprocess.run(["ffmpeg", "-v", "error", "-i", str(path), "-f", "framemd5", "-"], capture_output=True,
                          text=True)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr[-500:]
    return sum(1 for line in done.stdout.splitlines() if line and not line.startswith("#"))


def _gops(packets: list[Packet]) -> list[list[Packet]]:
    gops = []
    for p in packets:
        if p.key:
            gops.append([])
        gops[-1].append(p)
    return gops


@needs_ffmpeg
def test_a_segment_is_the_streams_own_packets_and_a_cut_one_plays_to_its_last_whole_fragment(tmp_path):
    video = _video(tmp_path / "in.mp4")
    packets, base = _packets(video)
    gops = _gops(packets)
    path = tmp_path / "seg.mp4"
    template = template_of(None, str(video), gops[0])
    segment = SegmentFile(path, template, base, gops[0][0].dts)
    for gop in gops[:6]:
        segment.write(gop)
    written = segment.close()
    template.close()
    assert written.packets == 6 * GOP == len(_probe_packets(path)) == _decodes(path)
    assert written.t1 == pytest.approx(6 * GOP / FPS, abs=1 / FPS)
    assert probe(path).seconds == pytest.approx(written.t1 - written.t0, abs=1.5 / FPS)
    # a process killed mid-fragment leaves a file cut anywhere: repair keeps its whole fragments, which play
    whole = path.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(whole[:int(len(whole) * 0.7)])
    kept = whole_length(cut)
    assert 0 < kept < int(len(whole) * 0.7)
    probed = repair(cut)
    assert cut.stat().st_size == kept and probed.packets % GOP == 0 and 0 < probed.packets < 6 * GOP
    assert _decodes(cut) == probed.packets
    with pytest.raises(FileExistsError):  # a segment never writes into a file it did not make, nor a link
        SegmentFile(path, template_of(None, str(video), gops[0]), base, 0)
    os.symlink(tmp_path / "elsewhere", tmp_path / "link.mp4")
    with pytest.raises(FileExistsError):
        SegmentFile(tmp_path / "link.mp4", template_of(None, str(video), gops[0]), base, 0)
    assert not (tmp_path / "elsewhere").exists()


def test_the_index_finishes_rows_left_open_drops_rows_without_files_and_adopts_files_without_rows(tmp_path):
    folder = tmp_path / "rec"
    folder.mkdir()
    index = RecordIndex(folder)
    gone = index.begin(1, "cam", "stream1/2026-11-28/10-00-00.000.mp4", 1000.0, 0.0)
    index.finish(gone, 1010.0, 10.0, 123, 300, False)
    index.close()
    index = RecordIndex(folder)
    assert index.repair() == {"finished": 0, "dropped": 1, "adopted": 0}
    assert index.db.execute("SELECT COUNT(*) FROM segments").fetchone()[0] == 0
    index.close()
    # a damaged index is set aside and a new one made
    (folder / INDEX_NAME).write_bytes(b"not a database" * 100)
    for name in ("-wal", "-shm"):
        (folder / (INDEX_NAME + name)).unlink(missing_ok=True)
    index = RecordIndex(folder)
    assert index.repair() == {"finished": 0, "dropped": 0, "adopted": 0}
    assert [p.name for p in folder.glob(INDEX_NAME + ".damaged-*")]
    index.close()


def linked_index(tmp_path) -> tuple[Path, Path]:
    """A recording folder whose index is a link to someone else's file: (the folder, that file)."""
    folder = tmp_path / "rec"
    folder.mkdir()
    target = tmp_path / "someone-elses.db"
    target.write_bytes(b"theirs")
    os.symlink(target, folder / INDEX_NAME)
    return folder, target


def test_the_index_refuses_a_link_in_its_place(tmp_path):
    from jetpipe.pipelines.config import ConfigError

    folder, target = linked_index(tmp_path)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        RecordIndex(folder)
    assert target.read_bytes() == b"theirs"


def test_a_passs_events_are_indexed_in_one_transaction_whole_or_not_at_all(tmp_path):
    from jetpipe.pipelines.core.events.record import EventRecord

    def event(stream, label="person"):
        return EventRecord("zone_enter", "door", stream, 1, 0.5, 1000.0, 7, label, 0, 0.9, [0, 0, 1, 1], {}, {})

    folder = tmp_path / "rec"
    folder.mkdir()
    index = RecordIndex(folder)
    index.add_events([event(0), event(1)])
    # a row that cannot be stored (a label SQLite cannot hold) fails the whole batch: one transaction, not one
    # a row (which also cost 85 us an event, most of what a busy run's events cost the recorder)
    with pytest.raises(sqlite3.Error):
        index.add_events([event(2), event(5, label=["not", "a", "label"]), event(3)])
    assert [row[0] for row in index.db.execute("SELECT stream FROM events ORDER BY stream")] == [0, 1]
    index.add_events([event(4)])
    assert index.db.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 3
    index.close()


@dataclass
class _Source:
    """The source's side the recorder reads (a stream's ring is fed here as a demuxing source feeds it)."""
    location: str
    bit_rate: float = 300e3
    keeps_packets: bool = True
    packet_ring: PacketRing | None = None
    source_uri: object = field(init=False)

    def __post_init__(self):
        self.source_uri = type("Uri", (), {"location": self.location})()

    def describe(self) -> str:
        return self.location

    tee_packets = not_teed  # its packets are fed here


def _config(folder: Path, **given) -> RecordConfig:
    """A checked [record] (validate() makes the folder and parses the sizes)."""
    folder.mkdir(exist_ok=True)
    values = {"folder": str(folder), "segment_s": 2.0, "max_size": 10**9, "max_age": 0.0, "events_max_age": 0.0,
              "min_free": 0}
    return RecordConfig(**{**values, **given})


def _folder_bytes(folder: Path) -> int:
    """As du counts the folder: every file's and folder's whole blocks (or its size, where larger); a file the
    recorder removes while it is counted is not counted."""
    total = 0
    for path in folder.rglob("*"):
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue
        total += max(info.st_size if path.is_file() else 0, info.st_blocks * 512)
    return total


def _rows(folder: Path) -> list[tuple]:
    with sqlite3.connect(folder / INDEX_NAME) as db:
        return db.execute("SELECT path, start, end, bytes, packets, open, held FROM segments ORDER BY start").fetchall()


def _feed(source, packets, time_base, sample=None, pace_gops: float = 0.0) -> None:
    """Each GOP into the ring, as a source would (its time base set at the first); sample() after each."""
    source.packet_ring.time_base = time_base
    for gop in _gops(packets):
        for p in gop:
            source.packet_ring.add(p)
        if sample is not None:
            sample()
        time.sleep(pace_gops)
    source.packet_ring.end()


def _wait(condition, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _recorded(tmp_path, stream: int, passes: int) -> tuple[Path, list[tuple], Recorder]:
    """A 6-s test video `passes` times over, recorded as stream `stream` in 2-s segments: the folder, its index's
    rows, the (closed) recorder."""
    video = _video(tmp_path / "in.mp4", seconds=6)
    packets, base = _packets(video, passes=passes)
    folder = tmp_path / "rec"
    recorder = Recorder(_config(folder), 5.0, 5.0, 64)
    source = _Source(str(video))
    recorder.attach(stream, source, "all")
    _feed(source, packets, base)
    recorder.close()
    return folder, _rows(folder), recorder


@needs_ffmpeg
def test_a_streams_segments_meet_end_to_end_and_each_plays(tmp_path):
    folder, rows, recorder = _recorded(tmp_path, 3, passes=2)
    assert len(rows) == 6 and all(r[5] == 0 for r in rows)  # 12 s in 2-s segments, all closed
    for (path, _, end, size, count, _, _), following in zip(rows, rows[1:] + [None]):
        assert path.startswith("stream3/") and (folder / path).stat().st_size == size
        assert count == 2 * FPS == _decodes(folder / path) == len(_probe_packets(folder / path))
        if following is not None:
            assert following[1] == pytest.approx(end, abs=1e-6)  # no gap, no overlap
    # from the first decode time (two B-frames before the first shown frame) to past the last frame shown
    assert rows[-1][2] - rows[0][1] == pytest.approx(12.0 + 2 / FPS, abs=1e-3)
    assert recorder.summary()["segments"] == 6 and recorder.summary()["lost_gops"] == 0


@needs_ffmpeg
def test_the_budget_is_never_exceeded_and_the_oldest_segments_go_first(tmp_path):
    """90 s of a 1 Mbit/s stream into a 6 MB budget (the index's 2 MB headroom included): the folder's bytes,
    sampled after each GOP, never pass it; what is kept is the newest stretch, whole."""
    video = _video(tmp_path / "in.mp4", seconds=6, bitrate="1000k")
    packets, base = _packets(video, passes=15)
    folder = tmp_path / "rec"
    budget = 6_000_000
    recorder = Recorder(_config(folder, max_size=budget), 5.0, 5.0, 64)
    source = _Source(str(video), bit_rate=1e6)
    recorder.attach(0, source, "all")
    sizes = []
    _feed(source, packets, base, sample=lambda: sizes.append(_folder_bytes(folder)), pace_gops=0.01)
    recorder.close()
    sizes.append(_folder_bytes(folder))
    assert max(sizes) <= budget
    summary = recorder.summary()
    assert summary["removed_for_room"] > 10 and summary["refused_gops"] == 0
    rows = _rows(folder)
    for row, following in zip(rows, rows[1:]):
        assert following[1] == pytest.approx(row[2], abs=1e-6)  # the kept stretch is whole
    assert rows[-1][2] - rows[0][1] > 20  # about 4 MB of 125 kB/s


def test_a_budget_too_small_for_two_segments_of_a_stream_is_one_line_at_start(tmp_path):
    from jetpipe.pipelines.config import ConfigError

    recorder = Recorder(_config(tmp_path / "rec", max_size=4_000_000, segment_s=60.0), 5.0, 5.0, 64)
    try:
        with pytest.raises(ConfigError, match="holds less than two 60-s segments"):
            recorder.attach(0, _Source("x.mp4", bit_rate=2e6), "all")
    finally:
        recorder.close()


# --- through the daemon -------------------------------------------------------------------------------------

def _serve(tmp_path, toml: str, argv: list[str]) -> tuple[list[dict], dict]:
    """`jetpipe serve CONFIG ARGV` with a jsonl sink and a summary: its records and its summary."""
    from jetpipe.cli import main

    config, out, summary = tmp_path / "serve.toml", tmp_path / "out.jsonl", tmp_path / "summary.json"
    config.write_text(toml)
    assert main(["serve", str(config), *argv, "--metrics", "", "--sink", f"jsonl:{out}", "--summary",
                 str(summary)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()], json.loads(summary.read_text())["summary"]


def _index(folder: Path, query: str) -> list[tuple]:
    """The query's rows, read as the review API reads the index: read-only, beside the writer."""
    db = sqlite3.connect(f"file:{folder / INDEX_NAME}?mode=ro", uri=True, timeout=10)
    try:
        return db.execute(query).fetchall()
    finally:
        db.close()


def _rows_once_made(folder: Path, query: str) -> list[tuple]:
    """_index's rows, or none while the run has not made the index and its tables yet (it is polled)."""
    try:
        return _index(folder, query) if (folder / INDEX_NAME).exists() else []
    except sqlite3.OperationalError:  # the file is there, its tables not yet
        return []


@needs_ffmpeg
def test_serve_records_every_frame_of_a_file_and_indexes_its_events_and_clips(det_bundle, tmp_path, panning_video,
                                                                             panning_h264):
    """The panning video (2 fps, a keyframe every 2 s) served with a line, clips and --record: its 40 packets in
    4-s segments that meet end to end and each play; every event, and every clip, in the index; the segments
    within the clips' 4 s before and 2 s after an event held."""
    folder, clips, x = tmp_path / "rec", tmp_path / "clips", panning_video.x_line
    toml = (f"[pipeline]\nbundle = '{det_bundle}'\n[[source]]\nuri = '{panning_h264}'\n"
            f"[record]\nfolder = '{folder}'\nsegment_s = 4\n")
    records, summary = _serve(tmp_path, toml, ["--line", f"door:{x},0,{x},1", "--clips", str(clips), "--clip-before",
                                               "4", "--clip-after", "2"])
    events = {r["event_id"]: r for r in records if r.get("schema") == "jetpipe.event/1"}
    ready = [r for r in records if r.get("schema") == "jetpipe.clip/1"]
    assert len(events) == panning_video.crossings >= 2 and ready
    # the file is read faster than real time: its segments meet on its own clock (pts), where events are judged
    rows = _index(folder, "SELECT path, t0, t1, packets, open, held FROM segments ORDER BY t0")
    assert sum(r[3] for r in rows) == panning_video.frames and all(r[4] == 0 for r in rows)
    assert len(rows) == panning_video.frames // 8  # 4-s segments of 2-fps frames
    for row, following in zip(rows, rows[1:]):
        assert following[1] == pytest.approx(row[2], abs=1e-6)
    for path, *_ in rows:
        assert _decodes(folder / path) == 8
    assert summary["recording"]["segments"] == len(rows) and summary["recording"]["lost_gops"] == 0
    assert sorted(r[0] for r in _index(folder, "SELECT id FROM events")) == sorted(events)
    assert sorted(r[0] for r in _index(folder, "SELECT path FROM media WHERE kind = 'clip'")) == \
        sorted(r["path"] for r in ready)
    times = [e["pts"] for e in events.values()]
    for _, t0, t1, _, _, held in rows:
        assert held == any(t0 - 2 <= t <= t1 + 4 for t in times)


@needs_ffmpeg
def test_events_mode_keeps_only_the_segments_around_events(det_bundle, tmp_path, panning_video, panning_h264):
    folder, x = tmp_path / "rec", panning_video.x_line
    toml = (f"[pipeline]\nbundle = '{det_bundle}'\n[[source]]\nuri = '{panning_h264}'\n"
            f"[record]\nfolder = '{folder}'\nsegment_s = 2\nmode = 'events'\n[clips]\nbefore_s = 1\nafter_s = 1\n")
    records, summary = _serve(tmp_path, toml, ["--line", f"door:{x},0,{x},1"])
    times = [r["pts"] for r in records if r.get("schema") == "jetpipe.event/1"]
    rows = _index(folder, "SELECT path, t0, t1, held FROM segments ORDER BY t0")
    assert times and rows and all(held for *_, held in rows)
    assert len(rows) < panning_video.frames // 4  # not every 2-s segment: only those within 1 s of an event
    for path, start, end, _ in rows:
        assert any(start - 1 <= t <= end + 1 for t in times) and (folder / path).is_file()
    kept = {r[0] for r in rows}
    assert {str(p.relative_to(folder)) for p in folder.rglob("*.mp4")} == kept  # the others' files went too


def test_record_options_are_checked_before_anything_runs(det_bundle, tmp_path, capsys):
    from jetpipe.cli import main

    base = ["serve", "--bundle", str(det_bundle), "--source", "synthetic", "--metrics", ""]
    rec = str(tmp_path / "rec")
    for extra, message in ([["--record", rec, "--record-max-size", "1MB"], "record max_size = 1 MB: from 4 MB"],
                           [["--record", rec, "--record-max-size", "lots"], "'lots' is not a size"],
                           [["--record", rec, "--record-max-age", "3 fortnights"], "is not a duration"],
                           [["--record-max-size", "1GB"], "add --record DIR"]):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    config = tmp_path / "serve.toml"
    config.write_text(f'[pipeline]\nbundle = "{det_bundle}"\n[[source]]\nuri = "synthetic"\nrecord = "always"\n'
                      f'[record]\nfolder = "{rec}"\n')
    assert main(["serve", str(config), "--metrics", ""]) == 2
    assert "record = 'always': allowed all | events | off" in capsys.readouterr().err


def test_a_recording_folder_on_a_read_only_file_system_is_one_line(det_bundle, tmp_path, capsys):
    from jetpipe.cli import main

    mounted = tmp_path / "ro"
    mounted.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mounted)],
                      capture_output=True).returncode != 0:
        pytest.skip("a read-only file system cannot be mounted here (needs root and mount)")
    try:
        assert main(["serve", "--bundle", str(det_bundle), "--source", "synthetic", "--metrics", "", "--record",
                     str(mounted)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is not a folder this user can write" in err[0], err
    finally:
        subprocess.run(["umount", str(mounted)], check=True)


@needs_ffmpeg
def test_a_killed_run_loses_at_most_its_open_segment_and_the_index_is_whole_at_the_next_start(tiny_bundle, tmp_path,
                                                                                              panning_h264):
    """serve --record on a live-paced file, killed with SIGKILL once segments were closed: at the next start
    every row is finished (the open one from its file, cut after its last whole fragment), each segment plays,
    they meet end to end, and nothing outside the folder was touched."""
    folder, beside = tmp_path / "rec", tmp_path / "beside"
    beside.mkdir()
    (beside / "keep.txt").write_text("theirs")
    config = tmp_path / "serve.toml"
    config.write_text(f"[pipeline]\nbundle = '{tiny_bundle}'\n[[source]]\nuri = '{panning_h264}'\nloop = true\n"
                      f"realtime = true\n[record]\nfolder = '{folder}'\nsegment_s = 6\n")
    for _ in range(3):  # a kill in the moment between a segment's end and the next one's row leaves none open
        run = subprocess.Popen([sys.executable, "-m", "jetpipe", "serve", str(config), "--metrics", ""],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=Path(__file__).parents[3])
        try:
            _wait(lambda: len(_rows_once_made(folder, "SELECT 1 FROM segments WHERE open = 0")) >= 2, timeout=120)
            _wait(lambda: any((folder / p).stat().st_size > 0 for p, in
                              _rows_once_made(folder, "SELECT path FROM segments WHERE open = 1")), timeout=30)
        finally:
            run.send_signal(signal.SIGKILL)  # (its recording process dies with it)
            run.wait()
        before = _index(folder, "SELECT path, open FROM segments ORDER BY start")
        if before[-1][1] == 1:
            break
    assert before[-1][1] == 1  # it died while writing one
    index = RecordIndex(folder)
    done = index.repair()
    index.close()
    assert done["finished"] + done["dropped"] == 1 and done["adopted"] == 0
    rows = _index(folder, "SELECT path, start, end, packets, open FROM segments ORDER BY start")
    assert len(rows) >= len(before) - 1 and all(r[4] == 0 for r in rows)
    for path, _, _, packets, _ in rows:
        assert _decodes(folder / path) == packets
    for row, following in zip(rows, rows[1:]):
        assert following[1] == pytest.approx(row[2], abs=1e-3)
    assert [p.name for p in beside.iterdir()] == ["keep.txt"] and (beside / "keep.txt").read_text() == "theirs"
    ours = {INDEX_NAME, INDEX_NAME + "-wal", INDEX_NAME + "-shm", LOCK_NAME, "stream0"}
    assert {p.name for p in folder.iterdir()} <= ours


def _duration(path: Path) -> float:
    done = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0", str(path)],
                          capture_output=True, text=True, check=True)
    return float(done.stdout)


@needs_ffmpeg
def test_an_export_across_five_segments_is_one_file_whose_length_is_the_range_within_a_gop(tmp_path, capsys):
    from jetpipe.cli import main

    folder, rows, _ = _recorded(tmp_path, 2, passes=3)
    assert len(rows) == 9
    start, end = rows[1][1] + 0.3, rows[5][2] - 0.4  # within the 2nd to the 6th segment
    out = tmp_path / "range.mp4"
    assert main(["export", "recording", str(folder), "--stream", "2", "--from", str(start), "--to", str(end), "-o",
                 str(out)]) == 0
    assert "from 5 segment(s)" in capsys.readouterr().out
    frames = _decodes(out)
    assert frames == len(_probe_packets(out))
    assert end - start <= _duration(out) <= end - start + GOP / FPS + 2 / FPS  # from the keyframe at or before it
    assert frames == pytest.approx((end - start) * FPS, abs=GOP + 2)
    # the same name again, a time that does not parse, a stream with nothing recorded: one line each, exit 2
    for argv, message in ((["--stream", "2", "--from", str(start), "--to", str(end)], "is there already"),
                          (["--stream", "2", "--from", "yesterday", "--to", str(end)], "'yesterday' is not a time"),
                          (["--stream", "7", "--from", str(start), "--to", str(end)], "stream 7 has no recording")):
        assert main(["export", "recording", str(folder), *argv, "-o", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


@needs_ffmpeg
@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_annex_b_packets_as_nvdec_gives_them_are_recorded_as_the_inputs_own_pictures(tmp_path, codec):
    """NVDEC's demuxer (and an ffmpeg process's) gives Annex B: each segment takes its codec parameters from its
    packets' parameter sets (opened again only where they change), and the segments decode, end to end, to the
    input's own pictures."""
    from jetpipe.pipelines.outputs.recording.segments import parameter_sets
    from tests.pipelines.outputs.test_clips import _frame_md5s
    from tests.pipelines.outputs.test_clips import _ring_of as ring_of_file
    from tests.pipelines.outputs.test_clips import _video as clip_video

    video = clip_video(tmp_path / "in.mkv", codec)
    ts = tmp_path / "in.ts"
    subprocess.run(["ffmpeg", "-v", "error", "-i", str(video), "-c", "copy", str(ts)], check=True)
    whole = ring_of_file(ts)
    keys = [parameter_sets(g.packets[0].data, codec) for g in whole.gops]
    assert keys[0] and all(k == keys[0] for k in keys)  # the same parameter sets before every keyframe
    folder = tmp_path / "rec"
    recorder = Recorder(_config(folder), 5.0, 5.0, 64)
    source = _Source("no file: the packets say it all")
    recorder.attach(0, source, "all")
    source.packet_ring.annexb = codec
    _feed(source, [p for g in whole.gops for p in g.packets], whole.time_base)
    recording = recorder.streams[0]
    recorder.close()
    rows = _rows(folder)
    assert len(rows) == 3 and recording.template_key == keys[0]
    recorded = [md5 for path, *_ in rows for md5 in _frame_md5s(folder / path)]
    assert recorded == _frame_md5s(video)


def test_clips_and_snapshots_take_their_share_of_the_recordings_budget(det_bundle, tmp_path, capsys):
    """Counted in the same max_size: where their own size is not set, the clips get a tenth of it and the
    snapshots a twentieth, and the segments what is left; a share that leaves the recording too little is one
    line at start."""
    from jetpipe.cli import main
    from jetpipe.pipelines.config import load, media_reserve

    config = tmp_path / "serve.toml"
    body = (f"[pipeline]\nbundle = '{det_bundle}'\n[[source]]\nuri = 'synthetic'\n[record]\nfolder = '{tmp_path / 'r'}'"
            f"\nmax_size = '100MB'\n[clips]\nfolder = '{tmp_path / 'c'}'\n[snapshots]\nfolder = '{tmp_path / 's'}'\n")
    config.write_text(body)
    loaded = load(config)
    assert (loaded.clips.max_total_mb, loaded.snapshots.max_total_mb) == (10.0, 5.0)
    assert 84_000_000 <= loaded.record.max_size - media_reserve(loaded) <= 85_000_000
    config.write_text(body + "max_total_mb = 99\n")  # the snapshots' own
    assert main(["serve", str(config), "--metrics", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "leaves 0 B for the recording after the clips' and snapshots' max_total_mb" in err[0]


@needs_ffmpeg
def test_a_link_in_an_open_rows_place_is_neither_read_cut_nor_removed(tmp_path):
    """A killed run's open row whose file was swapped for a link (to a cut segment elsewhere): at the next start
    the row goes, and the link and what it points at stay as they were (before, repairing it failed on the link
    with a traceback)."""
    folder, elsewhere = tmp_path / "rec", tmp_path / "theirs.mp4"
    _, rows, _ = _recorded(tmp_path, 0, passes=1)
    whole = (folder / rows[0][0]).read_bytes()
    elsewhere.write_bytes(whole[:int(len(whole) * 0.7)])  # not ending at a whole fragment: a repair would cut it
    index = RecordIndex(folder)
    path = "stream0/2026-11-28/10-00-00.000.mp4"
    index.begin(0, "cam", path, 1000.0, 0.0)
    index.close()
    (folder / path).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(elsewhere, folder / path)
    index = RecordIndex(folder)
    done = index.repair()
    index.close()
    assert done["dropped"] == 1 and (folder / path).is_symlink()
    assert elsewhere.read_bytes() == whole[:int(len(whole) * 0.7)]
    assert path not in [r[0] for r in _rows(folder)]
