"""Clips around events: the stream's own packets kept in a ring and remuxed into MP4 (no decode, no encode),
checked with FFmpeg's own tools on H.264 and HEVC inputs, and through the daemon on the panning video."""

import json
import random
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from jetpipe.pipelines.ingest.packet_ring import Packet, PacketRing
from jetpipe.pipelines.outputs.clips.cut import open_template, write_clip
from tests.support import jetson_pipeline_in_software

needs_ffmpeg = pytest.mark.skipif(not (shutil.which("ffmpeg") and shutil.which("ffprobe")),
                                  reason="ffmpeg and ffprobe are not on PATH (apt-get install ffmpeg)")
GOP = 15  # frames of the test videos' groups of pictures (30 fps: half a second)


def _video(path: Path, codec: str) -> Path:
    """6 s of 30 fps 320x240 test pattern, a keyframe every GOP frames, with B-frames."""
    params = ["-c:v", "libx264", "-bf", "2"] if codec == "h264" else \
        ["-c:v", "libx265", "-x265-params", "log-level=error:bframes=2"]
    subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-f", "lavfi", "-i", "testsrc2=size=320x240:rate=30", "-t",
                    "6", *params, "-g", str(GOP), "-keyint_min", str(GOP), "-pix_fmt", "yuv420p", str(path)],
                   check=True)
    return path


def _packets(path: Path) -> list[dict]:
    """Each packet's pts (s), keyframe flag and MD5, in decode order, as ffprobe reads them."""
    done = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v", "-show_packets", "-show_data_hash", "md5",
                           "-show_entries", "packet=pts_time,flags,data_hash", "-of", "json", str(path)],
                          capture_output=True, text=True, check=True)
    return [{"t": float(p["pts_time"]), "key": p["flags"].startswith("K"), "md5": p["data_hash"]}
            for p in json.loads(done.stdout)["packets"]]


def _ring_of(path: Path, keep_s: float = 60.0, max_bytes: int = 1 << 30) -> PacketRing:
    """A ring fed as the in-process source feeds it: every demuxed packet, times from the stream's start."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        ring = PacketRing(keep_s, max_bytes, str(path), stream.time_base)
        start = stream.start_time or 0
        for p in container.demux(stream):
            if p.size:
                pts, dts = p.pts - start, None if p.dts is None else p.dts - start
                ring.add(Packet(float(pts * stream.time_base), bytes(p), pts, dts, p.duration or 0, p.is_keyframe))
    return ring


def _decoded_frames(path: Path) -> int:
    done = subprocess.run(["ffmpeg", "-v", "error", "-i", str(path), "-f", "framemd5", "-"], capture_output=True,
                          text=True)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr[-500:]
    return sum(1 for line in done.stdout.splitlines() if line and not line.startswith("#"))


@needs_ffmpeg
@pytest.mark.parametrize("codec, suffix", [("h264", "mp4"), ("hevc", "mkv")])
def test_a_clip_is_the_inputs_own_packets_from_a_keyframe_and_plays(tmp_path, codec, suffix):
    video = _video(tmp_path / f"in.{suffix}", codec)
    ring = _ring_of(video)
    start, end = 2.2, 3.5
    clip = tmp_path / "clip.mp4"
    write_clip(clip, open_template(ring), ring.time_base, ring.between(start, end))
    source, cut = _packets(video), _packets(clip)
    assert cut[0]["key"]  # it starts at a keyframe
    first = next(k for k, p in enumerate(source) if p["md5"] == cut[0]["md5"])
    assert [p["md5"] for p in source[first:first + len(cut)]] == [p["md5"] for p in cut]  # the bytes, unchanged
    shown = sorted(p["t"] for p in source[first:first + len(cut)])
    assert start - GOP / 30 - 1e-6 <= shown[0] <= start  # from the keyframe at or before the start (one GOP)
    assert end <= shown[-1] <= end + 3 / 30 + 1e-6      # to the end (B-frames: the P-frame they need)
    assert _decoded_frames(clip) == len(cut)
    with clip.open("rb") as f:
        assert b"moov" in f.read(64)  # faststart: its index first
    probe = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "stream=codec_name", "-of", "csv=p=0",
                            str(clip)], capture_output=True, text=True)
    assert probe.stdout.strip() == codec


def _frame_md5s(path: Path) -> list[str]:
    done = subprocess.run(["ffmpeg", "-v", "error", "-i", str(path), "-f", "framemd5", "-"], capture_output=True,
                          text=True, check=True)
    return [line.rsplit(",", 1)[1].strip() for line in done.stdout.splitlines() if line and not line.startswith("#")]


def _cut_decodes_to_the_sources_pictures(ring, source: Path, tmp_path) -> Path:
    """A clip of [2.2, 3.5] s cut from the ring: it starts at a keyframe, and its frames decode to the source's
    own pictures, in order (no re-encode: each frame's MD5 is the source's)."""
    clip = tmp_path / "clip.mp4"
    write_clip(clip, open_template(ring), ring.time_base, ring.between(2.2, 3.5))
    assert _packets(clip)[0]["key"]
    whole, cut = _frame_md5s(source), _frame_md5s(clip)
    first = whole.index(cut[0])
    assert cut == whole[first:first + len(cut)] and len(cut) >= round(1.3 * 30)
    return clip


@needs_ffmpeg
@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_a_clip_of_annex_b_packets_as_nvdec_demuxes_them_plays_its_frames(tmp_path, codec):
    """NVDEC's demuxer gives H.264 / HEVC in Annex B (start codes, parameter sets before each keyframe), as an
    MPEG-TS holds them: the clip takes its codec parameters from the packets and decodes to the input's own
    pictures (no re-encode: every decoded frame's MD5 is one of the input's, in order)."""
    video = _video(tmp_path / "in.mkv", codec)
    ts = tmp_path / "in.ts"
    subprocess.run(["ffmpeg", "-v", "error", "-i", str(video), "-c", "copy", str(ts)], check=True)
    ring = _ring_of(ts)
    ring.annexb, ring.template = codec, "no file: the packets say it all"
    assert ring.gops[0].packets[0].data[:4] in (b"\0\0\0\1", b"\0\0\1\x09")  # start codes: Annex B
    clip = _cut_decodes_to_the_sources_pictures(ring, video, tmp_path)
    probe = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "stream=codec_name", "-of", "csv=p=0",
                            str(clip)], capture_output=True, text=True)
    assert probe.stdout.strip() == codec


@needs_ffmpeg
@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_a_network_stream_an_ffmpeg_process_decodes_keeps_its_own_packets_for_clips(tmp_path, codec):
    """A camera's stream decoded by an ffmpeg process (no NVDEC: a CPU machine): the same ffmpeg copies its
    packets to a second pipe, and the ring holds exactly the stream's packets (MD5s, all 180), on the frames' clock,
    from a keyframe; a clip cut from them decodes to the stream's own pictures."""
    import hashlib

    import numpy as np

    from jetpipe import uri as uris
    from jetpipe.frames import frame_shape
    from jetpipe.pipelines.ingest.sources import FFmpegSource, SourceError
    from tests.stream_server import StreamServer

    ts = tmp_path / "camera.ts"
    subprocess.run(["ffmpeg", "-v", "error", "-i", str(_video(tmp_path / "in.mkv", codec)), "-c", "copy", str(ts)],
                   check=True)
    camera = StreamServer(ts.read_bytes(), once=True)
    source = FFmpegSource(uris.parse(camera.url))
    source.packet_ring = PacketRing(60.0, 1 << 30, camera.url, None)
    try:
        info = source.open()
        slot = np.empty(frame_shape(info.format, info.height, info.width), np.uint8)
        frames = []
        with pytest.raises(SourceError, match="stream ended"):
            while True:
                frames.append(source.read_into(slot))
    finally:
        source.close()
        camera.unplug()
    ring = source.packet_ring
    kept = [p for gop in ring.gops for p in gop.packets]
    assert ring.annexb == codec and kept[0].key and len(kept) == len(frames) == 180
    # the stream's packets as PyAV demuxes the camera's bytes from the file (ffprobe's FFmpeg splits HEVC's by a
    # byte otherwise where its version differs)
    assert [hashlib.md5(p.data).digest() for p in kept] == [hashlib.md5(p.data).digest()
                                                            for gop in _ring_of(ts).gops for p in gop.packets]
    assert sorted(p.t for p in kept) == pytest.approx(frames, abs=1e-3)  # frame k at k / 30 s (MKV: ms)
    _cut_decodes_to_the_sources_pictures(ring, ts, tmp_path)


def test_a_ring_whose_clock_goes_back_starts_again():
    """NVDEC's looped file starts its times again; what was kept of the last pass goes (its times would mix)."""
    ring = PacketRing(10.0, 1 << 20, "x", None)
    for k in range(60):
        ring.add(Packet(k / 10, b"x" * 10, k, k, 1, k % 10 == 0))
    ring.add(Packet(0.0, b"y" * 10, 0, 0, 1, True))
    assert [p.data for gop in ring.gops for p in gop.packets] == [b"y" * 10] and ring.newest == 0.0


def test_the_rings_cpu_time_is_sampled_from_every_place_of_a_gop():
    """One packet in eight is timed (a thread-clock read costs a fifth of keeping one), drawn at random: every
    8th call would time the same places of a 30-packet GOP each time (the even ones) and never the others."""
    random.seed(66)
    ring = PacketRing(10.0, 1 << 20, "x", None)
    timed = [ring.clock() is not None for _ in range(30 * 2000)]
    assert 0.11 < sum(timed) / len(timed) < 0.14
    by_place = [sum(timed[k::30]) for k in range(30)]
    assert min(by_place) > 150  # about 250 each


@needs_ffmpeg
def test_the_ring_keeps_its_seconds_from_a_keyframe_and_its_bytes(tmp_path):
    video = _video(tmp_path / "in.mp4", "h264")
    ring = _ring_of(video, keep_s=2.0)
    kept = [p for gop in ring.gops for p in gop.packets]
    assert kept[0].key and ring.gops[0].start <= ring.newest - 2.0 < ring.gops[1].start  # 2 s and the GOP before
    assert ring.bytes == sum(len(p.data) for p in kept)
    small = _ring_of(video, keep_s=60.0, max_bytes=ring.bytes // 2)
    assert small.bytes <= ring.bytes // 2 and small.trimmed_for_room > 0 and small.gops[0].packets[0].key
    assert small.between(0.0, small.newest)[0].t == small.gops[0].start  # asked before what it holds: its oldest
    assert small.between(0.0, small.gops[0].start - 0.1) == []  # nothing it holds


@needs_ffmpeg
def test_a_clip_never_overwrites_nor_writes_through_a_link(tmp_path):
    ring = _ring_of(_video(tmp_path / "in.mp4", "h264"))
    packets, template = ring.between(1.0, 2.0), open_template(ring)
    mine = tmp_path / "mine.mp4"
    mine.write_bytes(b"not a clip")
    with pytest.raises(FileExistsError):
        write_clip(mine, template, ring.time_base, packets)
    (tmp_path / "dangling.mp4").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError):
        write_clip(tmp_path / "dangling.mp4", template, ring.time_base, packets)
    (tmp_path / ".link.mp4.part").symlink_to(mine)  # a link where the clip's temporary file goes
    with pytest.raises(FileExistsError):
        write_clip(tmp_path / "link.mp4", template, ring.time_base, packets)
    assert mine.read_bytes() == b"not a clip" and not (tmp_path / "link.mp4").exists()
    assert not (tmp_path / "nowhere").exists()
    assert (tmp_path / ".link.mp4.part").is_symlink()  # refused, and left where it was: it is not the clip's


# --- through the daemon -------------------------------------------------------------------------------------

def _serve_argv(tmp_path, argv: list[str]):
    """`jetpipe serve ARGV` with a jsonl sink and a summary: its records and its summary."""
    from jetpipe.cli import main

    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    assert main(["serve", *argv, "--metrics", "", "--sink", f"jsonl:{out}", "--summary", str(summary)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()], json.loads(summary.read_text())["summary"]


def _serve(det_bundle, tmp_path, source: Path, extra: list[str]):
    return _serve_argv(tmp_path, ["--bundle", str(det_bundle), "--source", str(source), *extra])


@needs_ffmpeg
def test_events_get_clips_around_them_with_a_record_each(det_bundle, tmp_path, panning_video, panning_h264):
    """Each crossing of the door asks for [t - 4, t + 2]; requests that overlap become one clip; each clip plays,
    starts at a keyframe, covers its events' asked times within a GOP at the start, and is announced by a
    clip_ready record naming its events."""
    clips = tmp_path / "clips"
    x = panning_video.x_line
    records, summary = _serve(det_bundle, tmp_path, panning_h264, ["--line", f"door:{x},0,{x},1", "--clips", str(clips),
                                                                  "--clip-before", "4", "--clip-after", "2"])
    events = {r["event_id"]: r for r in records if r.get("schema") == "jetpipe.event/1"}
    ready = [r for r in records if r.get("schema") == "jetpipe.clip/1"]
    assert len(events) == panning_video.crossings >= 2 and ready
    assert sorted(e for r in ready for e in r["events"]) == sorted(events)  # every event in exactly one clip
    counts = {k: summary["clips"][k] for k in ("written", "failed", "waiting")}
    assert counts == {"written": len(ready), "failed": 0, "waiting": 0}
    assert 0 < summary["clips"]["cpu_s"] < summary["cpu_seconds"]["process"]
    # 40 packets kept cost a few hundred microseconds, which the summary's milliseconds may round to 0.0 (CI saw
    # it); cutting four clips costs milliseconds
    assert summary["clips"]["rings_s"] >= 0 and summary["clips"]["cutting_s"] > 0
    assert summary["clips"]["cpu_s"] == pytest.approx(summary["clips"]["rings_s"] + summary["clips"]["cutting_s"],
                                                      abs=2e-3)
    last_frame = (panning_video.frames - 1) / 2
    for record in ready:
        assert record["type"] == "clip_ready" and Path(record["path"]).parent == clips
        packets = _packets(Path(record["path"]))
        assert packets[0]["key"] and len(packets) == record["packets"] == _decoded_frames(Path(record["path"]))
        asked = [events[e]["pts"] for e in record["events"]]
        assert max(0.0, min(asked) - 4) - 2.0 <= record["start"] <= max(0.0, min(asked) - 4)  # GOP: 4 frames, 2 s
        assert record["end"] == pytest.approx(min(max(asked) + 2, last_frame), abs=0.51)  # within a frame (2 fps)
        assert record["asked"] == [pytest.approx(min(asked) - 4), pytest.approx(max(asked) + 2)]
    assert sorted(p.name for p in clips.iterdir()) == sorted(Path(r["path"]).name for r in ready)  # no temp left


@needs_ffmpeg
def test_a_cameras_events_get_clips_where_an_ffmpeg_process_decodes_it(det_bundle, tmp_path, panning_video,
                                                                        panning_h264):
    """The panning video from a network camera (MPEG-TS over TCP), decoded by an ffmpeg process as on a machine
    without NVDEC: its events get clips of its own packets, each playing from a keyframe, announced by a
    clip_ready record (before, such a stream had no clips: its frames came decoded)."""
    from tests.pipelines.ingest.test_sources import as_mpegts
    from tests.stream_server import StreamServer

    camera = StreamServer(as_mpegts(panning_h264, tmp_path / "camera.ts").read_bytes(), once=True)
    clips, x, config = tmp_path / "clips", 0.8, tmp_path / "serve.toml"
    # the camera sends its 20 s at once (a real one sends them in real time): a queue that holds them all, so that
    # no frame (and no crossing) is shed, and clips long enough that the ring keeps the whole stream meanwhile
    config.write_text(f"[pipeline]\nbundle = '{det_bundle}'\nqueue_depth = 64\n[[source]]\nuri = '{camera.url}'\n")
    try:
        records, summary = _serve_argv(tmp_path, [
            str(config), "--frames", "40", "--line", f"door:{x},0,{x},1", "--clips", str(clips), "--clip-before", "4",
            "--clip-after", "16"])
    finally:
        camera.unplug()
    events = {r["event_id"]: r for r in records if r.get("schema") == "jetpipe.event/1"}
    ready = [r for r in records if r.get("schema") == "jetpipe.clip/1"]
    assert summary["processed"] == [40] and len(events) == panning_video.crossings and ready
    assert summary["clips"]["failed"] == 0 and sorted(e for r in ready for e in r["events"]) == sorted(events)
    for record in ready:
        packets = _packets(Path(record["path"]))
        assert packets[0]["key"] and len(packets) == record["packets"] == _decoded_frames(Path(record["path"]))
        asked = [events[e]["pts"] for e in record["events"]]
        assert max(0.0, min(asked) - 4) - 2.0 <= record["start"] <= max(0.0, min(asked) - 4)  # GOP: 2 s


def test_clip_options_are_checked_before_anything_runs(det_bundle, tmp_path, capsys, panning_h264):
    from jetpipe.cli import main

    afile = tmp_path / "a-file"
    afile.write_text("")
    base = ["serve", "--bundle", str(det_bundle), "--source", "synthetic", "--metrics", ""]
    for extra, message in ([["--clips", str(afile / "sub")], "cannot make it"],
                           [["--clips", str(afile)], "is not a folder this user can write"],
                           [["--clip-before", "3"], "add --clips DIR"],
                           [["--clips", str(tmp_path / "c"), "--clip-after", "301"],
                            "clips after_s = 301.0: from 0 to 300"]):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    config = tmp_path / "serve.toml"
    config.write_text(f'[pipeline]\nbundle = "{det_bundle}"\n[[source]]\nuri = "synthetic"\n'
                      f'[clips]\nfolder = "{tmp_path / "c"}"\non = ["line_cross", "door_opened"]\n')
    assert main(["serve", str(config), "--metrics", ""]) == 2
    assert "clips on = ['line_cross', 'door_opened']: event types from" in capsys.readouterr().err
    config.write_text(f'[pipeline]\nbundle = "{det_bundle}"\n[[source]]\nuri = "{panning_h264}"\n'
                      f'[clips]\nfolder = "{tmp_path / "c"}"\nbefore_s = 300\nafter_s = 300\nring_mb = 1\n')
    assert main(["serve", str(config), "--metrics", ""]) == 2  # the ring would not hold 10 minutes of it
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "s of its packets, more than ring_mb = 1: raise ring_mb" in err[0], err


def test_the_folder_keeps_its_size_and_only_clips_go(tmp_path):
    """Retention: room is made before a clip is written, the oldest clips going until the next fits within
    max_total_mb; a file the clips did not name stays."""
    import os
    import time
    from types import SimpleNamespace

    from jetpipe.pipelines.outputs.clips.writer import Clips

    config = SimpleNamespace(folder=str(tmp_path), before_s=1.0, after_s=1.0, on=["line_cross"], ring_mb=8.0,
                             max_total_mb=0.25, max_age_h=0.0)
    clips = Clips(config, lambda record: None)
    try:
        theirs = tmp_path / "stream-notes.mp4"
        theirs.write_bytes(b"x" * 200_000)
        now = time.time()
        for k in range(4):
            clip = tmp_path / f"stream0-{k:011.3f}-{k + 1}.mp4"
            clip.write_bytes(b"c" * 100_000)
            os.utime(clip, (now - 100 + k, now - 100 + k))
        clips.room.make(40_000)  # a clip of 40 kB to come: 2 x 100 kB + 40 kB fit in 250 kB, 3 do not
        assert sorted(p.name for p in tmp_path.iterdir()) == ["stream-notes.mp4", "stream0-0000002.000-3.mp4",
                                                              "stream0-0000003.000-4.mp4"]
        clips.room.wrote(40_000)
        clips.room.make(100_000)  # the running total says it does not fit: the oldest goes, without a new write
        assert sorted(p.name for p in tmp_path.iterdir()) == ["stream-notes.mp4", "stream0-0000003.000-4.mp4"]
    finally:
        clips.close()


def test_requests_that_overlap_make_one_clip_up_to_a_minute(tmp_path):
    from types import SimpleNamespace

    from jetpipe.pipelines.outputs.clips.writer import MAX_MERGED_S, Clips

    config = SimpleNamespace(folder=str(tmp_path), before_s=5.0, after_s=5.0, on=["line_cross"], ring_mb=8.0,
                             max_total_mb=100.0, max_age_h=0.0)
    clips = Clips(config, lambda record: None)
    try:
        clips.rings[0] = PacketRing(20.0, 1 << 20, "unused", None)  # holds nothing yet: the requests wait
        assert not clips.request(0, 10.0, 20.0, "a")["merged"]
        assert clips.request(0, 15.0, 25.0, "b") == {"stream": 0, "start": 10.0, "end": 25.0, "merged": True}
        assert not clips.request(1, 15.0, 25.0, "c")["merged"]  # another stream
        assert not clips.request(0, 24.0, 10.0 + MAX_MERGED_S + 1, "d")["merged"]  # the merged clip would be too long
        assert [(r.stream, r.start, r.end, r.events) for r in clips.pending][:1] == [(0, 10.0, 25.0, ["a", "b"])]
        assert clips.rings[0].pins  # what the waiting clips start with is kept
    finally:
        clips.close()


@needs_ffmpeg
@pytest.mark.parametrize("form", ["container", "annexb"])
def test_a_looped_streams_waiting_clip_is_cut_from_the_pass_that_ended_by_the_clips_thread(tmp_path, monkeypatch,
                                                                                            form):
    """NVDEC's looped file starts its times again at each pass: a clip waiting for later packets of the pass that
    ended takes what the ring holds before the ring starts again (it loses all of it), and the clips' thread cuts
    it, never the source's (its frames would wait for the file). Annex B packets (NVDEC's): the clip's codec
    parameters come from its own packets, the ring holding none of that pass any more."""
    import threading
    import time
    from types import SimpleNamespace

    import av

    from jetpipe.pipelines.outputs.clips import writer
    from jetpipe.pipelines.outputs.clips.writer import Clips

    video = _video(tmp_path / "in.mp4", "h264")
    if form == "annexb":
        video_ts = tmp_path / "in.ts"
        subprocess.run(["ffmpeg", "-v", "error", "-i", str(video), "-c", "copy", str(video_ts)], check=True)
        video = video_ts
    cut_by = []
    monkeypatch.setattr(writer, "write_clip", lambda *args: (cut_by.append(threading.current_thread().name),
                                                             write_clip(*args)))
    delivered = []
    config = SimpleNamespace(folder=str(tmp_path / "clips"), before_s=1.0, after_s=1.0, on=["line_cross"],
                             ring_mb=8.0, max_total_mb=100.0, max_age_h=0.0)
    (tmp_path / "clips").mkdir()
    source = SimpleNamespace(keeps_packets=True, packet_ring=None, info=SimpleNamespace(fps=30.0), bit_rate=0.0,
                             source_uri=SimpleNamespace(location=str(video)), describe=lambda: str(video))
    clips = Clips(config, delivered.append)
    try:
        clips.attach(0, source)
        ring = source.packet_ring
        with av.open(str(video)) as container:
            stream = container.streams.video[0]
            ring.time_base = base = stream.time_base  # read while open: a closed container's stream is gone
            begin = stream.start_time or 0
            packets = [(float((p.pts - begin) * base), bytes(p), p.pts - begin, p.dts - begin, p.duration or 0,
                        p.is_keyframe) for p in container.demux(stream) if p.size]
        if form == "annexb":
            ring.annexb, ring.template = "h264", "no file: the packets say it all"
        for p in packets:
            ring.add(Packet(*p))
        clips.request(0, 4.0, 9.0, "a")  # its end is beyond the pass: it waits
        assert not delivered and clips.pending
        ring.add(Packet(0.0, *packets[0][1:]))  # the next pass
        deadline = time.monotonic() + 30
        while not delivered and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [r.events for r in delivered] == [["a"]] and not clips.pending and cut_by == ["clips"]
        assert delivered[0].end == pytest.approx(6.0 - 1 / 30, abs=0.05)  # the pass's last frame
        assert _packets(Path(delivered[0].path))[0]["key"]
        assert _decoded_frames(Path(delivered[0].path)) == delivered[0].packets
    finally:
        clips.close()


@needs_ffmpeg
def test_a_jetsons_gstreamer_pipeline_keeps_its_packets_for_clips(tmp_path, monkeypatch):
    """A file decoded by the GStreamer pipeline built for a Jetson (parsebin ! nvv4l2decoder ! nvvidconv, here
    with a software decoder in nvv4l2decoder's place: no Jetson on hand): a tee after parsebin sends the packets,
    as MPEG-TS, to the tap's pipe; the ring holds them on the frames' clock, and a clip cut from them decodes to
    the file's own pictures (the parameter sets before every keyframe)."""
    import numpy as np

    from jetpipe import uri as uris
    from jetpipe.frames import frame_shape
    from jetpipe.pipelines.ingest.sources import EndOfStream, gstreamer
    from jetpipe.pipelines.ingest.sources.ffmpeg import probe

    jetson_pipeline_in_software(monkeypatch)
    video = _video(tmp_path / "in.mp4", "h264")
    uri = uris.parse(str(video))
    stream = probe(uri)
    source = gstreamer.GstSource(uri, info=stream.frame_info(), codec=stream.codec)
    source.info = source.pipeline_info = replace(source.info, format="nv12")
    source.packet_ring = PacketRing(60.0, 1 << 30, str(video), None)
    frames = []
    try:
        info = source.open()
        assert "tee name=packets" in " ".join(source._process.argv)
        slot = np.empty(frame_shape(info.format, info.height, info.width), np.uint8)
        with pytest.raises(EndOfStream):
            while True:
                frames.append(source.read_into(slot))
    finally:
        source.close()
    ring = source.packet_ring
    kept = [p for gop in ring.gops for p in gop.packets]
    assert ring.annexb == "h264" and kept[0].key and len(kept) == len(frames) == 180
    assert sorted(p.t for p in kept) == pytest.approx(frames, abs=1e-3)
    _cut_decodes_to_the_sources_pictures(ring, video, tmp_path)


@needs_ffmpeg
def test_a_decode_processs_packets_reach_the_serving_processs_ring_and_cut_to_the_files_pictures(tmp_path):
    """NVDEC decoding in a decode process (--decode-processes): the Annex B packets its demuxer reads are kept there
    (a PacketBatch in the ring's place, as NvdecSource keeps them), sent a round at a time as its lanes send them,
    ahead of its records in the round's one message, and added by the serving process's link to the ring the clips
    writer gave the stream; a clip cut from that ring decodes to the file's own pictures. Before, such a stream had
    no clips. (The decoding needs a GPU: test_clips_gpu runs the whole path.)"""
    from types import SimpleNamespace

    from jetpipe import uri as uris
    from jetpipe.pipelines.ingest.decode_procs import RemoteNvdecSource, _Remote, keep_packets
    from jetpipe.pipelines.outputs.clips.writer import Clips
    from jetpipe.runtime.nvdec_procs import RECORD, TAG_FRAMES, TAG_PACKETS, PacketBatch, read_round, round_message
    from jetpipe.video import FrameInfo

    video = _video(tmp_path / "in.mkv", "h264")
    ts = tmp_path / "in.ts"
    subprocess.run(["ffmpeg", "-v", "error", "-i", str(video), "-c", "copy", str(ts)], check=True)
    demuxed = _ring_of(ts)
    config = SimpleNamespace(folder=str(tmp_path / "clips"), before_s=4.0, after_s=1.0, on=["line_cross"],
                             ring_mb=8.0, max_total_mb=100.0, max_age_h=0.0)  # the ring keeps the clip's 2.2 s on
    (tmp_path / "clips").mkdir()
    source = RemoteNvdecSource(uris.parse(str(ts)), False, False, FrameInfo("nv12", 240, 320, fps=30.0), 7, 0)
    clips = Clips(config, lambda record: None)
    try:
        clips.attach(0, source)
        assert source.packet_ring is not None and source.bit_rate > 0
        batch, remotes = PacketBatch(), {7: _Remote(source, 0)}
        batch.time_base, batch.annexb = demuxed.time_base, "h264"  # as NvdecSource sets them at its first packet
        packets = [p for gop in demuxed.gops for p in gop.packets]
        for k in range(0, len(packets), 3):  # a lane's round: a frame's packets of each of its streams
            for packet in packets[k:k + 3]:
                batch.add(packet)
            records = [RECORD.pack(7, k + 1, k / 30, 0), RECORD.pack(7, k + 2, (k + 1) / 30, 0)]
            message = round_message([(7, *batch.take())], records)
            assert message[:1] == TAG_PACKETS and batch.take() is None
            batches, records_read = read_round(memoryview(message))
            assert bytes(records_read) == b"".join(records)  # the frames' records follow their packets
            keep_packets(remotes, batches)
        assert round_message([], records) == TAG_FRAMES + b"".join(records)  # a round with no packets kept
        ring = source.packet_ring
        ring.template = "no file: the packets say it all"
        kept = [p.data for g in ring.gops for p in g.packets]  # the last seconds (keep_s), from a keyframe
        assert ring.annexb == "h264" and ring.gops[0].packets[0].key and kept == [p.data for p in packets][-len(kept):]
        _cut_decodes_to_the_sources_pictures(ring, video, tmp_path)
    finally:
        clips.close()


def test_each_codec_a_clip_is_cut_from_has_a_gstreamer_parser():
    """The packet tap takes H.264 and HEVC (Annex B); a Jetson's GStreamer tap and the encoders parse each."""
    from jetpipe.pipelines.ingest.sources import gstreamer, packet_tap

    assert set(gstreamer.PARSERS) == set(packet_tap.ANNEXB_CODECS)
