"""Where results go: one protocol (base.Sink), one factory by URI scheme (open_sink), one fan-out (SinkFanout).

    jsonl:PATH[?append=1]       one JSON line per record, in a file the sink makes (append=1: adds to it)
    stdout                      one JSON line per record on standard output
    mqtt://HOST:PORT/TOPIC      each record published as JSON (paho-mqtt)
    video:FILE.mp4[?...]        the frames with their results drawn, encoded (frames.VideoSink)
    jpeg:FOLDER[?every=N]       the frames with their results drawn, one JPEG each (frames.JpegSink)

A new sink is a module with a class of the protocol and one line in SCHEMES.
"""

from __future__ import annotations

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.sinks.base import FrameTaker, Sink, SinkBase
from jetpipe.pipelines.sinks.fanout import SinkFanout
from jetpipe.pipelines.sinks.frames import FrameSink, JpegSink, VideoSink
from jetpipe.pipelines.sinks.lines import JsonlSink, StdoutSink
from jetpipe.pipelines.sinks.mqtt import MqttSink  # paho-mqtt, optional, is imported by its constructor

__all__ = ["FrameSink", "FrameTaker", "JpegSink", "JsonlSink", "MqttSink", "SCHEMES", "Sink", "SinkBase", "SinkFanout",
           "StdoutSink", "VideoSink", "open_sink", "open_sinks"]


# scheme -> the sink for a URI of it, given the streams (a video file each) and the largest batch
SCHEMES = {
    "jsonl": lambda uri, streams, max_batch: JsonlSink(uri),
    "stdout": lambda uri, streams, max_batch: StdoutSink(),
    "mqtt": lambda uri, streams, max_batch: MqttSink(uri),
    "video": lambda uri, streams, max_batch: VideoSink(uri, streams, max_batch),
    "jpeg": lambda uri, streams, max_batch: JpegSink(uri, max_batch),
}
HELP = "jsonl:PATH[?append=1], stdout, mqtt://HOST:PORT/TOPIC, video:FILE.mp4 or jpeg:FOLDER"


def scheme_of(uri: str) -> str:
    """A sink URI's scheme: the word before ':' (`stdout` alone is one)."""
    return uri.split(":", 1)[0].lower() if ":" in uri else uri


def open_sink(uri: str, streams: int = 1, max_batch: int = 8) -> Sink:
    make = SCHEMES.get(scheme_of(uri))
    if make is None or (scheme_of(uri) == "stdout" and uri != "stdout"):
        raise JetpipeError(f"sink {uri!r}: use {HELP}")
    return make(uri, streams, max_batch)


def open_sinks(uris: list[str], streams: int, max_batch: int) -> list[Sink]:
    """Every sink, opened in order; where one cannot be opened those opened before it are closed again."""
    sinks = []
    try:
        for uri in uris:
            sinks.append(open_sink(uri, streams, max_batch))
    except BaseException:
        for sink in reversed(sinks):
            sink.close()
        raise
    return sinks
