"""The review API and page over a real run's recording: who may read (token, signed media URLs, no other site),
no path from a request, byte ranges, and the page in headless Chromium playing a clip and seeking a recording."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from jetpipe.pipelines.service.http.review import Review
from jetpipe.pipelines.service.http.server import MetricsServer
from tests.browser import CHROMIUM

TOKEN = "review-token-0123456789abcdef"
needs_ffmpeg = pytest.mark.skipif(not (shutil.which("ffmpeg") and shutil.which("ffprobe")),
                                  reason="ffmpeg and ffprobe are not on PATH (apt-get install ffmpeg)")


@pytest.fixture(scope="module")
def recorded(det_bundle, panning_video, panning_h264, tmp_path_factory):
    """A run of the panning video with a line, clips, snapshots and --record (4-s segments): its folders and
    its events."""
    from jetpipe.cli import main

    top = tmp_path_factory.mktemp("review")
    folders = {name: top / name for name in ("rec", "clips", "shots")}
    config, out = top / "serve.toml", top / "out.jsonl"
    config.write_text(f"[pipeline]\nbundle = '{det_bundle}'\n[[source]]\nuri = '{panning_h264}'\n"
                      f"[record]\nfolder = '{folders['rec']}'\nsegment_s = 4\n")
    x = panning_video.x_line
    assert main(["serve", str(config), "--metrics", "", "--line", f"door:{x},0,{x},1", "--clips", str(folders["clips"]),
                 "--clip-before", "2", "--clip-after", "2", "--snapshots", str(folders["shots"]), "--sink",
                 f"jsonl:{out}"]) == 0
    events = [r for r in map(json.loads, out.read_text().splitlines()) if r.get("schema") == "jetpipe.event/1"]
    assert len(events) >= 2
    return folders, events


def _server(folders, token: str):
    review = Review(folders["rec"], token, folders["clips"], folders["shots"])
    server = MetricsServer("127.0.0.1:0", lambda: "", lambda: (True, "ok"), review=review)
    return server, f"http://{server.address}"


def _get(url: str, headers: dict | None = None):
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@needs_ffmpeg
def test_the_api_reads_only_with_the_token_or_a_signed_url_and_never_takes_a_path(recorded, tmp_path):
    folders, events = recorded
    server, base = _server(folders, TOKEN)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    try:
        assert _get(f"{base}/review/api/events")[0] == 401
        assert _get(f"{base}/review/api/events", {"Authorization": "Bearer wrong-token-0123456789"})[0] == 401
        status, _, body = _get(f"{base}/review/api/events", bearer)
        listed = json.loads(body)["events"]
        assert status == 200 and sorted(e["id"] for e in listed) == sorted(e["event_id"] for e in events)
        assert all(e["snapshot"] and e["recording"] for e in listed) and any(e["clip"] for e in listed)
        # a media URL the API gave plays without a header (a <video> sends none); altered, it does not
        clip = next(e["clip"] for e in listed if e["clip"])
        status, headers, body = _get(base + clip)
        assert status == 200 and headers["Content-Type"] == "video/mp4" and body[4:8] == b"ftyp"
        assert _get(base + clip.replace("/clip/", "/snapshot/"))[0] in (401, 404)
        assert _get(base + clip.split("?")[0])[0] == 401
        expired = clip.replace("exp=", "exp=1").replace("&sig=", "&sig=0")
        assert _get(base + expired)[0] == 401
        # byte ranges: a browser's <video> seeks with them
        status, headers, body = _get(base + clip, {"Range": "bytes=0-99"})
        assert status == 206 and len(body) == 100 and headers["Content-Range"].startswith("bytes 0-99/")
        assert _get(base + clip, {"Range": "bytes=999999999-"})[0] == 416
        # no parameter is a path: traversal in each is refused or means nothing
        for target in ("/review/media/segment/..%2f..%2fetc%2fpasswd", "/review/media/../../etc/passwd",
                       "/review/media/segment/1/../../../etc/passwd", "/review/api/events?stream=../../etc",
                       "/review/api/events?from=../../etc/passwd", "/review/api/recordings?stream=0&to=%2fetc",
                       "/review/api/events?path=/etc/passwd", "/review/export?stream=0&from=0&to=/etc/passwd",
                       "/review/api/events?limit=99999", "/review/api/events?stream=1&stream=2"):
            status, _, body = _get(base + target, bearer)
            assert status in (400, 404), (target, status)
            assert b"root:" not in body
        assert json.loads(_get(f"{base}/review/api/events?rule=..%2f..%2fetc", bearer)[2])["events"] == []
        # a web page in the user's browser cannot embed them
        assert _get(base + clip, {"Sec-Fetch-Site": "cross-site"})[0] == 403
        assert _get(f"{base}/review/api/streams", {**bearer, "Sec-Fetch-Site": "cross-site"})[0] == 403
    finally:
        server.close()


@needs_ffmpeg
def test_a_media_row_whose_file_became_a_link_out_of_its_folder_is_not_served(recorded, tmp_path):
    import sqlite3

    folders, _ = recorded
    copy = {name: tmp_path / name for name in folders}
    for name, folder in folders.items():
        shutil.copytree(folder, copy[name])
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0")
    with sqlite3.connect(copy["rec"] / "index.sqlite3") as db:  # the folders' copies, each file a link to it
        for rowid, path in db.execute("SELECT rowid, path FROM media WHERE kind = 'snapshot'").fetchall():
            evil = str(copy["shots"] / f"evil{rowid}.jpg")
            db.execute("UPDATE media SET path = ? WHERE rowid = ?", (evil, rowid))
            db.execute("UPDATE media_events SET path = ? WHERE path = ?", (evil, path))
            os.symlink(secret, evil)
        for path, in db.execute("SELECT path FROM segments").fetchall():
            (copy["rec"] / path).unlink()
            os.symlink(secret, copy["rec"] / path)
    server, base = _server(copy, "")
    try:
        listed = json.loads(_get(f"{base}/review/api/events")[2])["events"]
        urls = {e["snapshot"] for e in listed} | {e["recording"]["url"] for e in listed}
        assert len(urls) >= 3
        for url in urls:
            status, _, body = _get(base + url)
            assert status == 404 and b"root:" not in body, url
    finally:
        server.close()


@needs_ffmpeg
def test_an_index_made_before_the_media_events_table_still_finds_each_events_clip_and_snapshot(recorded, tmp_path):
    """The events list finds an event's media by the event (not a scan of every media row's list); an index
    written before that table (or by a jetpipe that did not fill it) gets it at its next opening."""
    import sqlite3

    from jetpipe.pipelines.outputs.recording.index import RecordIndex

    folders, _ = recorded
    copy = {name: tmp_path / name for name in folders}
    for name, folder in folders.items():
        shutil.copytree(folder, copy[name])
    server, base = _server(copy, "")
    try:
        before = json.loads(_get(f"{base}/review/api/events")[2])["events"]
    finally:
        server.close()
    assert sum(e["clip"] is not None for e in before) >= 2 and sum(e["snapshot"] is not None for e in before) >= 2
    with sqlite3.connect(copy["rec"] / "index.sqlite3") as db:
        db.execute("DROP TABLE media_events")
    RecordIndex(copy["rec"]).close()  # what the next run's opening does
    server, base = _server(copy, "")
    try:
        after = json.loads(_get(f"{base}/review/api/events")[2])["events"]
    finally:
        server.close()
    kinds = lambda events: [(e["id"], e["clip"] is not None, e["snapshot"] is not None) for e in events]  # noqa: E731
    assert kinds(after) == kinds(before)


@needs_ffmpeg
def test_an_export_over_http_is_one_mp4_of_the_range(recorded):
    folders, _ = recorded
    server, base = _server(folders, TOKEN)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    try:
        streams = json.loads(_get(f"{base}/review/api/streams", bearer)[2])["streams"]
        first, last = streams[0]["first"], streams[0]["last"]
        recordings = json.loads(_get(f"{base}/review/api/recordings?stream=0&from={first}&to={last}", bearer)[2])
        status, headers, body = _get(base + recordings["export"])  # signed: a link a person can click
        assert status == 200 and body[4:8] == b"ftyp" and "attachment" in headers["Content-Disposition"]
        assert _get(f"{base}/review/export?stream=0&from={first}&to={first + 7200}", bearer)[0] == 400
    finally:
        server.close()


@needs_ffmpeg
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt install chromium)")
def test_the_review_page_lists_the_events_shows_thumbnails_plays_a_clip_and_seeks_a_recording(recorded, tmp_path):
    pytest.importorskip("websocket", reason="websocket-client is not installed (pip install websocket-client)")
    from tests.browser import Browser

    folders, events = recorded
    server, base = _server(folders, "")
    browser = Browser(tmp_path / "profile")
    try:
        browser.open(f"{base}/review")
        listed = browser.wait_for("document.querySelectorAll('#events li').length")
        assert listed == len(events)
        assert browser.wait_for("[...document.querySelectorAll('#events img')].every(i => i.complete && "
                                "i.naturalWidth > 0)")
        # the timeline: the recorded stretch, the events on it (the file was read faster than real time: its events'
        # capture times bunch near the recording's end, some past it)
        assert browser.wait_for("document.querySelectorAll('#timeline .lane .rec').length") >= 1
        assert browser.wait_for("document.querySelectorAll('#timeline .lane .ev').length") >= 1
        # keyboard: j selects the first event, Enter plays its clip
        browser.run("document.dispatchEvent(new KeyboardEvent('keydown', {key: 'j'}))")
        assert browser.run("document.querySelector('#events li.on').dataset.n") == "0"
        browser.run("document.querySelector('#events li.on').click()")
        browser.wait_for("(() => { const v = document.getElementById('player'); return v.src.includes('/clip/') && "
                         "v.readyState >= 2 && !v.paused; })()")
        # the recording around it: r, then a seek within the segment; currentTime goes on from there
        browser.run("document.dispatchEvent(new KeyboardEvent('keydown', {key: 'r'}))")
        browser.wait_for("(() => { const v = document.getElementById('player'); return v.src.includes('/segment/') "
                         "&& v.readyState >= 2; })()")
        # paused first: from a few seconds before an event near a segment's end the player may already have gone
        # on to the next segment, whose duration is not known until its metadata came (NaN: CI saw it)
        browser.run("document.getElementById('player').pause()")
        browser.wait_for("(() => { const v = document.getElementById('player'); return v.src.includes('/segment/') "
                         "&& v.readyState >= 2 && isFinite(v.duration) && v.paused; })()")
        seeked = browser.run("(() => { const v = document.getElementById('player'); "
                             "const to = Math.max(0, Math.min(v.duration - 1.0, 2.0)); v.currentTime = to; "
                             "return new Promise(r => v.addEventListener('seeked', () => r([to, v.currentTime]), "
                             "{once: true})); })()")
        assert seeked[1] == pytest.approx(seeked[0], abs=0.6)
        browser.run("document.getElementById('player').play()")
        assert browser.wait_for(f"document.getElementById('player').currentTime > {seeked[1] + 0.3}")
        assert browser.run("document.getElementById('player').error") is None
    finally:
        browser.close()
        server.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_ffmpeg
def test_a_serving_run_answers_the_review_api_and_refuses_without_the_token(tiny_bundle, tmp_path, panning_h264):
    folder, port = tmp_path / "rec", _free_port()
    config = tmp_path / "serve.toml"
    config.write_text(f"[pipeline]\nbundle = '{tiny_bundle}'\n[[source]]\nuri = '{panning_h264}'\nloop = true\n"
                      f"realtime = true\n[record]\nfolder = '{folder}'\nsegment_s = 2\n")
    env = {**os.environ, "JETPIPE_CONTROL_TOKEN": TOKEN}
    run = subprocess.Popen([sys.executable, "-m", "jetpipe", "serve", str(config), "--metrics", f"127.0.0.1:{port}"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                           cwd=Path(__file__).parents[3])
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                status, _, body = _get(f"{base}/review/api/streams", {"Authorization": f"Bearer {TOKEN}"})
            except (urllib.error.URLError, ConnectionError):
                status, body = 0, b""
            if status == 200 and json.loads(body)["streams"]:
                break
            assert time.monotonic() < deadline and run.poll() is None, "no segment listed"
            time.sleep(0.2)
        assert _get(f"{base}/review/api/streams")[0] == 401
        assert _get(f"{base}/review")[0] == 200  # the page itself holds nothing; it asks for the token
        assert _get(f"{base}/healthz")[2] == b"ok\n"
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=60)
