"""Result sinks: JSONL file, stdout, MQTT. A failing sink is counted and logged, never fatal."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from jetpipe.errors import JetpipeError
from jetpipe.pipelines import sink_files
from jetpipe.pipelines.frame_sinks import open_frame_sink

log = logging.getLogger(__name__)


class JsonlSink:
    """One JSON line per record. `jsonl:PATH` creates PATH (refused where it exists); `jsonl:PATH?append=1` adds
    to a JSONL file (created when missing). Never through a symbolic link (sink_files)."""

    wants_frames = False  # records only (frame sinks: frame_sinks.py)

    def __init__(self, spec: str):
        text, _, query = spec[len("jsonl:"):].partition("?")
        options = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        unknown = sorted(set(options) - {"append"})
        if unknown:
            raise JetpipeError(f"sink {spec}: unknown option {unknown[0]!r}; this sink takes append=1")
        if options.get("append", "0") not in ("0", "1"):
            raise JetpipeError(f"sink {spec}: append={options['append']!r}: 1 (add to the file) or 0")
        self.path, self.spec = Path(text), spec
        if not text:
            raise JetpipeError(f"sink {spec}: name the file, e.g. jsonl:results.jsonl")
        if self.path.parent and not self.path.parent.exists():
            raise JetpipeError(f"sink {spec}: folder {self.path.parent} does not exist")
        if options.get("append") == "1":
            fd = sink_files.open_append(self.path, spec)
            _check_jsonl(fd, spec)
        else:
            fd = sink_files.create(self.path, spec, hint="name a new file, or add ?append=1 to add to it")
        self.file = os.fdopen(fd, "a", buffering=1, encoding="utf-8")  # line-buffered: a crash loses a line

    def describe(self) -> str:
        return f"jsonl:{self.path}"

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self.file.flush()
        self.file.close()


def _check_jsonl(fd: int, spec: str) -> None:
    """A file appended to must hold JSON lines already (or nothing): it starts with a JSON object."""
    head = os.pread(fd, 4096, 0).lstrip()
    if head and not head.startswith(b"{"):
        os.close(fd)
        raise JetpipeError(f"sink {spec}: the file does not hold JSON lines: name a new file, or a JSONL file "
                           "to add to")


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
        return JsonlSink(uri)
    if uri.startswith("mqtt://"):
        return MqttSink(uri)
    raise JetpipeError(f"sink {uri!r}: use jsonl:PATH[?append=1], stdout, mqtt://HOST:PORT/TOPIC, video:FILE.mp4 or "
                       "jpeg:FOLDER")
