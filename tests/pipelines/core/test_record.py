"""One record type: what the daemon writes is the same JSON, byte for byte, before and after the record became
a dataclass (tests/data/records_golden.jsonl, written by the code before it: c4f6dcc)."""

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
from jetpipe.pipelines.core.record import FrameRecord
from jetpipe.pipelines.service.daemon import Pipeline

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "records_golden.jsonl"
SOURCES = ["synthetic://320x240@0/nv12", "synthetic://640x480@0/yuyv"]
# the fields that depend on when a frame was taken and processed: masked, the rest compared byte for byte
_TIMES = re.compile(rb'"t_capture":[0-9.]+,"t_result":[0-9.]+,"latency_ms":\{[^}]*\}')


def masked(lines: list[bytes]) -> list[bytes]:
    """Each line with its times masked, in (stream, frame) order (batches interleave the streams as they come)."""
    out = [_TIMES.sub(b'"t_capture":0,"t_result":0,"latency_ms":{}', line) for line in lines]
    return sorted(out, key=lambda line: (json.loads(line)["stream"], json.loads(line)["frame"]))


def serve(bundle, sinks) -> dict:
    config = validate(PipelineConfig(bundle=bundle, sources=[SourceConfig(uri) for uri in SOURCES], sinks=sinks,
                                     frames=3, tracker="bytetrack", backend="onnxruntime-cpu", metrics_listen=""))
    return Pipeline(config).run()


def test_jsonl_and_mqtt_records_are_what_they_were_byte_for_byte(det_bundle_square, tmp_path, mosquitto):
    import paho.mqtt.client as mqtt

    received = []
    subscriber = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    subscriber.on_message = lambda client, userdata, msg: received.append(msg.payload)
    subscriber.on_subscribe = lambda *args: subscribed.append(1)
    subscribed = []
    subscriber.connect("127.0.0.1", mosquitto)
    subscriber.subscribe("jetpipe/golden", qos=0)
    subscriber.loop_start()
    deadline = time.monotonic() + 30
    while not subscribed and time.monotonic() < deadline:
        time.sleep(0.05)
    out = tmp_path / "records.jsonl"
    summary = serve(det_bundle_square, [f"jsonl:{out}", f"mqtt://127.0.0.1:{mosquitto}/jetpipe/golden"])
    while len(received) < sum(summary["processed"]) and time.monotonic() < deadline + 30:
        time.sleep(0.05)
    subscriber.loop_stop()
    golden = GOLDEN.read_bytes().splitlines()
    assert masked(out.read_bytes().splitlines()) == golden
    assert masked(received) == golden


def test_a_record_serializes_once_and_gives_its_results_as_arrays():
    record = FrameRecord(stream=2, source="rtsp://cam/1", frame=7, pts=0.233333, t_capture=1.5, t_result=1.75,
                         latency_ms={"total": 250.0}, task="detection",
                         detections={"boxes": [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], "scores": [0.9, 0.5],
                                     "classes": [0, 3], "track_ids": [4, None]})
    assert record.json() is record.json()
    assert json.loads(record.json()) == record.as_dict()
    assert list(record.as_dict()) == ["stream", "source", "frame", "pts", "t_capture", "t_result", "latency_ms",
                                      "task", "results"]
    found = record.detections
    assert found.xyxy.shape == (2, 4) and found.xyxy.dtype == np.float32
    assert found.confidence.tolist() == pytest.approx([0.9, 0.5]) and found.class_ids.tolist() == [0, 3]
    assert found.track_ids.tolist() == [4, -1]  # -1: no confirmed track
    empty = FrameRecord(0, "s", 0, None, 0.0, 0.0, {}, "classification", {"top": [[1, 0.5]]})
    assert empty.detections.xyxy.shape == (0, 4) and empty.detections.track_ids.shape == (0,)
