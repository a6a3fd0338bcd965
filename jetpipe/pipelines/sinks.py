"""Result sinks: JSONL file, stdout, MQTT. A failing sink is counted and logged, never fatal."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from urllib.parse import urlparse

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.frame_sinks import open_frame_sink

log = logging.getLogger(__name__)


class JsonlSink:
    wants_frames = False  # records only (frame sinks: frame_sinks.py)

    def __init__(self, path: str):
        self.path = Path(path)
        if self.path.parent and not self.path.parent.exists():
            raise JetpipeError(f"sink jsonl:{path}: folder {self.path.parent} does not exist")
        try:
            self.file = open(self.path, "a", buffering=1)  # line-buffered: a crash loses at most a line
        except OSError as exc:
            raise JetpipeError(f"sink jsonl:{path}: cannot open it for writing ({exc.strerror}): "
                               "choose a writable path") from None

    def describe(self) -> str:
        return f"jsonl:{self.path}"

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self.file.flush()
        self.file.close()


class StdoutSink:
    wants_frames = False  # records only (frame sinks: frame_sinks.py)

    def describe(self) -> str:
        return "stdout"

    def write(self, record: dict) -> None:
        sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        sys.stdout.flush()


class MqttSink:
    """Publishes each record as JSON to a topic (QoS 0) through paho-mqtt; reconnects by itself."""

    wants_frames = False

    def __init__(self, uri: str, connect_timeout: float = 5.0):
        try:
            import paho.mqtt.client as mqtt
        except ImportError:
            raise JetpipeError("sink mqtt:// needs paho-mqtt: pip install 'jetpipe[mqtt]'") from None
        parsed = urlparse(uri)
        self.topic = parsed.path.lstrip("/") or "jetpipe/results"
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 1883
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="", protocol=mqtt.MQTTv311)
        try:
            self.client.connect(self.host, self.port, keepalive=30)
        except OSError as exc:
            raise JetpipeError(f"sink {uri}: cannot connect to the MQTT broker at {self.host}:{self.port} "
                               f"({exc}); is it running?") from exc
        self.client.loop_start()

    def describe(self) -> str:
        return f"mqtt://{self.host}:{self.port}/{self.topic}"

    def write(self, record: dict) -> None:
        info = self.client.publish(self.topic, json.dumps(record, separators=(",", ":")), qos=0)
        if info.rc != 0:
            raise JetpipeError(f"MQTT publish failed with code {info.rc}")

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def open_sink(uri: str, streams: int = 1, max_batch: int = 8):
    frames = open_frame_sink(uri, streams, max_batch)
    if frames is not None:
        return frames
    if uri == "stdout":
        return StdoutSink()
    if uri.startswith("jsonl:"):
        return JsonlSink(uri[len("jsonl:"):])
    if uri.startswith("mqtt://"):
        return MqttSink(uri)
    raise JetpipeError(f"sink {uri!r}: use jsonl:PATH, stdout, mqtt://HOST:PORT/TOPIC, video:FILE.mp4 or "
                       "jpeg:FOLDER")
