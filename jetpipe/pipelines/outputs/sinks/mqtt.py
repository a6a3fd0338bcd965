"""`mqtt://HOST:PORT/TOPIC`: each record as JSON, through paho-mqtt, at least once (QoS 1 and
delivery.QueuedSink). The frames' records go to TOPIC, each event to TOPIC/events/TYPE (line_cross,
zone_enter, ...), so that a subscriber takes the kinds it wants (`TOPIC/events/#`: all events).
"""

from __future__ import annotations

import threading
from urllib.parse import urlparse

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.outputs.sinks.base import client_module, port_of, sink_options
from jetpipe.pipelines.outputs.sinks.delivery import QueuedSink, Undelivered, delivery_options

OPTIONS = ("qos", "records", "queue", "drain")
ACK_TIMEOUT_S = 10.0  # a publish unacknowledged this long is sent again
CONNECT_WAIT_S = 2.0  # the first send waits this long for the connection made at start


def parse(spec: str) -> dict:
    """The sink's settings from its URI, without connecting (config checks call it before anything runs)."""
    parsed = urlparse(spec)
    written = spec.split("://", 1)[-1].partition("/")[2].split("?", 1)[0]  # urlparse cuts the topic at '#'
    if any(c in written for c in "+#"):  # a publisher's topic names one topic
        raise JetpipeError(f"sink {spec}: the topic {written!r} holds a wildcard (+ or #): name one topic, e.g. "
                           "mqtt://127.0.0.1:1883/site/door/results")
    _, options = sink_options(spec, OPTIONS)
    if options.get("qos", "1") not in ("0", "1"):
        raise JetpipeError(f"sink {spec}: qos={options['qos']!r}: 1 (acknowledged, at least once) or 0")
    port = port_of(parsed, spec, 1883)
    records, queue, drain = delivery_options(spec, options, records="all")
    return {"host": parsed.hostname or "127.0.0.1", "port": port, "topic": parsed.path.strip("/") or "jetpipe/results",
            "qos": int(options.get("qos", "1")), "records": records, "queue": queue, "drain": drain}


class MqttSink(QueuedSink):
    def __init__(self, spec: str):
        settings = parse(spec)
        mqtt = client_module("paho.mqtt.client", "mqtt", "paho-mqtt", "mqtt")
        super().__init__(settings["records"], settings["queue"], settings["drain"])
        self.host, self.port, self.topic, self.qos = (settings[k] for k in ("host", "port", "topic", "qos"))
        self.connected = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="", protocol=mqtt.MQTTv311)
        self.client.on_connect = lambda client, userdata, flags, reason, props: self.connected.set()
        self.client.on_disconnect = lambda client, userdata, flags, reason, props: self.connected.clear()
        self.client.reconnect_delay_set(min_delay=1, max_delay=10)
        self.client.connect_async(self.host, self.port, keepalive=30)  # paho's loop connects, and reconnects
        self.client.loop_start()
        self.start()

    def describe(self) -> str:
        return f"mqtt://{self.host}:{self.port}/{self.topic}"

    def topic_of(self, record) -> str:
        kind = record.type
        return self.topic if kind is None else f"{self.topic}/events/{kind}"

    def send(self, batch: list) -> None:
        if not self.connected.wait(CONNECT_WAIT_S):
            raise ConnectionError(f"not connected to the MQTT broker at {self.host}:{self.port}")
        published = [self.client.publish(self.topic_of(r), r.json(), qos=self.qos) for r in batch]
        for i, info in enumerate(published):
            if info.rc != 0:
                raise Undelivered(i, f"publish failed with code {info.rc}")
            info.wait_for_publish(ACK_TIMEOUT_S)  # QoS 1: until the broker's PUBACK
            if not info.is_published():
                raise Undelivered(i, "the broker did not acknowledge in time")

    def disconnect(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
