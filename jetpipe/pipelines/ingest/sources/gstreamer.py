"""Jetson: GStreamer pipelines ending in raw NV12 / I420 / YUY2 on a pipe (gst-launch-1.0 ... ! fdsink).

Works with the pip install of jetpipe (pip's OpenCV has no GStreamer): the
pipeline runs as a gst-launch-1.0 subprocess. Hardware decode on a Jetson is
`nvv4l2decoder`; `nvvidconv` copies its NVMM surface out as NV12 (no colour
conversion). CSI cameras come through `nvarguscamerasrc`, USB cameras through
`v4l2src` as raw YUY2. `gst:PIPELINE` runs a user's pipeline, which must end in
raw caps naming format, width and height.

No Jetson is on hand here: the pipelines built for one are unit-tested by their
text; `gst:` pipelines (e.g. videotestsrc) run in the tests.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.ingest.sources.base import FrameInfo
from jetpipe.pipelines.ingest.sources.pipe import PipeSource
from jetpipe.uri import SourceURI

GST_FORMATS = {"NV12": "nv12", "I420": "i420", "YUY2": "yuyv", "UYVY": "uyvy", "BGR": "bgr", "RGB": "rgb"}
DECODER = "nvv4l2decoder"  # a Jetson's hardware decoder (the tests put a software one here on other machines)
TO_NV12 = "nvvidconv"      # its NVMM surfaces copied out as NV12
TAP = "packets"            # the tee the clips' branch leaves from (jetson_pipeline(tap=True))
CSI_DEFAULT = (1920, 1080, 30)
# RTSP over TCP, as FFmpeg reads it elsewhere (-rtsp_transport tcp): in order and whole, so rtspsrc's jitter buffer has
# nothing to wait for. Its latency is added to the pipeline's, which a live stream's sink (sync=true) holds each frame
# for: latency=200 kept every frame 170-200 ms longer before jetpipe's capture time (scripts/diag/rtsp_hold.py).
RTSP_OPTIONS = "protocols=tcp latency=0"
_CAPS = re.compile(r"video/x-raw\s*,([^!]*)$")


def is_jetson() -> bool:
    return Path("/etc/nv_tegra_release").exists()


def tools_available() -> str | None:
    return None if shutil.which("gst-launch-1.0") else "gst-launch-1.0 not found (apt install gstreamer1.0-tools)"


def quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _nv12_out(width: int, height: int) -> str:
    return f"{TO_NV12} ! video/x-raw,format=NV12,width={width},height={height}"


PARSERS = {"h264": "h264parse", "hevc": "h265parse"}  # for each codec a clip is cut from (packet_tap), and the encoders


def tap_branch(fd: int, codec: str) -> str:
    """The clips' branch of a tapped pipeline: the parsed packets as MPEG-TS to pipe `fd` (never paced:
    sync=false), the parameter sets before every keyframe (config-interval=-1: a clip may start at any)."""
    return f"{TAP}. ! queue ! {PARSERS[codec]} config-interval=-1 ! mpegtsmux ! fdsink fd={fd} sync=false"


def jetson_pipeline(uri: SourceURI, info: FrameInfo, tap: bool = False) -> str:
    """The gst-launch pipeline (without the sink) that gives `info`-shaped raw frames on a Jetson; tap: a file's
    or a network stream's parsed packets also go to a tee named TAP (tap_branch)."""
    w, h = info.width, info.height
    if uri.scheme == "csi":
        fps = int(info.fps or CSI_DEFAULT[2])
        return (f"nvarguscamerasrc sensor-id={uri.location} ! "
                f"video/x-raw(memory:NVMM),width={w},height={h},framerate={fps}/1,format=NV12 ! {_nv12_out(w, h)}")
    if uri.scheme == "v4l2":
        if info.format == "yuyv":
            return f"v4l2src device={uri.location} ! video/x-raw,format=YUY2,width={w},height={h}"
        return (f"v4l2src device={uri.location} ! image/jpeg,width={w},height={h} ! nvv4l2decoder mjpeg=1 ! "
                f"{_nv12_out(w, h)}")  # MJPEG cameras: hardware JPEG decode, no BGR detour
    parsed = f"parsebin ! tee name={TAP} ! queue" if tap else "parsebin"
    if uri.scheme == "file":
        return f"filesrc location={quote(str(Path(uri.location).resolve()))} ! {parsed} ! {DECODER} ! " \
               f"{_nv12_out(w, h)}"
    return f"rtspsrc location={quote(uri.location)} {RTSP_OPTIONS} ! {parsed} ! {DECODER} ! {_nv12_out(w, h)}"


def caps_of(pipeline: str, text: str) -> FrameInfo:
    """Format and size from the raw caps a `gst:` pipeline ends with."""
    match = _CAPS.search(pipeline.strip())
    fields = dict(re.findall(r"(\w+)\s*=\s*(?:\(\w+\))?\s*([\w/.]+)", match.group(1))) if match else {}
    fmt = GST_FORMATS.get(fields.get("format", ""))
    if not (fmt and fields.get("width", "").isdigit() and fields.get("height", "").isdigit()):
        raise JetpipeError(f"source {text!r}: a gst: pipeline must end in raw caps naming the format and size, "
                           f"e.g. '... ! video/x-raw,format=NV12,width=1280,height=720' (formats: "
                           f"{', '.join(GST_FORMATS)})")
    rate = fields.get("framerate", "0/1").split("/")
    fps = float(rate[0]) / float(rate[1]) if len(rate) == 2 and rate[1] not in ("", "0") else 0.0
    return FrameInfo(fmt, int(fields["height"]), int(fields["width"]), fps=fps)


class GstSource(PipeSource):
    """A gst-launch-1.0 subprocess writing raw frames to its stdout."""

    decoder_name = "gstreamer"

    def __init__(self, uri: SourceURI, loop: bool = False, realtime: bool = False, info: FrameInfo | None = None,
                 codec: str = "?", bit_rate: float = 0.0):
        """info: the frames of a pipeline built here (a Jetson's), codec: its stream's (ffprobe's name), bit_rate:
        its bits a second where the container says (0: not said; a clips ring's and an arena's size)."""
        super().__init__(uri, loop, realtime)
        self.pipeline_info, self.codec, self.bit_rate = info, codec, bit_rate
        # a file or a network stream: its packets can be copied (packet_tap); a pipeline of the user's, a camera's
        # raw frames: none
        self.keeps_packets = uri.scheme not in ("gst", "csi", "v4l2")
        if uri.scheme == "gst":
            self.info = caps_of(uri.location, uri.text)
        elif info is None:
            raise JetpipeError(f"source {uri.text}: the GStreamer path needs the frame size")
        else:
            self.info = info

    def probe(self) -> FrameInfo:
        return self.info

    def pipeline(self, tap: bool = False) -> str:
        if self.source_uri.scheme == "gst":
            return self.source_uri.location
        return jetson_pipeline(self.source_uri, self.info, tap)

    def packet_codec(self) -> str:
        return self.codec

    def command(self, packets_fd: int | None = None) -> list[str]:
        sync = "true" if (self.realtime or self.source_uri.live) else "false"
        text = f"{self.pipeline(tap=packets_fd is not None)} ! fdsink fd=1 sync={sync}"
        if packets_fd is not None:
            text += f" {tap_branch(packets_fd, self.codec)}"
        # one argv element per token: gst-launch escapes spaces inside an element (a quoted location)
        return ["gst-launch-1.0", "-q", *shlex.split(text)]
