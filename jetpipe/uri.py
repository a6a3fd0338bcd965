"""Source URIs, named as jetson-utils' videoSource names them; one parser for serve, calibrate and --calib.

    csi://0                      Jetson MIPI CSI camera (nvarguscamerasrc)
    v4l2:///dev/video0           V4L2 camera (a bare /dev/videoN too)
    rtsp://host:8554/path        network stream (also rtsps, rtmp, http(s), udp, tcp, srt)
    file://clip.mp4              video file or image folder (the scheme is optional for paths)
    synthetic://1280x720@30/nv12 rendered text panning across the frame (synthetic:1280x720@30:nv12 too;
                                 .../nv12/still: every ring slot rendered once, then re-sent: benchmarks)
    gst:PIPELINE                 a GStreamer pipeline ending in raw video caps

Parsing is pure (no file system access except telling an existing path from an
unknown scheme), so it is testable anywhere.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from jetpipe.errors import JetpipeError
from jetpipe.limits import MAX_SIDE

NETWORK_SCHEMES = ("rtsp", "rtsps", "rtmp", "http", "https", "udp", "tcp", "srt")
SCHEMES = ("csi", "v4l2", "file", "synthetic", "gst", *NETWORK_SCHEMES)
LIVE_SCHEMES = ("csi", "v4l2", "synthetic", *NETWORK_SCHEMES)
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"}  # what an image folder holds
EXAMPLES = ("csi://0", "v4l2:///dev/video0", "rtsp://host/path", "file://clip.mp4", "a path",
            "synthetic://1280x720@30/nv12", "gst:PIPELINE")

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.S)
_SYNTHETIC = re.compile(r"^(?:(\d+)x(\d+))?(?:@(\d+(?:\.\d+)?))?(?:[:/](\w+))?(?:[:/](still))?/?$")


class SourceURIError(JetpipeError):
    """A source URI that names no known scheme or is malformed."""


@dataclass(frozen=True)
class SourceURI:
    scheme: str     # one of SCHEMES
    location: str   # path, device, URL, synthetic spec or pipeline text
    text: str       # as written

    @property
    def live(self) -> bool:
        """Cameras and network streams drop their oldest frame when processing falls behind; files do not."""
        return self.scheme in LIVE_SCHEMES

    @property
    def path(self) -> Path:
        return Path(self.location)


def parse(text: str) -> SourceURI:
    """A source URI from what a user wrote (flag, config file, --calib)."""
    text = str(text).strip()
    if not text:
        raise SourceURIError(f"empty source: write one of {', '.join(EXAMPLES)}")
    match = _SCHEME.match(text)
    if match:
        return _with_scheme(match.group(1).lower(), match.group(2), text)
    if text.startswith("gst:"):
        return SourceURI("gst", text[4:].strip(), text)
    if text == "synthetic" or text.startswith("synthetic:"):
        return SourceURI("synthetic", text[len("synthetic:"):], text)
    if re.match(r"^/dev/video\d+$", text):
        return SourceURI("v4l2", text, text)
    word = re.match(r"^([A-Za-z][A-Za-z0-9+.-]+):", text)
    if word and not Path(text).exists():
        raise _unknown(word.group(1), text)
    return SourceURI("file", text, text)


def _with_scheme(scheme: str, rest: str, text: str) -> SourceURI:
    if scheme in NETWORK_SCHEMES:
        return SourceURI(scheme, text, text)
    if scheme == "file":
        if not rest:
            raise SourceURIError(f"source {text!r}: file:// needs a path, e.g. file://clip.mp4")
        return SourceURI("file", rest, text)
    if scheme == "v4l2":
        device = rest if rest.startswith("/") else f"/dev/video{rest}"
        if not re.match(r"^/dev/video\d+$", device):
            raise SourceURIError(f"source {text!r}: write v4l2:///dev/videoN")
        return SourceURI("v4l2", device, text)
    if scheme == "csi":
        if not rest.isdigit():
            raise SourceURIError(f"source {text!r}: write csi://N, N the sensor id (csi://0)")
        return SourceURI("csi", rest, text)
    if scheme == "synthetic":
        return SourceURI("synthetic", rest, text)
    raise _unknown(scheme, text)


def _unknown(scheme: str, text: str) -> SourceURIError:
    return SourceURIError(f"source {text!r}: unknown scheme {scheme!r}; known: {', '.join(SCHEMES)} "
                          f"(e.g. {', '.join(EXAMPLES)})")


def synthetic_spec(uri: SourceURI) -> tuple[int, int, float, str]:
    """(width, height, fps, format) of a synthetic camera; defaults 640x480@30 nv12."""
    match = _SYNTHETIC.match(uri.location)
    if not match:
        raise SourceURIError(f"source {uri.text!r}: write synthetic://WIDTHxHEIGHT@FPS/FORMAT, "
                             "e.g. synthetic://1920x1080@30/nv12")
    w, h, fps, fmt, _still = match.groups()
    width, height = int(w or 640), int(h or 480)
    if not (2 <= width <= MAX_SIDE and 2 <= height <= MAX_SIDE):
        raise SourceURIError(f"source {uri.text!r}: {width}x{height}: width and height from 2 to {MAX_SIDE}")
    return width, height, float(fps or 30), (fmt or "nv12").lower()


def synthetic_still(uri: SourceURI) -> bool:
    """synthetic://WxH@FPS/FORMAT/still: each ring slot is rendered once and then sent again as it
    is (benchmarks: the source costs no per-frame copy)."""
    match = _SYNTHETIC.match(uri.location)
    return bool(match and match.group(5))


def is_loopback(address: str) -> bool:
    """Whether HOST:PORT is on this machine only (a loopback address or localhost; '' and 0.0.0.0 are every
    interface, a host name may resolve to any)."""
    return is_loopback_host(address.rpartition(":")[0].strip("[]"))


def is_loopback_host(host: str) -> bool:
    """Whether a host name or address (no port) is this machine's loopback: localhost or a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
