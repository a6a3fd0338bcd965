"""Every broker sink comes back from an outage with everything it queued: the broker frozen (SIGSTOP) for 5, 15
and 30 s, or killed and started again (empty) after 3 and 15 s. Each record written while it was away stays in
the sink's bounded queue and arrives once the broker answers (at least once), counted as sent, none lost. Each
broker's five outages run at once, each against a server of its own (a test takes the longest outage, not the
sum). The Kafka sink used to fail every send after an outage of more than its message timeout (10 s), for good:
its idempotent producer was fenced by the broker, and only a fatal error made a new one."""

from __future__ import annotations

import json
import threading
import time

import pytest

from jetpipe.pipelines.outputs.sinks import KafkaSink, MqttSink, RedisSink
from tests.pipelines.conftest import kafka_process, mosquitto_server, redis_process
from tests.pipelines.outputs.test_delivery import _consume, _event, _redis_ids
from tests.support import wait_for

OUTAGES = [("pause", 5.0), ("pause", 15.0), ("pause", 30.0), ("restart", 3.0), ("restart", 15.0)]
WRITTEN = 10  # records written while the broker is away (the queue's bound is far above)
BACK_S = 120.0  # after the broker is back, its queue is delivered within this (a loaded 2-core machine)


class MqttReader:
    """A persistent subscriber (clean session off, QoS 1): what the broker holds for it while it is away (a
    restart) reaches it when it connects again."""

    def __init__(self, port: int, topic: str, name: str):
        import paho.mqtt.client as mqtt

        self.ids: set[str] = set()
        self.subscribed = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=name, clean_session=False,
                                  protocol=mqtt.MQTTv311)
        self.client.on_connect = lambda c, u, f, r, p: c.subscribe(f"{topic}/#", qos=1)
        self.client.on_subscribe = lambda *args: self.subscribed.set()
        self.client.on_message = lambda c, u, m: self.ids.add(json.loads(m.payload)["event_id"])
        self.client.reconnect_delay_set(min_delay=1, max_delay=2)
        self.client.connect("127.0.0.1", port, keepalive=60)
        self.client.loop_start()
        assert self.subscribed.wait(30), "the subscriber did not subscribe"

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _kafka(server, n, folder):
    sink = KafkaSink(f"kafka://127.0.0.1:{server.port}/events?drain=60")
    return sink, lambda: {v["event_id"] for _, v in _consume(server.port, "events", WRITTEN + 1, timeout=30)}, None


def _redis(server, n, folder):
    sink = RedisSink(f"redis://127.0.0.1:{server.port}/0?drain=60")
    return sink, lambda: set(_redis_ids(server.port)), None


def _mqtt(server, n, folder):
    reader = MqttReader(server.port, "site", f"jetpipe-outage-{n}")
    wait_for(lambda: (folder / "mosquitto.db").exists(), 30, "mosquitto to save the subscriber's session")
    sink = MqttSink(f"mqtt://127.0.0.1:{server.port}/site?drain=60")
    return sink, lambda: set(reader.ids), reader.close


BROKERS = {"kafka": (kafka_process, _kafka), "redis": (redis_process, _redis), "mqtt": (mosquitto_server, _mqtt)}


def _through_outage(server, kind: str, seconds: float, opened) -> None:
    sink, received, finish = opened
    try:
        sink.write(_event(0))
        wait_for(lambda: sink.sent == 1, 60, "the first record, before the outage")
        server.pause() if kind == "pause" else server.stop()
        away = [_event(n) for n in range(1, WRITTEN + 1)]
        for event in away:
            sink.write(event)  # never blocks: queued
        time.sleep(seconds)  # the outage itself: the broker is away this long
        server.resume() if kind == "pause" else server.start()
        wait_for(lambda: sink.queued() == 0, BACK_S, f"the queue to drain after a {kind} of {seconds:g} s")
        sink.close()
        assert sink.lost == 0 and sink.sent >= WRITTEN + 1, sink.delivery()
        wait_for(lambda: {e.event_id for e in away} <= received(), 60, f"every record at the broker ({kind})")
    finally:
        if finish is not None:
            finish()


@pytest.mark.parametrize("broker", sorted(BROKERS))
def test_every_record_queued_in_an_outage_arrives_when_the_broker_is_back(broker, tmp_path):
    start, open_sink = BROKERS[broker]
    runs, errors = [], {}
    try:
        for n, (kind, seconds) in enumerate(OUTAGES):
            folder = tmp_path / f"outage{n}"
            folder.mkdir()
            server = start(folder) if broker == "mqtt" else start()
            runs.append((server, kind, seconds, open_sink(server, n, folder)))

        def run(server, kind, seconds, opened):
            try:
                _through_outage(server, kind, seconds, opened)
            except BaseException as exc:  # noqa: BLE001 - said for its outage below
                errors[f"{kind} {seconds:g} s"] = exc

        threads = [threading.Thread(target=run, args=r) for r in runs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for server, *_ in runs:
            server.stop()
    assert not errors, "; ".join(f"{outage}: {type(exc).__name__}: {exc}" for outage, exc in errors.items())
