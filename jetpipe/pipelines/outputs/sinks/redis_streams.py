"""`redis://HOST:PORT[/DB]?stream=KEY`: each event appended to a Redis stream (XADD, trimmed to a bounded
length), through redis-py, at least once (delivery.QueuedSink).

Each entry's fields: `type` (the event's type; `frame` for a frame's record with records=all), `stream` (the
video stream's ID) and `json` (the record as every other sink writes it).
"""

from __future__ import annotations

from urllib.parse import unquote, urlparse

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.outputs.sinks.base import client_module, port_of, sink_options
from jetpipe.pipelines.outputs.sinks.delivery import QueuedSink, delivery_options

OPTIONS = ("stream", "maxlen", "records", "queue", "drain")
MAX_MAXLEN = 100_000_000
TIMEOUT_S = 5.0  # a command unanswered this long fails the send, which is tried again


def parse(spec: str) -> dict:
    """The sink's settings from its URI, without connecting (config checks call it before anything runs)."""
    _, options = sink_options(spec, OPTIONS)
    parsed = urlparse(spec)
    port = port_of(parsed, spec, 6379)
    db_text = parsed.path.strip("/") or "0"
    if not db_text.isdigit():
        raise JetpipeError(f"sink {spec}: the path names the database, a number (redis://HOST:PORT/0); the "
                           "stream's key is ?stream=KEY")
    key = options.get("stream", "jetpipe:events")
    maxlen_text = options.get("maxlen", "100000")
    if not maxlen_text.isdigit() or not 1 <= int(maxlen_text) <= MAX_MAXLEN:
        raise JetpipeError(f"sink {spec}: maxlen={maxlen_text!r}: the stream's length bound, 1 to {MAX_MAXLEN}")
    records, queue, drain = delivery_options(spec, options)
    return {"host": parsed.hostname or "127.0.0.1", "port": port, "db": int(db_text), "key": key,
            "maxlen": int(maxlen_text), "password": unquote(parsed.password) if parsed.password else None,
            "username": unquote(parsed.username) if parsed.username else None, "records": records,
            "queue": queue, "drain": drain}


class RedisSink(QueuedSink):
    """XADD of each record to one Redis stream, `MAXLEN ~ maxlen` (Redis trims whole nodes: about maxlen)."""

    def __init__(self, spec: str):
        settings = parse(spec)
        redis, retry, backoff = (client_module(m, "redis", "redis-py", "redis")
                                 for m in ("redis", "redis.retry", "redis.backoff"))
        super().__init__(settings["records"], settings["queue"], settings["drain"])
        self.host, self.port, self.db = settings["host"], settings["port"], settings["db"]
        self.key, self.maxlen = settings["key"], settings["maxlen"]
        self.client = redis.Redis(host=self.host, port=self.port, db=self.db, username=settings["username"],
                                  password=settings["password"], socket_timeout=TIMEOUT_S,
                                  socket_connect_timeout=TIMEOUT_S,
                                  retry=retry.Retry(backoff.NoBackoff(), 0))  # the queue's sender tries again
        self.start()

    def describe(self) -> str:  # never the password
        return f"redis://{self.host}:{self.port}/{self.db}?stream={self.key}"

    def send(self, batch: list) -> None:
        pipe = self.client.pipeline(transaction=False)
        for record in batch:
            pipe.xadd(self.key, {"type": record.type or "frame", "stream": record.stream,
                                 "json": record.json()}, maxlen=self.maxlen, approximate=True)
        replies = pipe.execute(raise_on_error=False)  # a connection error raises: the batch is sent again
        for reply in replies:
            if isinstance(reply, Exception):  # the server's no to this entry (a key of another type): for good
                self.refuse(str(reply))

    def reconnect(self) -> None:
        self.client.connection_pool.disconnect()

    def disconnect(self) -> None:
        self.client.close()
