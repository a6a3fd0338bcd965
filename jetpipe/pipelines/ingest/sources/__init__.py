"""Frame sources: one protocol (base.Source), one URI parser (jetpipe.uri), one factory (open_source).

Every real source delivers YUV as the decoder produced it, written untouched into
its ring slot; colour is converted on the GPU (or by the CPU runtime's reference
path). Which decoder (`decoder = "auto"`):
  - desktop GPU runtime: NVDEC (PyNvVideoCodec) for video files and network streams (an ffmpeg
    remuxing their packets, no decoding), NV12 in device memory (the runtime's hardware_decoder);
    FFmpeg where NVDEC cannot take the stream
  - Jetson: GStreamer (nvarguscamerasrc, nvv4l2decoder, v4l2src raw YUY2)
  - elsewhere: FFmpeg into raw I420 / NV12 / YUYV: files decoded in this process (PyAV, one copy per
    frame), network streams and V4L2 cameras by an ffmpeg process (killable while a connect hangs)
  - OpenCV (BGR, on the CPU) only when asked for, or where no ffmpeg is installed (said in the log)
"""

from __future__ import annotations

import logging
import os

from jetpipe import uri as uris
from jetpipe.errors import JetpipeError
from jetpipe.pipelines.ingest.sources import ffmpeg, gstreamer, pyav
from jetpipe.pipelines.ingest.sources.base import EndOfStream, FrameInfo, Source, SourceError
from jetpipe.pipelines.ingest.sources.ffmpeg import FFmpegSource
from jetpipe.pipelines.ingest.sources.gstreamer import GstSource
from jetpipe.pipelines.ingest.sources.opencv import ImageFolderSource, OpenCVSource
from jetpipe.pipelines.ingest.sources.pyav import PyAVSource
from jetpipe.pipelines.ingest.sources.synthetic import SyntheticCamera

__all__ = ["DECODERS", "EndOfStream", "FFmpegSource", "FrameInfo", "GstSource", "ImageFolderSource",
           "OpenCVSource", "PyAVSource", "Source", "SourceError", "SyntheticCamera", "open_source"]

log = logging.getLogger(__name__)

DECODERS = ("auto", "nvdec", "ffmpeg", "gstreamer", "opencv")


def probed_size(text: str) -> tuple[int, int] | None:
    """(height, width) of a video file's frames, read from its header (PyAV); None for anything else or a file
    that does not open (opening it says why later)."""
    try:
        uri = uris.parse(text)
    except JetpipeError:
        return None
    if uri.scheme != "file" or not uri.path.is_file() or pyav.missing():
        return None
    return pyav.frame_size(uri.location, text)


def open_source(text: str, loop: bool = False, seed: int = 0, realtime: bool = False,
                decoder: str = "auto", hardware=None, streams: int = 1, hwaccel: str = "") -> Source:
    """A source for a URI (files are probed now, so an unreadable one fails here; nothing is decoded yet).

    hardware(uri, loop, realtime): the runtime's hardware decoder, returning a source or None.
    streams: how many sources share this machine (CPU decoders get a share of its cores each).
    hwaccel: FFmpeg hardware decoding for files decoded in-process (elsewhere it is said to be unused)."""
    source = _open_source(text, loop, seed, realtime, decoder, hardware, streams, hwaccel)
    if hwaccel and not isinstance(source, PyAVSource):
        log.warning("source %s: hwaccel %s is for video files decoded in-process by FFmpeg; this source is "
                    "decoded as %s: hwaccel not used", text, hwaccel, source.describe())
    return source


def _open_source(text, loop, seed, realtime, decoder, hardware, streams, hwaccel) -> Source:
    if decoder not in DECODERS:
        raise JetpipeError(f"decoder {decoder!r}: choose one of {', '.join(DECODERS)}")
    uri = uris.parse(text)
    if uri.scheme == "synthetic":
        return SyntheticCamera.from_uri(text, seed=seed)
    if uri.scheme == "file":
        if not uri.path.exists():
            raise JetpipeError(f"source {text!r} not found: write a video file, an image folder, or one of "
                               f"{', '.join(uris.EXAMPLES)}")
        if uri.path.is_dir():
            return ImageFolderSource(uri.location, loop, uri=text)
    if uri.scheme == "gst":
        missing = gstreamer.tools_available()
        if missing:  # one line now, not a reconnect loop that never ends
            raise JetpipeError(f"source {uri.text}: a GStreamer pipeline needs {missing}")
        return GstSource(uri, loop, realtime)
    threads = max(2, (os.cpu_count() or 2) // max(1, streams)) if streams > 1 else None
    if decoder in ("auto", "nvdec") and not gstreamer.is_jetson():
        source = _hardware_source(hardware, uri, loop, realtime, threads)
        if source is not None:
            return source
        if decoder == "nvdec":
            log.warning("source %s: no NVDEC for it here (needs the GPU runtime and PyNvVideoCodec): using FFmpeg",
                        text)
        decoder = "auto"
    chosen = _choose_decoder(uri, decoder)
    if chosen == "opencv":
        return OpenCVSource(uri, loop)
    if chosen == "gstreamer":
        return GstSource(uri, loop, realtime, *_jetson_stream(uri))
    if chosen == "pyav":
        return PyAVSource(uri, loop, realtime, threads=threads, hwaccel=hwaccel)
    return FFmpegSource(uri, loop, realtime, threads=threads)


def _hardware_source(hardware, uri: uris.SourceURI, loop: bool, realtime: bool, threads: int | None):
    """The runtime's hardware decoder for `uri`, or None (it said why, or the URI is not its kind).

    Network streams reach it through an ffmpeg that only remuxes their packets; where it cannot take
    the stream (learnt only when it connects) an FFmpeg source decodes instead."""
    if hardware is None:
        return None
    if uri.scheme not in uris.NETWORK_SCHEMES or ffmpeg.tools_available() is not None:
        return hardware(uri, loop, realtime)
    return hardware(uri, loop, realtime, feed=ffmpeg.RemuxFeed(uri),
                    fallback=lambda: FFmpegSource(uri, loop, realtime, threads=threads))


def _choose_decoder(uri: uris.SourceURI, decoder: str) -> str:
    if uri.scheme == "csi":
        if decoder not in ("auto", "gstreamer") or not gstreamer.is_jetson():
            raise JetpipeError(f"source {uri.text}: CSI cameras need a Jetson (nvarguscamerasrc through GStreamer)")
        return "gstreamer"
    if decoder == "auto":
        decoder = "gstreamer" if gstreamer.is_jetson() and not gstreamer.tools_available() else "ffmpeg"
    if decoder == "ffmpeg" and uri.scheme == "file":
        why_not = pyav.missing()
        if why_not is None:
            return "pyav"
        log.warning("source %s: %s; decoding through an ffmpeg process (more CPU per frame)", uri.text, why_not)
    missing = ffmpeg.tools_available() if decoder == "ffmpeg" else \
        gstreamer.tools_available() if decoder == "gstreamer" else None
    if missing:
        log.warning("source %s: %s; decoding with OpenCV on the CPU (BGR frames, far more CPU per frame)",
                    uri.text, missing)
        return "opencv"
    return decoder


def _jetson_stream(uri: uris.SourceURI) -> tuple[FrameInfo, str, float]:
    """Frame size for a Jetson pipeline, the stream's codec and its bit rate (0: not said): CSI defaults, else
    what ffprobe says."""
    if uri.scheme == "csi":
        w, h, fps = gstreamer.CSI_DEFAULT
        return FrameInfo("nv12", h, w, fps=fps), "raw", 0.0
    if ffmpeg.tools_available() is not None:
        raise JetpipeError(f"source {uri.text}: the frame size is needed for the GStreamer pipeline and "
                           "ffprobe is missing (apt install ffmpeg)")
    stream = ffmpeg.probe(uri)
    info = stream.frame_info()
    fmt = "yuyv" if uri.scheme == "v4l2" and info.format == "yuyv" else "nv12"
    return FrameInfo(fmt, info.height, info.width, info.standard, info.range, info.fps), stream.codec, stream.bit_rate
