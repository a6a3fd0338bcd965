"""`kafka://HOST:PORT[,HOST:PORT...]/TOPIC`: each event produced to a Kafka topic through confluent-kafka
(librdkafka), at least once (delivery.QueuedSink): acks from all in-sync replicas, the idempotent producer, and
the stream's ID as the key, so that a stream's events stay in order in one partition.

A producer whose messages timed out is not trusted again: the idempotent producer then bumps its epoch, which a
broker back from a pause or a restart may refuse for good ("a newer producer ... fences the current one"), and
librdkafka does not call that fatal, so the old producer failed every send after a 12 s pause while a new one
delivered at once. After REPLACE_AFTER failed sends in a row (or a fatal error) the sink makes a new producer;
what the old one still held is purged (it is in the sink's own queue, sent again).
"""

from __future__ import annotations

import logging
import re
from urllib.parse import urlparse

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.outputs.sinks.base import client_module, sink_options
from jetpipe.pipelines.outputs.sinks.delivery import QueuedSink, Undelivered, delivery_options

log = logging.getLogger(__name__)

OPTIONS = ("records", "queue", "drain")
# what sending again cannot mend: the record is too large for the broker (KafkaError's codes)
NEVER = {10, 87}  # MSG_SIZE_TOO_LARGE, INVALID_RECORD
FATAL = -150  # KafkaError._FATAL, librdkafka's own (local) code: the producer has stopped
MESSAGE_TIMEOUT_S = 10  # librdkafka gives up on a message after this (and we send it again)
REPLACE_AFTER = 2  # failed sends in a row (each up to MESSAGE_TIMEOUT_S) after which the producer is replaced
TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
BROKER = re.compile(r"[A-Za-z0-9.-]+:\d{1,5}|\[[0-9A-Fa-f:]+\]:\d{1,5}")


def parse(spec: str) -> dict:
    """The sink's settings from its URI, without connecting (config checks call it before anything runs)."""
    _, options = sink_options(spec, OPTIONS)
    parsed = urlparse(spec)
    brokers = [_with_port(b) for b in parsed.netloc.split(",")]
    topic = parsed.path.strip("/")
    if not all(BROKER.fullmatch(b) for b in brokers) or not all(0 < int(b.rsplit(":", 1)[1]) < 65536
                                                                 for b in brokers):
        raise JetpipeError(f"sink {spec}: name the brokers as HOST:PORT[,HOST:PORT], e.g. "
                           "kafka://127.0.0.1:9092/jetpipe.events")
    if not TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise JetpipeError(f"sink {spec}: the topic {topic!r}: name one, of letters, digits, '.', '_' and '-', "
                           "e.g. kafka://127.0.0.1:9092/jetpipe.events")
    records, queue, drain = delivery_options(spec, options)
    return {"brokers": ",".join(brokers), "topic": topic, "records": records, "queue": queue, "drain": drain}


def _with_port(broker: str) -> str:
    """HOST, [IPv6] -> HOST:9092, [IPv6]:9092 (Kafka's port); HOST:PORT as it is."""
    has_port = re.search(r":\d+$", broker) and not broker.endswith("]")
    return broker if has_port else f"{broker}:9092"


class _ClientLog:
    """librdkafka's own lines (a refused connection, every retry) at debug: the sink says an outage once."""

    def log(self, level, fmt, *args):
        log.debug(fmt, *args)


class KafkaSink(QueuedSink):
    def __init__(self, spec: str):
        settings = parse(spec)
        self.kafka = client_module("confluent_kafka", "kafka", "confluent-kafka", "kafka")
        super().__init__(settings["records"], settings["queue"], settings["drain"])
        self.brokers, self.topic = settings["brokers"], settings["topic"]
        self.fatal = None
        self.failed_in_row = 0  # sends since the last one that delivered everything
        self.producer = self._producer()
        self.start()

    def _producer(self):
        return self.kafka.Producer({
            "bootstrap.servers": self.brokers, "acks": "all", "enable.idempotence": True,
            "linger.ms": 5, "message.timeout.ms": MESSAGE_TIMEOUT_S * 1000, "client.id": "jetpipe",
            "logger": _ClientLog(), "error_cb": self._client_error})

    def _client_error(self, err) -> None:
        if self._is_fatal(err):  # the idempotent producer cannot go on: reconnect() makes a new one
            self.fatal = err
        log.debug("kafka %s: %s", self.brokers, err)

    def describe(self) -> str:
        return f"kafka://{self.brokers}/{self.topic}"

    def send(self, batch: list) -> None:
        outcome: list = [None] * len(batch)
        self.failed_in_row += 1  # until every record is acknowledged or refused for good (reset at the end)

        def delivered(i):
            return lambda err, msg: outcome.__setitem__(i, err if err is not None else True)

        for i, record in enumerate(batch):
            self._produce(record, delivered(i))
        self.producer.flush(MESSAGE_TIMEOUT_S + 5)
        for i, result in enumerate(outcome):
            if result is True:
                continue
            if result is not None and self._is_fatal(result):
                self.fatal = result
            if result is not None and result.code() in NEVER:
                self.refuse(result.str())
                continue
            raise Undelivered(i, "no acknowledgement" if result is None else result.str())
        self.failed_in_row = 0

    def _produce(self, record, on_delivery) -> None:
        while True:
            try:
                self.producer.produce(self.topic, key=str(record.stream).encode(), value=record.json().encode(),
                                      on_delivery=on_delivery)
                return
            except BufferError:  # librdkafka's own queue is full: let it deliver some first
                self.producer.poll(0.1)
            except self.kafka.KafkaException as exc:
                if exc.args and self._is_fatal(exc.args[0]):  # a broker that came back empty: a new producer
                    self.fatal = exc.args[0]
                raise

    def _is_fatal(self, err) -> bool:
        """The idempotent producer cannot go on (messages timed out, a broker that lost its state)."""
        return err.fatal() or err.code() == FATAL

    def reconnect(self) -> None:
        """After a failed send: a new producer where the old one stopped or failed REPLACE_AFTER sends in a row."""
        if self.fatal is not None:
            why = f"the producer stopped ({self.fatal})"
        elif self.failed_in_row >= REPLACE_AFTER:
            why = f"{self.failed_in_row} sends in a row were not acknowledged"
        else:
            return
        log.warning("sink %s: %s; making a new one", self.describe(), why)
        self._drop_producer()
        self.fatal, self.failed_in_row, self.producer = None, 0, self._producer()

    def _drop_producer(self) -> None:
        """What the producer still holds is forgotten (the sink's queue keeps it, or the drain counted it lost)."""
        self.producer.purge(in_queue=True, in_flight=True, blocking=False)
        self.producer.flush(0)

    def disconnect(self) -> None:
        self._drop_producer()
