"""At-least-once delivery to a broker that may be down or slow: a bounded queue and a sender thread per sink.

`write` (the fan-out's writer thread) only queues: a broker never holds up inference. The sender thread takes
up to a batch from the head of the queue and hands it to the sink's `send`, which returns once the broker has
acknowledged what it took; a record leaves the queue only then. A send that raises (broker down, timed out)
leaves the batch at the head: the sender waits (backoff, doubling to BACKOFF_MAX_S), reconnects and sends it
again, so a record may arrive twice (consumers drop duplicates by the event's `event_id`). What the queue
cannot take (full), what the broker refuses for good (a webhook's 4xx, a record too large) and what is still
queued when the drain time at stop runs out is `lost`: counted in the summary and on /metrics, and said in
the log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from jetpipe.errors import JetpipeError, worth_logging
from jetpipe.pipelines.outputs.sinks.base import SinkBase
from jetpipe.tasks import json_numbers

log = logging.getLogger(__name__)

RECORDS = ("events", "all")  # what a broker sink sends: the events' records, or the frames' records too
MAX_QUEUE = 1_000_000
MAX_DRAIN_S = 600.0
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.2, 10.0
BATCH = 256  # records handed to one send()


class Undelivered(Exception):
    """send() delivered the first `handled` records of its batch (acknowledged, or refused for good), and not
    the rest: those stay at the head of the queue and are sent again after the backoff."""

    def __init__(self, handled: int, reason: str):
        super().__init__(reason)
        self.handled = handled


def delivery_options(spec: str, options: dict[str, str], records: str = "events") -> tuple[str, int, float]:
    """(records, queue, drain) from a broker sink's ?options: what it sends, how many records wait at most,
    how long the stop waits for them to be delivered."""
    what = options.get("records", records)
    if what not in RECORDS:
        raise JetpipeError(f"sink {spec}: records={what!r}: 'events' (the events only) or 'all' (the frames' "
                           "records too)")
    queue = _number(spec, options, "queue", "10000", int, 1, MAX_QUEUE)
    drain = _number(spec, options, "drain", "5", float, 0, MAX_DRAIN_S)
    return what, queue, drain


def _number(spec, options, key, default, kind, low, high):
    text = options.get(key, default)
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise JetpipeError(f"sink {spec}: {key}={text!r}: allowed {kind.__name__} from {low} to {high}")
    return value


class QueuedSink(SinkBase):
    """The queue, the sender thread and the counts; a broker's sink adds describe(), send(), reconnect() and
    disconnect(), and calls start() at the end of its constructor."""

    def __init__(self, records: str, queue: int, drain_s: float):
        self.records, self.capacity, self.drain_s = records, queue, drain_s
        if records == "all":
            json_numbers.make_tables()  # the frames' records' JSON: its tables made now, not at the first record
        self.queue: deque = deque()
        self.cond = threading.Condition()
        self.sent = self.lost = 0
        self._refused = 0  # records of the batch in send() refused for good
        self.down_since: float | None = None  # monotonic time of the first failed send of an outage
        self.closing = self.abandoned = False
        self.thread = threading.Thread(target=self._run, name="delivery", daemon=True)

    # -- what a broker's sink provides ---------------------------------------------------------------------
    def send(self, batch: list) -> None:
        """Deliver `batch` (records, in order) and return once the broker acknowledged them; raise Undelivered
        (or anything else: nothing delivered) where it did not. A record the broker will never take (a
        webhook's 4xx, a message too large) is handed to refuse() and counts as delivered."""
        raise NotImplementedError

    def refuse(self, reason: str) -> None:
        """One record of the batch in send() was refused for good: it is lost, not sent again."""
        self._refused += 1
        self._lose(1, f"the broker refused it ({reason})")

    def reconnect(self) -> None:
        """After a failed send: make the connection anew where the client does not do it by itself."""

    def disconnect(self) -> None:
        """Release the client (the sender thread has ended)."""

    # -- the fan-out's side ----------------------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def wants(self, record) -> bool:
        return self.records == "all" or record.type is not None  # events have a type

    def write(self, record) -> None:
        if not self.wants(record):
            return
        with self.cond:
            if len(self.queue) >= self.capacity or self.closing:
                self._lose(1, "its queue is full" if not self.closing else "it is closing")
                return
            self.queue.append(record)
            self.cond.notify()

    def queued(self) -> int:
        return len(self.queue)

    def close(self) -> None:
        """Deliver what is queued within the drain time, then stop; what is left is lost (and said)."""
        deadline = time.monotonic() + self.drain_s
        with self.cond:
            while self.queue and time.monotonic() < deadline and self.thread.is_alive():
                self.cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            self.closing = True
            self.cond.notify_all()
        self.thread.join(timeout=1.0)  # a send in flight is not waited for: the stop stays bounded
        with self.cond:
            left = len(self.queue)
            self.queue.clear()
            self.abandoned = True  # a send still in flight counts nothing more
        if left:
            self._lose(left, f"it was not delivered within the drain time ({self.drain_s:g} s) at stop")
        self.disconnect()

    # -- the sender thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = BACKOFF_MIN_S
        while True:
            with self.cond:
                while not self.queue and not self.closing:
                    self.cond.wait()
                if self.closing:
                    return
                batch = [self.queue[i] for i in range(min(BATCH, len(self.queue)))]
            self._refused = 0
            try:
                self.send(batch)
                handled, error = len(batch), None
            except Undelivered as exc:
                handled, error = exc.handled, exc
            except Exception as exc:  # down, slow, reset: the batch stays at the head and is sent again
                handled, error = 0, exc
            self._done(handled)
            if error is None:
                backoff = BACKOFF_MIN_S
                continue
            self._failed(error)
            if self._wait(backoff):
                return
            backoff = min(BACKOFF_MAX_S, backoff * 2)
            self._reconnect()

    def _done(self, n: int) -> None:
        with self.cond:
            if self.abandoned:  # the stop counted what was queued as lost
                return
            for _ in range(n):
                self.queue.popleft()
            self.sent += n - self._refused
            self.cond.notify_all()
        if self.down_since is not None and n:
            log.warning("sink %s: delivering again after %.1f s; %d record(s) queued", self.describe(),
                        time.monotonic() - self.down_since, self.queued())
            self.down_since = None

    def _failed(self, exc: Exception) -> None:
        if self.closing:  # a send cut short by the stop: the stop says what was left
            return
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning("sink %s: cannot deliver (%s); records wait in its queue (at most %d) and are sent "
                        "when it answers again", self.describe(), exc, self.capacity)
        self.fail(exc)

    def _wait(self, seconds: float) -> bool:
        """Sleep before the next try; True when the sink is closing (its drain time has run out)."""
        with self.cond:
            self.cond.wait_for(lambda: self.closing, timeout=seconds)
            return self.closing

    def _reconnect(self) -> None:
        try:
            self.reconnect()
        except Exception as exc:
            log.debug("sink %s: reconnect failed: %s", self.describe(), exc)

    def _lose(self, n: int, why: str) -> None:
        with self.cond:  # counted from the fan-out's thread (write, close) and the sender's (refuse)
            self.lost += n
            lost = self.lost
        if n > 1 or worth_logging(lost):
            log.error("sink %s: %d record(s) lost so far: %s", self.describe(), lost, why)

    def delivery(self) -> dict:
        """The summary's entry for this sink."""
        return {"sink": self.describe(), "sent": self.sent, "lost": self.lost, "queued": self.queued(),
                "failed_tries": self.failures}
