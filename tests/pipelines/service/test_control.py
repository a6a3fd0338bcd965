"""The control API: streams added to and removed from a running daemon (GET/POST/DELETE /streams), with a
real daemon (PP-OCRv4 det on ONNX Runtime's CPU backend) and real HTTP requests."""

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import av
import pytest

from jetpipe.pipelines.config import ClipsConfig, ConfigError, ControlConfig, PipelineConfig, SourceConfig, validate
from jetpipe.pipelines.service.daemon import Pipeline
from tests.support import free_port, wait_for

CAMERA = "synthetic://320x240@3/nv12"  # slow enough that the 2-core machine keeps up with four of them


def _request(base, method, path, body=None, token=None, headers=None):
    data = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
    request = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        request.add_header(key, value)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _json(base, method, path, body=None, token=None):
    status, text = _request(base, method, path, body, token)
    return status, json.loads(text)


class Serving:
    """A daemon in a thread with its control API; stop() drains it and returns its summary."""

    def __init__(self, bundle, sources, sinks=(), max_streams=4, listen_host="127.0.0.1", token="",
                 max_frame_hw=(1080, 1920), backend="onnxruntime-cpu", allow_schemes=(), allow_folders=(),
                 tracker="none", clips=""):
        port = free_port()
        control = ControlConfig(enabled=True, max_streams=max_streams, token=token)
        control.allow_schemes += list(allow_schemes)
        control.allow_folders = [str(f) for f in allow_folders]
        self.config = validate(PipelineConfig(
            bundle=bundle, sources=[SourceConfig(uri) for uri in sources], sinks=list(sinks),
            metrics_listen=f"{listen_host}:{port}", backend=backend, max_frame_hw=max_frame_hw, control=control,
            tracker=tracker, clips=ClipsConfig(folder=str(clips))))
        self.pipeline = Pipeline(self.config)
        self.base = f"http://127.0.0.1:{port}"
        self.summary = None
        self.runner = threading.Thread(target=self._run)
        self.runner.start()

    def _run(self):
        self.summary = self.pipeline.run()

    def processed(self, stream_id):
        status, stream = _json(self.base, "GET", f"/streams/{stream_id}")
        return stream["processed"] if status == 200 else -1

    def stop(self):
        self.pipeline.stop()
        self.runner.join(120)
        assert not self.runner.is_alive()
        return self.summary


@pytest.fixture
def serving(det_bundle):
    started = []

    def start(*args, **kwargs):
        started.append(Serving(det_bundle, *args, **kwargs))
        return started[-1]

    yield start
    for s in started:
        if s.runner.is_alive():
            s.stop()


def test_streams_added_and_removed_while_serving_lose_no_frame(serving, tmp_path):
    out = tmp_path / "results.jsonl"
    daemon = serving([CAMERA], sinks=[f"jsonl:{out}"])
    added = []
    for _ in range(3):
        status, stream = _json(daemon.base, "POST", "/streams", {"uri": CAMERA})
        assert status == 201 and stream["state"] == "running", stream
        added.append(stream["id"])
    assert added == [1, 2, 3]
    status, listing = _json(daemon.base, "GET", "/streams")
    assert status == 200 and listing["max_streams"] == 4 and [s["id"] for s in listing["streams"]] == [0, 1, 2, 3]
    assert wait_for(lambda: all(daemon.processed(i) >= 3 for i in added))
    status, metrics = _request(daemon.base, "GET", "/metrics")
    assert 'jetpipe_frames_processed_total{stream="3"}' in metrics
    removed = {}
    for stream_id in (1, 3):
        status, stream = _json(daemon.base, "DELETE", f"/streams/{stream_id}")
        assert status == 200 and stream["state"] == "removed", stream
        removed[stream_id] = stream
    status, listing = _json(daemon.base, "GET", "/streams")
    assert [s["id"] for s in listing["streams"]] == [0, 2]
    status, metrics = _request(daemon.base, "GET", "/metrics")
    assert 'stream="3"' not in metrics and 'jetpipe_frames_processed_total{stream="2"}' in metrics
    stats = json.loads(_request(daemon.base, "GET", "/stats.json")[1])
    assert [s["id"] for s in stats["streams"]] == [0, 2]
    time.sleep(1.0)  # the daemon runs on: nothing more may come from the removed streams
    summary = daemon.stop()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for stream_id, final in removed.items():
        frames = [r["frame"] for r in records if r["stream"] == stream_id]
        # every frame it captured was processed (or counted dropped / failed) and reached the sink
        assert final["processed"] == len(frames) > 0
        assert final["captured"] == final["processed"] + final["dropped"] + final["failed"]
        assert len(set(frames)) == len(frames)
        assert summary["processed"][stream_id] == final["processed"]
    assert [s["state"] for s in summary["streams"]] == ["running", "removed", "running", "removed"]
    assert summary["processed"] == [sum(r["stream"] == i for r in records) for i in range(4)]


def test_bad_specs_are_refused_with_the_reason_and_change_nothing(serving, tmp_path):
    daemon = serving([CAMERA], max_streams=2, allow_folders=[tmp_path])
    bad = [
        (b"{not json", 400, "not JSON"),
        ({"url": "synthetic"}, 400, "unknown key 'url'"),
        ({"loop": True}, 400, "uri is required"),
        ({"uri": CAMERA, "decoder": "vlc"}, 400, "decoder = 'vlc'"),
        ({"uri": CAMERA, "loop": "yes"}, 400, "expected true or false"),
        ({"uri": str(tmp_path / "missing.mp4")}, 422, "not found"),
        (["synthetic"], 400, "expected an object"),
        (b'{"uri": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "nests deeper than"),
        ({"uri": "nope://x"}, 400, "unknown scheme 'nope'"),
    ]
    for body, status, reason in bad:
        got, answer = _json(daemon.base, "POST", "/streams", body)
        assert got == status and reason in answer["error"], (body, got, answer)
    status, listing = _json(daemon.base, "GET", "/streams")
    assert [s["id"] for s in listing["streams"]] == [0]
    assert _request(daemon.base, "GET", "/streams/7")[0] == 404
    assert _request(daemon.base, "DELETE", "/streams/x")[0] == 404
    assert _request(daemon.base, "PUT", "/streams")[0] == 405  # PUT is for /rules/NAME
    assert _request(daemon.base, "PATCH", "/streams")[0] == 501  # http.server: no such method at all
    status, stream = _json(daemon.base, "POST", "/streams", {"uri": CAMERA})
    assert status == 201 and stream["id"] == 1  # the refusals took no ID and no slot


def test_capacity_is_fixed_at_start_and_a_freed_slot_is_reused_under_a_new_id(serving):
    daemon = serving([CAMERA], max_streams=2)
    assert _json(daemon.base, "POST", "/streams", {"uri": CAMERA})[0] == 201
    status, answer = _json(daemon.base, "POST", "/streams", {"uri": CAMERA})
    assert status == 409 and "all 2 stream slots are taken" in answer["error"]
    assert _json(daemon.base, "DELETE", "/streams/0")[0] == 200
    status, stream = _json(daemon.base, "POST", "/streams", {"uri": CAMERA})
    assert status == 201 and stream["id"] == 2  # IDs are never reused
    assert wait_for(lambda: daemon.processed(2) >= 2)
    status, gone = _json(daemon.base, "GET", "/streams/0")
    assert status == 200 and gone["state"] == "removed"
    assert _json(daemon.base, "DELETE", "/streams/0")[0] == 404


def test_a_frame_larger_than_the_free_slots_is_refused(serving):
    daemon = serving([CAMERA], max_streams=2, max_frame_hw=(240, 320))
    status, answer = _json(daemon.base, "POST", "/streams", {"uri": "synthetic://640x480@3/nv12"})
    assert status == 422 and "larger than max_frame_hw" in answer["error"]


def test_a_token_is_required_off_loopback_and_checked(serving, det_bundle, monkeypatch):
    monkeypatch.delenv("JETPIPE_CONTROL_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="needs a bearer token"):
        validate(PipelineConfig(bundle=det_bundle, sources=[SourceConfig(CAMERA)], metrics_listen="0.0.0.0:9999",
                                control=ControlConfig(enabled=True)))
    with pytest.raises(ConfigError, match="at least 16"):
        validate(PipelineConfig(bundle=det_bundle, sources=[SourceConfig(CAMERA)], metrics_listen="0.0.0.0:9999",
                                control=ControlConfig(enabled=True, token="short")))
    with pytest.raises(ConfigError, match="metrics server, which is off"):
        validate(PipelineConfig(bundle=det_bundle, sources=[SourceConfig(CAMERA)], metrics_listen="",
                                control=ControlConfig(enabled=True)))
    token = "0123456789abcdef0123"
    daemon = serving([CAMERA], listen_host="0.0.0.0", token=token)
    assert _request(daemon.base, "GET", "/streams")[0] == 401
    assert _request(daemon.base, "GET", "/streams", token="0123456789abcdef0124")[0] == 401
    assert _request(daemon.base, "POST", "/streams", {"uri": CAMERA})[0] == 401
    assert _json(daemon.base, "GET", "/streams")[1]["error"].startswith("the control API needs")
    assert _request(daemon.base, "GET", "/streams", token=token)[0] == 200
    for scheme in ("bearer", "BEARER"):  # HTTP's auth schemes are case-insensitive (RFC 9110)
        assert _request(daemon.base, "GET", "/streams", headers={"Authorization": f"{scheme} {token}"})[0] == 200
    assert _request(daemon.base, "GET", "/metrics")[0] == 200  # metrics stay as they were
    status, listing = _json(daemon.base, "GET", "/streams", token=token)
    assert len(listing["streams"]) == 1


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="the video sink needs ffmpeg: apt install ffmpeg")
def test_a_daemon_may_start_with_no_stream_and_a_removed_streams_video_is_finished_at_once(serving, tmp_path):
    video = tmp_path / "out.mp4"
    daemon = serving([], sinks=[f"video:{video}?fps=3"], max_streams=1)
    status, listing = _json(daemon.base, "GET", "/streams")
    assert status == 200 and listing["streams"] == []
    assert _json(daemon.base, "POST", "/streams", {"uri": CAMERA})[0] == 201
    assert wait_for(lambda: daemon.processed(0) >= 4)
    status, final = _json(daemon.base, "DELETE", "/streams/0")
    path = tmp_path / "out-s0.mp4"
    assert status == 200 and wait_for(lambda: _frames_in(path) > 0, timeout=60)  # playable while serving
    summary = daemon.stop()
    assert summary["processed"] == [final["processed"]] and summary["sink_failures"] == [0]


def _frames_in(path) -> int:
    try:
        with av.open(str(path)) as container:
            return sum(1 for _ in container.decode(video=0))
    except (OSError, av.FFmpegError):
        return 0


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium not installed (apt install chromium)")
def test_the_preview_page_follows_streams_as_they_come_and_go(serving, monkeypatch):
    """In a real headless browser: the page opened with stream 0; while it is open, stream 0 is removed and
    stream 1 added (at its first counters request); without a reload its figures follow."""
    from jetpipe.pipelines.outputs import preview

    daemon = serving([CAMERA], max_streams=2)
    changed, stats_json = [], preview.stats_json

    def change_once(*args):
        if not changed:
            changed.append(daemon.pipeline.remove_stream(0)[0])
            changed.append(daemon.pipeline.add_stream(SourceConfig(CAMERA))["id"])
        return stats_json(*args)

    monkeypatch.setattr(preview, "stats_json", change_once)
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                          "--dump-dom", daemon.base + "/"], capture_output=True, text=True, timeout=120).stdout
    assert changed == [200, 1]
    assert 'id="f1"' in dom and 'id="s1"' in dom and 'id="f0"' not in dom, dom[-1500:]
    assert f"1: {CAMERA}" in dom


@pytest.mark.gpu
def test_adding_streams_allocates_no_gpu_memory(serving):
    """On the GPU runtime: GPU memory free is the same before and after three streams are added and served
    (their rings were allocated at start-up; the first stream, unpaced, has filled every batch already)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu (CUDA execution provider) is not installed")
    daemon = serving(["synthetic://640x480@0/nv12"], backend="onnxruntime-cuda")
    runtime = daemon.pipeline.runtime
    assert runtime.backend_name == "onnxruntime-cuda"
    assert wait_for(lambda: daemon.processed(0) >= 100)
    before = runtime.gpu_free_memory()
    for _ in range(3):
        assert _json(daemon.base, "POST", "/streams", {"uri": "synthetic://1280x720@30/nv12"})[0] == 201
    assert wait_for(lambda: all(daemon.processed(i) >= 30 for i in (1, 2, 3)))
    after = runtime.gpu_free_memory()
    print(json.dumps({"gpu_free_before_mb": before / 2**20, "gpu_free_after_mb": after / 2**20}))
    assert after == before


def test_a_spare_slots_rings_take_a_stream_of_their_size_in_either_memory():
    """A stream added later goes to a spare slot's ring that holds its frames: a device ring (NVDEC's YUV, 2 bytes
    a pixel) made for max_frame_hw takes a stream that size (asked in bytes of a BGR frame, it was refused)."""
    from jetpipe.pipelines.ingest.streams import Streams
    from jetpipe.runtime.ring import FrameRing, slot_bytes

    def ring(hw, device):
        size = slot_bytes(hw, device)
        return FrameRing([bytearray(1)], [None], pinned=False, device=device, slot_bytes=size)

    streams = Streams(2)
    streams.choices = [[ring((1080, 1920), False), ring((1080, 1920), True)]] * 2
    for device in (False, True):
        slot, chosen = streams.ring_for((1080, 1920), device)
        assert chosen.device == device
        assert streams.ring_for((1088, 1920), device) is None  # one row taller does not fit
    assert streams.describe_free() == "device memory up to 2073600 pixels; host memory up to 2073600 pixels"
    # a stream whose format is known (a file) needs its frame's bytes: a 1080p host ring takes 1440p NV12
    assert streams.ring_for((1440, 1920), False) is None
    assert streams.ring_for((1440, 1920), False, "nv12") is not None


# --- what a caller the operator did not mean can reach (issue 49's attacks) -----------------------------------

def _gst_writing(path) -> str:
    """A gst: source that also writes a file: what a caller could run through the API before it was locked."""
    return (f"gst:videotestsrc num-buffers=30 ! video/x-raw,format=NV12,width=320,height=240,framerate=3/1 ! tee "
            f"name=t ! queue ! filesink location={path} t. ! queue ! video/x-raw,format=NV12,width=320,height=240")


@pytest.mark.skipif(shutil.which("gst-launch-1.0") is None, reason="gst-launch-1.0 not installed "
                    "(apt install gstreamer1.0-tools)")
def test_a_gst_pipeline_runs_through_the_api_only_where_the_operator_allows_it(serving, tmp_path):
    written = tmp_path / "written-by-a-caller"
    daemon = serving([CAMERA], max_streams=2)
    status, answer = _json(daemon.base, "POST", "/streams", {"uri": _gst_writing(written)})
    assert status == 403 and "--control-allow gst" in answer["error"], answer
    assert not written.exists() and len(_json(daemon.base, "GET", "/streams")[1]["streams"]) == 1
    allowed = serving([CAMERA], max_streams=2, allow_schemes=["gst"])
    status, stream = _json(allowed.base, "POST", "/streams", {"uri": _gst_writing(written)})
    assert status == 201, stream
    assert wait_for(lambda: allowed.processed(stream["id"]) >= 1)


def test_files_come_through_the_api_only_from_the_folders_allowed(serving, tmp_path):
    import cv2
    import numpy as np

    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    for folder in (allowed / "images", outside / "images"):
        folder.mkdir(parents=True)
        cv2.imwrite(str(folder / "a.png"), np.full((240, 320, 3), 128, np.uint8))
    (allowed / "link").symlink_to(outside / "images")
    closed = serving([CAMERA], max_streams=3)
    status, answer = _json(closed.base, "POST", "/streams", {"uri": str(allowed / "images")})
    assert status == 403 and "--control-folder" in answer["error"], answer
    daemon = serving([CAMERA], max_streams=3, allow_folders=[allowed])
    for uri in ("/etc/passwd", str(outside / "images"), str(allowed / "link"), str(allowed / ".." / "outside"),
                f"file://{outside / 'images'}"):
        status, answer = _json(daemon.base, "POST", "/streams", {"uri": uri})
        assert status == 403 and "only from" in answer["error"], (uri, answer)
    status, stream = _json(daemon.base, "POST", "/streams", {"uri": str(allowed / "images"), "loop": True})
    assert status == 201, stream
    assert [s["id"] for s in _json(daemon.base, "GET", "/streams")[1]["streams"]] == [0, stream["id"]]


def _raw(base, request: bytes) -> tuple[int, bytes]:
    """Send a request as bytes (headers a browser would send) and read the status and body."""
    import http.client

    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(request)
        reply = http.client.HTTPResponse(conn)
        reply.begin()
        return reply.status, reply.read()


def test_a_web_page_in_the_users_browser_cannot_reach_the_control_api(serving):
    daemon = serving([CAMERA], max_streams=3)
    port = daemon.base.rsplit(":", 1)[1]
    body = json.dumps({"uri": CAMERA}).encode()

    def post(*headers: str) -> int:
        head = "".join(f"{h}\r\n" for h in headers)
        return _raw(daemon.base, f"POST /streams HTTP/1.1\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode()
                    + body)[0]

    # a form or fetch() from any page: a simple request, text/plain, no preflight
    assert post(f"Host: 127.0.0.1:{port}", "Content-Type: text/plain", "Origin: http://evil.example") in (403, 415)
    assert post(f"Host: 127.0.0.1:{port}", "Content-Type: text/plain") == 415
    assert post(f"Host: 127.0.0.1:{port}", "Content-Type: application/json", "Origin: http://evil.example") == 403
    assert post(f"Host: 127.0.0.1:{port}", "Content-Type: application/json", "Origin: null") == 403
    assert post(f"Host: 127.0.0.1:{port}", "Content-Type: application/json", "Sec-Fetch-Site: cross-site") == 403
    # DNS rebinding: the page's own name resolved to 127.0.0.1; reads refused too (the preview, the streams)
    assert post(f"Host: evil.example:{port}", "Content-Type: application/json",
                f"Origin: http://evil.example:{port}") == 421
    for path in ("/streams", "/", "/metrics", "/stats.json"):
        assert _raw(daemon.base, f"GET {path} HTTP/1.1\r\nHost: evil.example:{port}\r\n\r\n".encode())[0] == 421
    assert len(_json(daemon.base, "GET", "/streams")[1]["streams"]) == 1  # nothing was added
    # the daemon's own page and tools: same origin, localhost, no Origin at all
    assert post(f"Host: 127.0.0.1:{port}", "Content-Type: application/json",
                f"Origin: http://127.0.0.1:{port}") == 201
    assert post(f"Host: localhost:{port}", "Content-Type: application/json; charset=utf-8") == 201
    assert _raw(daemon.base, f"GET /metrics HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n".encode())[0] == 200


def test_slow_and_vanishing_clients_hold_nothing_and_leave_no_traceback(serving, monkeypatch, capfd):
    import struct

    from jetpipe.pipelines.service.http import server

    monkeypatch.setattr(server, "REQUEST_TIMEOUT_S", 1.0)
    daemon = serving([CAMERA], max_streams=2)
    host, port = daemon.base.removeprefix("http://").split(":")
    head = (f"POST /streams HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            "Content-Length: 40\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=60) as slow:  # a body that never comes in full
        slow.sendall(head + b'{"uri"')
        assert slow.recv(100).startswith(b"HTTP/1.0 408")
    for _ in range(3):  # clients that leave mid-request (a reset, not a close)
        gone = socket.create_connection((host, int(port)), timeout=60)
        gone.sendall(head + b'{"uri"')
        gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        gone.close()
    assert _json(daemon.base, "POST", "/streams", {"uri": CAMERA})[0] == 201  # still answering
    daemon.stop()
    assert "Traceback" not in capfd.readouterr().err


def test_clients_trickling_their_headers_cannot_hold_the_few_handlers(serving, monkeypatch):
    """More slow clients than the server has handlers, each sending a header byte every 0.3 s (within the socket's
    timeout every time): each is cut when its request's time is up, and a caller after them is answered."""
    from jetpipe.pipelines.service.http import server

    monkeypatch.setattr(server, "REQUEST_TIMEOUT_S", 1.0)
    daemon = serving([CAMERA])
    host, port = daemon.base.removeprefix("http://").split(":")
    stop = threading.Event()

    def trickle():
        with socket.create_connection((host, int(port)), timeout=60) as slow:
            slow.sendall(b"GET /streams HTTP/1.1\r\nHost: " + host.encode())
            while not stop.is_set():
                try:
                    slow.sendall(b"x")
                except OSError:  # cut by the server: what is asked of it
                    return
                time.sleep(0.3)

    slow = [threading.Thread(target=trickle, daemon=True) for _ in range(server.MAX_HANDLERS + 2)]
    for thread in slow:
        thread.start()
    try:
        time.sleep(0.5)  # they hold every handler now
        assert _request(daemon.base, "GET", "/streams")[0] == 200
    finally:
        stop.set()
    daemon.stop()


# -- the rules (zones and lines) while serving -------------------------------------------------------------

def test_rules_added_changed_and_removed_while_serving_count_as_at_start_up(serving, tmp_path, panning_video):
    """A line POSTed before a file is added counts its crossings as --line would; PUT changes it, DELETE removes
    it, and its counts stay in the summary."""
    folder = tmp_path / "videos"
    folder.mkdir()
    shutil.copy(panning_video.path, folder / "panning.avi")
    out = tmp_path / "out.jsonl"
    daemon = serving([], sinks=[f"jsonl:{out}"], tracker="bytetrack", allow_folders=[folder])
    x = panning_video.x_line
    door = {"kind": "line", "name": "door", "points": [[x, 0], [x, 1]]}
    assert _json(daemon.base, "GET", "/rules") == (200, [])
    status, rule = _json(daemon.base, "POST", "/rules", door)
    assert status == 201 and rule["kind"] == "line" and rule["points"] == [[x, 0], [x, 1]] and rule["counts"] == {}
    assert rule["frames_each_side"] == 3 and rule["anchor"] == "bottom-center"  # the defaults, as in a table
    status, stream = _json(daemon.base, "POST", "/streams", {"uri": str(folder / "panning.avi")})
    assert status == 201
    assert wait_for(lambda: daemon.processed(stream["id"]) == panning_video.frames)
    # the events step decides a few batches' frames at once: their events follow within a fraction of a second
    assert wait_for(lambda: _json(daemon.base, "GET", "/rules/door")[1]["counts"] == {"out": panning_video.crossings})
    status, changed = _json(daemon.base, "PUT", "/rules/door", {**door, "cooldown_s": 2.5})
    assert status == 200 and changed["cooldown_s"] == 2.5 and changed["counts"] == {"out": panning_video.crossings}
    assert _json(daemon.base, "DELETE", "/rules/door") == (200, {"removed": "door"})
    assert _json(daemon.base, "GET", "/rules") == (200, [])
    status, again = _json(daemon.base, "POST", "/rules", door)  # a new rule under the old name counts from zero
    assert status == 201 and again["counts"] == {}
    summary = daemon.stop()
    assert summary["events"]["counts"] == {"door": {}}
    assert summary["events"]["removed"] == [{"rule": "door", "counts": {"out": panning_video.crossings}}]
    events = [json.loads(line) for line in out.read_text().splitlines() if "jetpipe.event/1" in line]
    assert len(events) == panning_video.crossings and {e["rule"] for e in events} == {"door"}


@pytest.mark.parametrize("method, path, body, status, message", [
    ("POST", "/rules", {"kind": "zone", "name": "z", "points": [[0.1, 0.1], [0.2, 0.2]]}, 400,
     "POST /rules: a zone needs at least 3 points"),
    ("POST", "/rules", {"kind": "line", "name": "l", "points": [[0.5, 0.5], [1.5, 0.5]]}, 400, "outside 0..1"),
    ("POST", "/rules", {"kind": "line", "name": "l", "points": [[0, 0], [1, 1]], "classes": ["unicorn"]}, 400,
     "unknown class 'unicorn'"),
    ("POST", "/rules", {"kind": "line", "name": "l", "points": [[0, 0], [1, 1]], "colour": "red"}, 400,
     "unknown key 'colour'"),
    ("POST", "/rules", {"name": "l", "points": [[0, 0], [1, 1]]}, 400, "send a zone or a line"),
    ("POST", "/rules", {"kind": "line", "name": "door", "points": [[0, 0], [1, 1]]}, 409,
     "a rule is named 'door' already"),
    ("PUT", "/rules/door", {"kind": "line", "name": "other", "points": [[0, 0], [1, 1]]}, 400, "keeps its name"),
    ("PUT", "/rules/door", {"kind": "line", "points": [[0, 0], [0, 0]]}, 400, "needs a length"),
    ("GET", "/rules/nothing", None, 404, "no such rule"),
    ("DELETE", "/rules/nothing", None, 404, "no such rule"),
    ("GET", "/rules/caf%C3", None, 400, "not UTF-8 once percent-decoded"),
    # numbers that parse but could never be right (issue 63: a huge one killed the request)
    ("POST", "/rules", {"kind": "line", "name": "l", "points": [[0, 0], [1, 1]], "streams": [10**30]}, 400,
     "stream IDs (0 to 999,999,999)"),
    ("POST", "/rules", {"kind": "line", "name": "l", "points": [[0, 0], [1, 1]], "classes": [10**30]}, 400,
     "class names or numbers (0 to 9,999)"),
    ("POST", "/rules", {"kind": "line", "name": "l", "points": [[0, 0], [1, 1]], "classes": [3]}, 400,
     "class 3 is not one of the model's: it has 1 class (0 to 0)"),
    ("POST", "/rules", {"kind": "line", "name": "l", "points": [[0, 0], [1e308, 5]], "units": "pixels"}, 400,
     "pixels from 0 to 65,536"),
    ("POST", "/rules", {"kind": "line", "name": "l", "points": [[0, 0], [10**400, 5]], "units": "pixels"}, 400,
     "finite numbers"),
    ("POST", "/rules", {"kind": "line", "name": "l", "points": [[0.5, 0.5], [0.5, 0.5 + 1e-9]]}, 400,
     "at least 0.001 (of the frame)"),
    ("POST", "/rules", {"kind": "zone", "name": "z", "points": [[0, 0], [1e-4, 0], [1e-4, 1e-4]]}, 400,
     "enclose no area"),
    ("POST", "/rules", {"kind": "line", "name": "l", "points": [[0, 0], [1, 1]], "speed_limit_kmh": 50}, 400,
     "no stream has a [[calibration]]"),
    ("POST", "/rules", {"kind": "line", "name": "l", "points": [[0, 0], [1, 1]], "speed_limit_kmh": 1e9}, 400,
     "speed_limit_kmh 1000000000.0: km/h from 0 (off) to 1000"),
])
def test_bad_rules_are_refused_with_the_reason_and_change_nothing(serving, method, path, body, status, message):
    daemon = serving([], tracker="bytetrack")
    door = {"kind": "line", "name": "door", "points": [[0.5, 0], [0.5, 1]]}
    assert _json(daemon.base, "POST", "/rules", door)[0] == 201
    got, answer = _json(daemon.base, method, path, body)
    assert got == status and message in answer["error"], answer
    status, listed = _json(daemon.base, "GET", "/rules")
    assert [(r["name"], r["points"], r["cooldown_s"]) for r in listed] == [("door", [[0.5, 0], [0.5, 1]], 1.0)]


def test_a_rule_named_beyond_ascii_is_found_by_its_percent_encoded_path(serving):
    daemon = serving([], tracker="bytetrack")
    cafe = {"kind": "line", "name": "café", "points": [[0.5, 0], [0.5, 1]]}
    status, rule = _json(daemon.base, "POST", "/rules", cafe)
    assert status == 201 and rule["name"] == "café"
    assert _json(daemon.base, "GET", "/rules/caf%C3%A9")[1]["name"] == "café"
    assert _json(daemon.base, "DELETE", "/rules/caf%C3%A9") == (200, {"removed": "café"})


def test_the_rules_a_stream_takes_are_capped(serving):
    from jetpipe.pipelines.core.events.rules import MAX_RULES_PER_STREAM

    daemon = serving([], tracker="bytetrack")
    for n in range(MAX_RULES_PER_STREAM):
        line = {"kind": "line", "name": f"l{n}", "points": [[0.5, 0], [0.5, 1]]}
        assert _json(daemon.base, "POST", "/rules", line)[0] == 201
    status, answer = _json(daemon.base, "POST", "/rules", {**line, "name": "one-more"})
    assert status == 409 and f"at most {MAX_RULES_PER_STREAM} a stream" in answer["error"]
    other = {**line, "name": "other-stream", "streams": [3]}  # every rule so far takes stream 3 too
    assert _json(daemon.base, "POST", "/rules", other)[0] == 409


def test_a_clip_of_a_stream_without_packets_yet_is_409_not_infinity():
    from jetpipe.pipelines.config import ClipsConfig
    from jetpipe.pipelines.ingest.packet_ring import PacketRing
    from jetpipe.pipelines.ingest.streams import ControlError
    from jetpipe.pipelines.outputs.clips.writer import Clips

    clips = Clips(ClipsConfig(folder="unused"), lambda record: None)
    try:
        clips.rings[4] = PacketRing(10.0, 1 << 20, "unused.mp4", None)
        with pytest.raises(ControlError, match="stream 4 has no packets yet") as caught:
            clips.around_now(4, {})
        assert caught.value.status == 409
    finally:
        clips.close()


@pytest.mark.parametrize("token, accepted", [("0123456789abcdef\n", "0123456789abcdef"), ("   ", None),
                                             ("01234567 89abcdef", None)])
def test_a_control_token_is_stripped_and_one_of_spaces_refused(det_bundle, token, accepted):
    config = PipelineConfig(bundle=det_bundle, sources=[SourceConfig(CAMERA)], metrics_listen="127.0.0.1:9108",
                            control=ControlConfig(enabled=True, token=token))
    if accepted is None:
        with pytest.raises(ConfigError, match="a bearer token is one word"):
            validate(config)
    else:
        assert validate(config).control.token == accepted


def test_a_thousand_callers_at_once_are_each_answered(serving):
    """1,000 concurrent POST, then DELETE, then GET /rules from loopback: every one gets its answer (the listen
    backlog of 5 reset 654 of them; each DELETE copied every rule twice under the events' lock: 166 waited more
    than 30 s). Where the server sheds, it answers 503 with Retry-After, never a reset."""
    import asyncio
    from collections import Counter

    daemon = serving([CAMERA], tracker="bytetrack")
    host, port = daemon.base.removeprefix("http://").split(":")

    async def ask(method: str, path: str, body) -> int | str:
        data = json.dumps(body).encode() if body is not None else b""
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            head = f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(data)}\r\n"
            writer.write((head + ("Content-Type: application/json\r\n" if data else "") + "\r\n").encode() + data)
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), 120)
            writer.close()
            return int(status.split()[1]) if status else "no answer"
        except (OSError, asyncio.TimeoutError) as exc:
            return type(exc).__name__

    async def flood(method: str, request) -> Counter:
        return Counter(await asyncio.gather(*(ask(method, *request(i)) for i in range(1000))))

    line = {"kind": "line", "points": [[0.5, 0], [0.5, 1]]}
    added = asyncio.run(flood("POST", lambda i: ("/rules", {**line, "name": f"r{i}", "streams": [i % 50]})))
    assert set(added) <= {201, 503} and added[201] >= 900, added
    removed = asyncio.run(flood("DELETE", lambda i: (f"/rules/r{i}", None)))
    assert set(removed) <= {200, 404, 503} and removed[200] == added[201], removed
    listed = asyncio.run(flood("GET", lambda i: ("/rules", None)))
    assert set(listed) <= {200, 503} and listed[200] >= 900, listed
    assert _json(daemon.base, "GET", "/rules") == (200, [])


def test_rules_need_a_tracker_and_the_token(serving, monkeypatch):
    untracked = serving([])
    status, answer = _json(untracked.base, "POST", "/rules", {"kind": "line", "name": "l", "points": [[0, 0], [1, 1]]})
    assert status == 409 and "--tracker botsort" in answer["error"]
    guarded = serving([], token="s3cret-s3cret-s3cret", tracker="bytetrack")
    status, _ = _json(guarded.base, "POST", "/rules", {"kind": "line", "name": "l", "points": [[0, 0], [1, 1]]})
    assert status == 401
    status, _ = _json(guarded.base, "GET", "/rules")
    assert status == 401


def test_a_clip_asked_through_the_control_api_covers_the_seconds_around_now(serving, tmp_path, panning_h264):
    """POST /streams/ID/clips: 202 at once, then a clip_ready record once the seconds after are in; the clip is
    the stream's own packets from a keyframe. Streams without packets, bad bodies and clips turned off: 4xx."""
    folder, clips, out = tmp_path / "videos", tmp_path / "clips", tmp_path / "out.jsonl"
    folder.mkdir()
    shutil.copy(panning_h264, folder / "panning.mp4")
    daemon = serving([CAMERA], sinks=[f"jsonl:{out}"], allow_folders=[folder], clips=clips)
    status, stream = _json(daemon.base, "POST", "/streams", {"uri": str(folder / "panning.mp4"), "loop": True,
                                                              "realtime": True})
    assert status == 201
    assert wait_for(lambda: daemon.processed(stream["id"]) >= 8)  # 4 s of the 2 fps file
    status, asked = _json(daemon.base, "POST", f"/streams/{stream['id']}/clips", {"before_s": 3, "after_s": 1})
    assert status == 202 and asked["end"] - asked["start"] == pytest.approx(4.0) and not asked["merged"]

    def ready():
        return [json.loads(line) for line in out.read_text().splitlines() if '"jetpipe.clip/1"' in line]
    assert wait_for(lambda: ready(), timeout=30)
    (clip,) = ready()
    assert clip["stream"] == stream["id"] and clip["events"] == [] and Path(clip["path"]).parent == clips
    # from the keyframe before the start (GOP: 2 s) to the last frame at or before the end (a frame: 0.5 s)
    assert asked["start"] - 2.0 - 1e-6 <= clip["start"] <= asked["start"] and clip["end"] >= asked["end"] - 0.51
    probe = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v", "-show_entries", "packet=flags", "-of",
                            "csv=p=0", clip["path"]], capture_output=True, text=True)
    assert probe.returncode == 0 and probe.stdout.splitlines()[0].startswith("K")
    for path, body, code, message in [
            ("/streams/0/clips", {}, 409, "stream 0 gives no compressed packets"),  # the synthetic camera
            (f"/streams/{stream['id']}/clips", {"before": 3}, 400, "send {\"before_s\": S, \"after_s\": S}"),
            (f"/streams/{stream['id']}/clips", {"after_s": 500}, 400, "after_s = 500: seconds from 0 to 300"),
            ("/streams/99/clips", {}, 404, "no stream 99")]:
        status, answer = _json(daemon.base, "POST", path, body)
        assert status == code and message in answer["error"], answer
    assert _request(daemon.base, "GET", f"/streams/{stream['id']}/clips")[0] == 405
    daemon.stop()
    plain = serving([CAMERA])
    status, answer = _json(plain.base, "POST", "/streams/0/clips", {})
    assert status == 409 and "clips are off" in answer["error"]


def test_a_stream_added_before_the_run_starts_is_read_by_one_capture_only(det_bundle, tmp_path):
    """The control API listens from start-up, before run() starts the captures: a stream added in between was
    started twice (by the add and again by the run), two readers on one source (a PyAV file's: a segfault in
    the suite); now once, its frames each read once, in order."""
    out = tmp_path / "out.jsonl"
    control = ControlConfig(enabled=True, max_streams=2)
    config = validate(PipelineConfig(bundle=det_bundle, sources=[], sinks=[f"jsonl:{out}"],
                                     metrics_listen=f"127.0.0.1:{free_port()}",
                                     backend="onnxruntime-cpu", frames=6, control=control))
    pipeline = Pipeline(config)
    added = pipeline.add_stream(SourceConfig("synthetic:64x48@30"))
    runner = threading.Thread(target=lambda: setattr(pipeline, "summary", pipeline.run()))
    runner.start()
    try:
        assert wait_for(lambda: pipeline.metrics.captured[0] >= 6)
    finally:
        pipeline.stop()
        runner.join(60)
    frames = [json.loads(line)["frame"] for line in out.read_text().splitlines()
              if json.loads(line)["stream"] == added["id"]]
    assert frames == sorted(set(frames)) and len(frames) == pipeline.summary["processed"][0] > 0
