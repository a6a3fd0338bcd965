"""Result sinks: one JSON line per record, appended; bad sink specs are one line."""

import json
import re
import time

import numpy as np
import pytest

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.core.record import FrameRecord
from jetpipe.pipelines.outputs.sinks import SCHEMES, FrameSink, SinkBase, SinkFanout, open_sink
from jetpipe.runtime.api import Frame


def _record(stream: int, frame: int, results: dict | None = None) -> FrameRecord:
    return FrameRecord(stream, "synthetic", frame, None, 0.0, 0.0, {}, "raw", results or {})


def test_jsonl_appends_one_line_per_record(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"earlier": true}\n')
    sink = open_sink(f"jsonl:{path}?append=1")
    sink.write(_record(0, 1, {"boxes": [[1, 2, 3, 4]]}))
    sink.write(_record(1, 2, {}))
    sink.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [{"earlier": True}, _record(0, 1, {"boxes": [[1, 2, 3, 4]]}).as_dict(),
                     _record(1, 2, {}).as_dict()]


def test_stdout_sink_writes_json_lines(capsys):
    sink = open_sink("stdout")
    sink.write(_record(3, 0))
    sink.close()
    assert json.loads(capsys.readouterr().out) == _record(3, 0).as_dict()


def test_a_jsonl_sink_makes_its_file_or_adds_only_where_told_and_never_through_a_link(tmp_path):
    victim = tmp_path / "passwd"
    victim.write_text("root:x:0:0:root:/root:/bin/bash\n")
    (tmp_path / "link.jsonl").symlink_to(victim)
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "made-through-a-link")
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    (tmp_path / "earlier.jsonl").write_text('{"frame": 0}\n')
    refused = [
        ("link.jsonl", "is a symbolic link"),
        ("link.jsonl?append=1", "is a symbolic link"),
        ("dangling.jsonl", "is a symbolic link"),
        ("dangling.jsonl?append=1", "is a symbolic link"),
        ("other.csv", "is there already: name a new file, or add ?append=1"),
        ("other.csv?append=1", "does not hold JSON lines"),
        ("earlier.jsonl", "is there already"),
        (".", "is there already"),
        ("r.jsonl?append=yes", "append='yes': 1 (add to the file) or 0"),
        ("r.jsonl?apend=1", "unknown option 'apend'"),
    ]
    for name, message in refused:
        with pytest.raises(JetpipeError, match=re.escape(message)):
            open_sink(f"jsonl:{tmp_path / name}")
    assert victim.read_text() == "root:x:0:0:root:/root:/bin/bash\n"
    assert not (tmp_path / "made-through-a-link").exists() and not (tmp_path / "r.jsonl").exists()
    assert (tmp_path / "other.csv").read_text() == "a,b\n1,2\n"
    sink = open_sink(f"jsonl:{tmp_path / 'new.jsonl'}")
    sink.write(_record(0, 1))
    sink.close()
    assert json.loads((tmp_path / "new.jsonl").read_text())["frame"] == 1


def test_a_frame_sink_never_writes_through_a_link_planted_while_it_runs(tmp_path):
    """A jpeg: folder shared with others: a link in the name of the next frame is not written through; the frame
    is a counted failure of the sink."""
    from jetpipe.pipelines.outputs.sinks import JpegSink

    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    folder = tmp_path / "frames"
    folder.mkdir()
    sink = JpegSink(f"jpeg:{folder}")
    (folder / "s0_000001.jpg").symlink_to(victim)
    frame = Frame(np.zeros((48, 64, 3), np.uint8), "bgr")
    for i in range(3):
        assert sink.offer(0, frame, _record(0, i), wait=True)
    sink.close()
    assert victim.read_bytes() == b"precious" and sink.failures == 1
    assert sorted(p.name for p in folder.iterdir() if not p.is_symlink()) == ["s0_000000.jpg", "s0_000002.jpg"]


@pytest.mark.parametrize("spec, message", [
    ("ftp://x", "use jsonl:PATH[?append=1], stdout, mqtt://HOST:PORT/TOPIC, kafka://HOST:PORT/TOPIC, "
                "redis://HOST:PORT, http(s)://HOST/PATH, video:FILE.mp4, jpeg:FOLDER or rtsp://HOST:PORT/PATH"),
    ("jsonl:/nonexistent-folder/r.jsonl", "folder /nonexistent-folder does not exist"),
    ("mqtt://127.0.0.1:1/site/+/results", "the topic 'site/+/results' holds a wildcard"),
    ("mqtt://127.0.0.1:1/site/#", "holds a wildcard"),
])
def test_bad_sinks(spec, message):
    with pytest.raises(JetpipeError, match=re.escape(message)):
        open_sink(spec)


def test_metrics_exposition_is_prometheus_text_with_histograms_and_process_metrics():
    """Written by prometheus-client: parseable, per-stream counters, latency histograms, process metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    from jetpipe.pipelines.counters import StreamCounters

    metrics = StreamCounters(streams=2)
    metrics.count("captured", 1, 5)
    for total_ms in (8.0, 40.0, 300.0):
        metrics.record_result(1, {"queue": 1.0, "gpu": 2.0, "post": 3.0, "total": total_ms})
    samples = [x for f in text_string_to_metric_families(metrics.prometheus(([0, 2], [0, 1]), [1, 0], [0, 3]))
               for x in f.samples]
    value = lambda name, **labels: next(x.value for x in samples  # noqa: E731
                                        if x.name == name and x.labels == labels)
    assert value("jetpipe_frames_captured_total", stream="1") == 5
    assert value("jetpipe_frames_dropped_total", stream="1") == 2
    assert value("jetpipe_frames_dropped_catching_up_total", stream="1") == 1
    assert value("jetpipe_decode_errors_total", stream="1") == 3
    assert value("jetpipe_latency_seconds_count", stage="total") == 3
    assert value("jetpipe_latency_seconds_bucket", stage="total", le="0.05") == 2  # 8 and 40 ms
    assert value("process_resident_memory_bytes") > 0


class _SlowSink(FrameSink):
    """A frame sink whose drawing takes 50 ms a frame; records what it drew."""

    def __init__(self):
        super().__init__("slow", max_batch=1)  # 3 buffers
        self.drawn = []

    def consume(self, stream, frame, fmt, record):
        time.sleep(0.05)
        self.drawn.append(record.frame)


def test_a_files_frames_wait_for_a_busy_frame_sink_and_a_cameras_are_dropped():
    """Files deliver every frame to inference, and to frame sinks too (an annotated video of a file lost 3 of
    24 frames under load); a camera's frames are dropped when the sink is behind, never slowing inference."""
    frame = Frame(np.zeros((48, 64, 3), np.uint8), "bgr")
    for wait in (True, False):
        sink = _SlowSink()
        taken = [sink.offer(0, frame, _record(0, i), wait=wait) for i in range(10)]
        sink.close()
        if wait:
            assert all(taken) and sink.drawn == list(range(10)) and sink.dropped == 0
        else:
            assert sink.dropped == taken.count(False) > 0 and sink.drawn == [i for i, t in enumerate(taken) if t]


class _Broken(SinkBase):
    """A sink whose writes and close fail: a full disk, a broker gone."""

    def __init__(self):
        self.closed = 0

    def describe(self) -> str:
        return "broken"

    def write(self, record) -> None:
        raise OSError("no space left on device")

    def close(self) -> None:
        self.closed += 1
        raise OSError("still full")


def test_the_fanout_delivers_to_every_sink_and_counts_each_failure_once(tmp_path):
    broken, good = _Broken(), open_sink(f"jsonl:{tmp_path / 'r.jsonl'}")
    seen = []
    fanout = SinkFanout([broken, good], on_record=seen.append)
    for i in range(3):
        fanout.put(_record(0, i))
    fanout.finish()
    fanout.run()
    fanout.close()
    fanout.close()  # once only
    assert [r.frame for r in seen] == [0, 1, 2]
    assert [json.loads(line)["frame"] for line in (tmp_path / "r.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert fanout.failures() == [4, 0] and broken.closed == 1  # three writes and the close
    assert fanout.dropped() == [0, 0]


def test_every_sink_scheme_makes_a_sink_of_the_protocol(tmp_path):
    folder = tmp_path / "jpegs"
    folder.mkdir()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uris = {"jsonl": f"jsonl:{tmp_path / 'a.jsonl'}", "stdout": "stdout", "video": f"video:{tmp_path / 'v.mp4'}",
            "jpeg": f"jpeg:{folder}", "rtsp": f"rtsp://127.0.0.1:{port}/t"}
    # the brokers: against real servers in test_delivery
    assert set(SCHEMES) == {*uris, "mqtt", "kafka", "redis", "http", "https"}
    for scheme, uri in uris.items():
        try:
            sink = open_sink(uri)
        except JetpipeError as exc:  # the video sink needs an encoder, the rtsp sink gst-rtsp-server
            assert scheme in ("video", "rtsp"), exc
            continue
        for name in ("describe", "write", "fail", "end_stream", "close"):
            assert callable(getattr(sink, name)), (scheme, name)
        assert sink.failures == 0 and sink.dropped == 0
        assert sink.takes_frames is (scheme in ("video", "jpeg", "rtsp"))
        assert not sink.takes_frames or callable(sink.offer)
        sink.close()


def test_the_sinks_that_write_the_frames_json_make_its_tables_when_they_are_made(tmp_path):
    """The numbers' text tables (json_numbers, 2 MB, ~75 ms of Python) made at the first record instead held that
    sink's thread while the first frames came in: a sink that writes the frames' records makes them when it is
    made (a --gpus worker's link to the face too); a broker's sink that sends the events only does not."""
    from jetpipe.pipelines.outputs.sinks import JsonlSink, QueuedSink, StdoutSink
    from jetpipe.pipelines.service.gpus.channel import ForwardSink
    from jetpipe.tasks import json_numbers

    made = []
    for make in (lambda: JsonlSink(f"jsonl:{tmp_path / 'r.jsonl'}"), StdoutSink, lambda: QueuedSink("all", 10, 1.0),
                 lambda: ForwardSink(None, records=True), lambda: QueuedSink("events", 10, 1.0),
                 lambda: ForwardSink(None, records=False)):
        json_numbers._tables.clear()
        sink = make()
        made.append(sorted(json_numbers._tables))
        if isinstance(sink, JsonlSink):
            sink.close()
    assert made == [[1, 4]] * 4 + [[]] * 2
