"""Events delivered where other systems listen, each against the real server: Redis Streams (Debian's
redis-server), a Kafka-protocol broker (tansu), a web hook (an HTTP server of the test's), MQTT (mosquitto).
At least once from a bounded queue: a broker that goes away is counted and reconnected, never stalls the
frames, and what could not be delivered is counted, not silently lost."""

import http.server
import json
import threading
import time

import pytest

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.core.events.record import EventRecord
from jetpipe.pipelines.outputs.sinks import KafkaSink, RedisSink, WebhookSink, check_sink
from tests.support import wait_for


def _event(n: int, stream: int = 0, type_: str = "line_cross") -> EventRecord:
    return EventRecord(type_, "door", stream, n, n / 10, 1.7e9 + n, n, "person", 0, 0.9, [1.0, 2.0, 3.0, 4.0],
                       {"direction": "in"}, {"in": n + 1})


def _redis_ids(port: int, key: str = "jetpipe:events") -> list[str]:
    import redis

    client = redis.Redis(port=port)
    try:
        return [json.loads(fields[b"json"])["event_id"] for _, fields in client.xrange(key)]
    finally:
        client.close()


# -- the URIs, checked before anything opens -----------------------------------------------------------------

@pytest.mark.parametrize("uri, message", [
    ("kafka://127.0.0.1:9092/", "the topic ''"),
    ("kafka://127.0.0.1:9092/a b", "the topic 'a b'"),
    ("kafka://127.0.0.1:99999/t", "name the brokers as HOST:PORT"),
    ("kafka://127.0.0.1:9092/t?acks=0", "unknown option 'acks'"),
    ("redis://127.0.0.1:6379/events", "the path names the database"),
    ("redis://127.0.0.1:6379?maxlen=0", "maxlen='0'"),
    ("redis://127.0.0.1:6379?queue=0", "queue='0': allowed int from 1"),
    ("redis://127.0.0.1:6379?records=frames", "records='frames'"),
    ("redis://127.0.0.1:port", "the port is not a number"),
    ("http://user:secret@127.0.0.1/hook", "credentials in the URL"),
    ("http:///hook", "name the host"),
    ("https://127.0.0.1/hook?timeout=0", "timeout='0'"),
    ("https://127.0.0.1/hook?token_env=JETPIPE_TEST_NO_SUCH_VARIABLE", "that environment variable is not set"),
    ("mqtt://127.0.0.1:1883/site/+/results", "holds a wildcard"),
    ("mqtt://127.0.0.1:1883/site?qos=2", "qos='2'"),
])
def test_broker_uris_are_checked_without_connecting(uri, message):
    with pytest.raises(JetpipeError, match=message.replace("?", r"\?").replace("+", r"\+")):
        check_sink(uri)


def test_a_webhook_never_shows_its_query_or_credentials():
    with pytest.raises(JetpipeError) as caught:
        check_sink("https://u:hunter2@127.0.0.1/hook?key=abc&timeout=x")
    assert "hunter2" not in str(caught.value) and "abc" not in str(caught.value)


# -- Redis Streams ---------------------------------------------------------------------------------------------

def test_redis_takes_each_event_once_in_order_in_a_bounded_stream(redis_server):
    sink = RedisSink(f"redis://127.0.0.1:{redis_server.port}/0?maxlen=1000")
    events = [_event(n) for n in range(50)]
    for event in events:
        sink.write(event)
    sink.close()
    assert _redis_ids(redis_server.port) == [e.event_id for e in events]
    assert sink.delivery() == {"sink": f"redis://127.0.0.1:{redis_server.port}/0?stream=jetpipe:events", "sent": 50,
                               "lost": 0, "queued": 0, "failed_tries": 0}
    import redis

    client = redis.Redis(port=redis_server.port)
    _, fields = client.xrange("jetpipe:events", count=1)[0]
    assert fields[b"type"] == b"line_cross" and fields[b"stream"] == b"0"
    bounded = RedisSink(f"redis://127.0.0.1:{redis_server.port}/0?stream=small&maxlen=10")
    for n in range(2000):
        bounded.write(_event(n))
    bounded.close()
    assert bounded.sent == 2000 and client.xlen("small") < 2000  # trimmed as it grows (~: whole nodes)
    client.close()


def test_a_redis_that_goes_away_is_counted_and_gets_every_event_when_back(redis_server, caplog):
    sink = RedisSink(f"redis://127.0.0.1:{redis_server.port}/0?drain=30")
    first = [_event(n) for n in range(5)]
    for event in first:
        sink.write(event)
    wait_for(lambda: sink.sent == 5, what="the first events")
    redis_server.stop()
    later = [_event(n) for n in range(5, 20)]
    for event in later:
        sink.write(event)  # never blocks: queued
    wait_for(lambda: sink.failures >= 1, what="a failed try")
    assert sink.sent == 5 and sink.queued() == 15
    redis_server.start()  # a new, empty server on the same port
    wait_for(lambda: sink.queued() == 0, what="the queue to drain after the reconnect")
    sink.close()
    assert _redis_ids(redis_server.port) == [e.event_id for e in later]  # every one, in order
    assert sink.lost == 0 and sink.sent == 20
    said = caplog.text
    assert "cannot deliver" in said and "delivering again" in said


def test_what_the_queue_cannot_hold_and_what_is_left_at_stop_is_lost_and_counted(redis_server, caplog):
    redis_server.stop()
    sink = RedisSink(f"redis://127.0.0.1:{redis_server.port}/0?queue=4&drain=0.2")
    for n in range(10):
        sink.write(_event(n))
    assert sink.lost == 6 and sink.queued() == 4
    started = time.monotonic()
    sink.close()  # a stop with the broker down stays bounded by the drain time (and the client's timeouts)
    assert time.monotonic() - started < 15
    assert sink.lost == 10 and sink.sent == 0
    assert "its queue is full" in caplog.text and "not delivered within the drain time" in caplog.text


def test_broker_sinks_send_events_only_unless_asked_for_all_records(redis_server):
    from jetpipe.pipelines.core.record import FrameRecord

    frame = FrameRecord(0, "synthetic", 1, 0.1, 1.0, 1.1, {}, "detect", {"boxes": []})
    events_only = RedisSink(f"redis://127.0.0.1:{redis_server.port}/0?stream=e")
    everything = RedisSink(f"redis://127.0.0.1:{redis_server.port}/0?stream=a&records=all")
    for sink in (events_only, everything):
        sink.write(frame)
        sink.write(_event(1))
        sink.close()
    assert (events_only.sent, everything.sent) == (1, 2)


# -- Kafka -----------------------------------------------------------------------------------------------------

def _consume(port: int, topic: str, expected: int, timeout: float = 60.0) -> list:
    import confluent_kafka

    consumer = confluent_kafka.Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "jetpipe-test",
                                         "enable.auto.commit": False})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in partitions])
    messages, deadline = [], time.monotonic() + timeout
    try:
        while len(messages) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                messages.append((message.key(), json.loads(message.value())))
    finally:
        consumer.close()
    return messages


def test_kafka_takes_each_event_keyed_by_its_stream(kafka_broker):
    sink = KafkaSink(f"kafka://127.0.0.1:{kafka_broker.port}/jetpipe.events")
    events = [_event(n, stream=n % 3) for n in range(30)]
    for event in events:
        sink.write(event)
    sink.close()
    assert sink.sent == 30 and sink.lost == 0
    got = _consume(kafka_broker.port, "jetpipe.events", 30)
    assert all(key == str(value["stream"]).encode() for key, value in got)
    for stream in range(3):  # a stream's events in one partition, in order
        assert [v["event_id"] for _, v in got if v["stream"] == stream] == [e.event_id for e in events[stream::3]]


def test_a_kafka_broker_that_goes_away_is_counted_and_reconnected(kafka_broker):
    sink = KafkaSink(f"kafka://127.0.0.1:{kafka_broker.port}/events?drain=60")
    sink.write(_event(0))
    wait_for(lambda: sink.sent == 1, what="the first event")
    kafka_broker.stop()
    later = [_event(n) for n in range(1, 11)]
    for event in later:
        sink.write(event)
    wait_for(lambda: sink.failures >= 1, what="a failed try")
    assert sink.sent == 1
    kafka_broker.start()  # in memory: a new, empty broker on the same port
    wait_for(lambda: sink.queued() == 0, timeout=90, what="the queue to drain after the reconnect")
    sink.close()
    got = {value["event_id"] for _, value in _consume(kafka_broker.port, "events", 10)}
    assert got >= {e.event_id for e in later} and sink.lost == 0


# -- web hooks -------------------------------------------------------------------------------------------------

class Hook(http.server.ThreadingHTTPServer):
    """An endpoint: answers each POST with the next status of `answers` (then 200), keeps what it got."""

    def __init__(self, answers=()):
        self.answers, self.got, self.headers_seen, self.hold = list(answers), [], [], threading.Event()
        self.hold.set()
        super().__init__(("127.0.0.1", 0), _HookHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


class _HookHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.hold.wait()
        status = self.server.answers.pop(0) if self.server.answers else 200
        if status == 200:
            self.server.got.append(json.loads(body))
            self.server.headers_seen.append(dict(self.headers))
        self.send_response(status)
        if status == 302:
            self.send_header("Location", "http://127.0.0.1:1/elsewhere")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_webhook_gets_every_event_after_refusals_it_may_mend(monkeypatch):
    monkeypatch.setenv("JETPIPE_TEST_HOOK_TOKEN", "s3cret")
    hook = Hook(answers=[503, 429, 500])
    sink = WebhookSink(hook.url + "?site=door&token_env=JETPIPE_TEST_HOOK_TOKEN&drain=60")
    events = [_event(n) for n in range(5)]
    for event in events:
        sink.write(event)
    sink.close()
    hook.shutdown()
    assert [e["event_id"] for e in hook.got] == [e.event_id for e in events]
    assert sink.failures == 3 and sink.lost == 0
    assert hook.headers_seen[0]["Authorization"] == "Bearer s3cret"
    assert hook.headers_seen[0]["Content-Type"] == "application/json"
    assert sink.describe() == hook.url  # the query (it may hold a key) is never shown


def test_a_webhooks_no_is_counted_lost_and_redirects_are_not_followed(caplog):
    hook = Hook(answers=[400, 302])
    sink = WebhookSink(hook.url)
    for n in range(3):
        sink.write(_event(n))
    sink.close()
    hook.shutdown()
    assert (sink.sent, sink.lost, sink.failures) == (1, 2, 0) and len(hook.got) == 1  # the 302 was a no too
    assert "1 record(s) lost so far: the broker refused it (HTTP 400 Bad Request)" in caplog.text


def test_a_hung_webhook_never_holds_up_the_frames(det_bundle, tmp_path, panning_video):
    """The endpoint takes the requests and never answers: the run ends all the same, every frame processed,
    what waited counted lost at the stop."""
    from jetpipe.cli import main

    hook = Hook()
    hook.hold.clear()
    out, summary_path = tmp_path / "out.jsonl", tmp_path / "summary.json"
    code = main(["serve", "--bundle", str(det_bundle), "--source", str(panning_video.path), "--metrics", "",
                 "--line", f"door:{panning_video.x_line},0,{panning_video.x_line},1", "--sink", f"jsonl:{out}",
                 "--sink", f"{hook.url}?timeout=1&drain=0.5", "--summary", str(summary_path)])
    hook.hold.set()
    hook.shutdown()
    assert code == 0
    summary = json.loads(summary_path.read_text())["summary"]
    events = sum(1 for line in out.read_text().splitlines() if '"schema":"jetpipe.event/1"' in line)
    assert summary["processed"] == [panning_video.frames] and events >= 2
    (delivery,) = summary["delivery"]
    assert delivery["sent"] == 0 and delivery["lost"] == events and delivery["failed_tries"] >= 1


# -- the daemon: events from a video to the brokers ---------------------------------------------------------

def test_the_daemons_events_reach_redis_kafka_and_mqtt_as_in_the_jsonl(det_bundle, tmp_path, panning_video,
                                                                       redis_server, kafka_broker, mosquitto):
    import paho.mqtt.client as mqtt

    from jetpipe.cli import main

    topics: list[str] = []
    subscriber = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    subscriber.on_message = lambda client, userdata, message: topics.append(message.topic)
    subscriber.connect("127.0.0.1", mosquitto)
    subscriber.subscribe("site/door/#", qos=1)
    subscriber.loop_start()
    out, summary_path = tmp_path / "out.jsonl", tmp_path / "summary.json"
    code = main(["serve", "--bundle", str(det_bundle), "--source", str(panning_video.path), "--metrics", "",
                 "--line", f"door:{panning_video.x_line},0,{panning_video.x_line},1", "--sink", f"jsonl:{out}",
                 "--sink", f"redis://127.0.0.1:{redis_server.port}", "--sink",
                 f"kafka://127.0.0.1:{kafka_broker.port}/door", "--sink", f"mqtt://127.0.0.1:{mosquitto}/site/door",
                 "--summary", str(summary_path)])
    assert code == 0
    events = [json.loads(line) for line in out.read_text().splitlines() if '"schema":"jetpipe.event/1"' in line]
    ids = [e["event_id"] for e in events]
    assert len(ids) == panning_video.crossings >= 2
    assert _redis_ids(redis_server.port) == ids
    assert sorted(value["event_id"] for _, value in _consume(kafka_broker.port, "door", len(ids))) == sorted(ids)
    wait_for(lambda: topics.count("site/door/events/line_cross") == len(ids), what="the MQTT events")
    subscriber.loop_stop()
    assert topics.count("site/door") == panning_video.frames  # the frames' records, on the topic itself
    summary = json.loads(summary_path.read_text())["summary"]
    assert [(d["sent"], d["lost"]) for d in summary["delivery"]] == [
        (len(ids), 0), (len(ids), 0), (len(ids) + panning_video.frames, 0)]
