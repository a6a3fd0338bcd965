"""`kafka://HOST:PORT[,HOST:PORT...]/TOPIC`: each event produced to a Kafka topic through confluent-kafka
(librdkafka), at least once (delivery.QueuedSink): acks from all in-sync replicas, the idempotent producer, and
the stream's ID as the key, so that a stream's events stay in order in one partition.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import urlparse

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.sinks.base import client_module, sink_options
from jetpipe.pipelines.sinks.delivery import QueuedSink, Undelivered, delivery_options

log = logging.getLogger(__name__)

OPTIONS = ("records", "queue", "drain")
# what sending again cannot mend: the record is too large for the broker (KafkaError's codes)
NEVER = {10, 87}  # MSG_SIZE_TOO_LARGE, INVALID_RECORD
FATAL = -150  # KafkaError._FATAL, librdkafka's own (local) code: the producer has stopped
MESSAGE_TIMEOUT_S = 10  # librdkafka gives up on a message after this (and we send it again)
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
        if self.fatal is not None:
            log.warning("sink %s: the producer stopped (%s); making a new one", self.describe(), self.fatal)
            self.producer.flush(0)
            self.fatal, self.producer = None, self._producer()

    def disconnect(self) -> None:
        self.producer.flush(0)  # what is still in librdkafka's queue was counted lost by the drain
