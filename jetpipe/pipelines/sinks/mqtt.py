"""`mqtt://HOST:PORT/TOPIC`: each record as JSON on a topic (QoS 0), through paho-mqtt."""

from __future__ import annotations

from urllib.parse import urlparse

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.sinks.base import SinkBase


class MqttSink(SinkBase):
    """Publishes each record as JSON to a topic (QoS 0) through paho-mqtt; reconnects by itself."""

    def __init__(self, uri: str, connect_timeout: float = 5.0):
        parsed = urlparse(uri)
        self.topic = parsed.path.lstrip("/") or "jetpipe/results"
        written = uri.split("://", 1)[-1].partition("/")[2]  # as written: urlparse cuts the topic at '#' and '?'
        if any(c in written for c in "+#?"):  # a publisher's topic names one topic
            raise JetpipeError(f"sink {uri}: the topic {written!r} holds a wildcard (+ or #) or a '?': name one "
                               "topic, e.g. mqtt://127.0.0.1:1883/site/door/results")
        try:
            import paho.mqtt.client as mqtt
        except ImportError:
            raise JetpipeError("sink mqtt:// needs paho-mqtt: pip install 'jetpipe[mqtt]'") from None
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

    def write(self, record) -> None:
        info = self.client.publish(self.topic, record.json(), qos=0)
        if info.rc != 0:
            raise JetpipeError(f"MQTT publish failed with code {info.rc}")

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()
