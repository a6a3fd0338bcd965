"""Where results go: one protocol (base.Sink), one factory by URI scheme (open_sink), one fan-out (SinkFanout).

    jsonl:PATH[?append=1]       one JSON line per record, in a file the sink makes (append=1: adds to it)
    stdout                      one JSON line per record on standard output
    mqtt://HOST:PORT/TOPIC      each record published as JSON (paho-mqtt); events on TOPIC/events/TYPE
    kafka://HOST:PORT/TOPIC     each event produced to a Kafka topic, keyed by stream (confluent-kafka)
    redis://HOST:PORT[/DB]      each event appended to a Redis stream, ?stream=KEY (redis-py)
    http(s)://HOST/PATH         each event POSTed as JSON to a web hook
    video:FILE.mp4[?...]        the frames with their results drawn, encoded (frames.VideoSink)
    jpeg:FOLDER[?every=N]       the frames with their results drawn, one JPEG each (frames.JpegSink)
    rtsp://HOST:PORT/PATH       the frames with their results drawn, served live over RTSP (rtsp.RtspSink)

The brokers' sinks (mqtt, kafka, redis, http) deliver at least once from a bounded queue of their own
(delivery.QueuedSink): a broker that is down or slow never holds up the frames. A new sink is a module with a
class of the protocol and one line in SCHEMES (and in PARSERS where its URI can be checked before it opens).
"""

from __future__ import annotations

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.outputs.sinks import kafka, mqtt, redis_streams, rtsp, webhook
from jetpipe.pipelines.outputs.sinks.base import FrameTaker, Sink, SinkBase
from jetpipe.pipelines.outputs.sinks.delivery import QueuedSink
from jetpipe.pipelines.outputs.sinks.fanout import SinkFanout
from jetpipe.pipelines.outputs.sinks.frames import FrameSink, JpegSink, VideoSink
from jetpipe.pipelines.outputs.sinks.kafka import (
    KafkaSink,  # the brokers' clients, optional, are imported by constructors
)
from jetpipe.pipelines.outputs.sinks.lines import JsonlSink, StdoutSink
from jetpipe.pipelines.outputs.sinks.mqtt import MqttSink
from jetpipe.pipelines.outputs.sinks.redis_streams import RedisSink
from jetpipe.pipelines.outputs.sinks.rtsp import RtspSink
from jetpipe.pipelines.outputs.sinks.webhook import WebhookSink

__all__ = ["FrameSink", "FrameTaker", "JpegSink", "JsonlSink", "KafkaSink", "MqttSink", "QueuedSink", "RedisSink",
           "RtspSink", "SCHEMES", "Sink", "SinkBase", "SinkFanout", "StdoutSink", "VideoSink", "WebhookSink",
           "check_sink", "open_sink", "open_sinks"]


# scheme -> the sink for a URI of it, given the streams (a video file each), the largest batch, the JPEG encoder
# (runtime.jpeg; None: OpenCV's) and the IDs of the streams this process draws (None: all of them; a GPU's worker
# draws its own: pipelines/service/gpus)
SCHEMES = {
    "jsonl": lambda uri, streams, max_batch, jpeg, ids: JsonlSink(uri),
    "stdout": lambda uri, streams, max_batch, jpeg, ids: StdoutSink(),
    "mqtt": lambda uri, streams, max_batch, jpeg, ids: MqttSink(uri),
    "kafka": lambda uri, streams, max_batch, jpeg, ids: KafkaSink(uri),
    "redis": lambda uri, streams, max_batch, jpeg, ids: RedisSink(uri),
    "http": lambda uri, streams, max_batch, jpeg, ids: WebhookSink(uri),
    "https": lambda uri, streams, max_batch, jpeg, ids: WebhookSink(uri),
    "video": lambda uri, streams, max_batch, jpeg, ids: VideoSink(uri, streams, max_batch, ids),
    "jpeg": lambda uri, streams, max_batch, jpeg, ids: JpegSink(uri, max_batch, jpeg, ids),
    "rtsp": lambda uri, streams, max_batch, jpeg, ids: RtspSink(uri, streams, max_batch),
}
# scheme -> its URI's check, which connects to nothing (the config's checks, before anything runs)
PARSERS = {"mqtt": mqtt.parse, "kafka": kafka.parse, "redis": redis_streams.parse, "http": webhook.parse,
           "https": webhook.parse, "rtsp": rtsp.parse}
HELP = ("jsonl:PATH[?append=1], stdout, mqtt://HOST:PORT/TOPIC, kafka://HOST:PORT/TOPIC, redis://HOST:PORT, "
        "http(s)://HOST/PATH, video:FILE.mp4, jpeg:FOLDER or rtsp://HOST:PORT/PATH")


FRAME_SCHEMES = ("video", "jpeg", "rtsp")  # the sinks that draw frames (sit where the frames are)


def scheme_of(uri: str) -> str:
    """A sink URI's scheme: the word before ':' (`stdout` alone is one)."""
    return uri.split(":", 1)[0].lower() if ":" in uri else uri


def check_sink(uri: str) -> None:
    """A sink's URI, checked as far as it can be without opening anything: its scheme, a broker's options."""
    parse = PARSERS.get(_known_scheme(uri))
    if parse is not None:
        parse(uri)


def open_sink(uri: str, streams: int = 1, max_batch: int = 8, jpeg=None, ids=None) -> Sink:
    return SCHEMES[_known_scheme(uri)](uri, streams, max_batch, jpeg, ids)  # each sink parses its own URI


def _known_scheme(uri: str) -> str:
    scheme = scheme_of(uri)
    if scheme not in SCHEMES or (scheme == "stdout" and uri != "stdout"):
        raise JetpipeError(f"sink {uri!r}: use {HELP}")
    return scheme


def open_sinks(uris: list[str], streams: int, max_batch: int, jpeg=None, ids=None) -> list[Sink]:
    """Every sink, opened in order; where one cannot be opened those opened before it are closed again."""
    sinks = []
    try:
        for uri in uris:
            sinks.append(open_sink(uri, streams, max_batch, jpeg, ids))
    except BaseException:
        for sink in reversed(sinks):
            sink.close()
        raise
    return sinks
