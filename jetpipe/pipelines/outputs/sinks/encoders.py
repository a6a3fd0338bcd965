"""Which video encoder a `video:` sink runs, and its command: FFmpeg or GStreamer, reading drawn BGR on stdin.

`auto`: on a Jetson the hardware encoder through GStreamer (`nvv4l2h264enc`: nvvidconv moves the frame
into NVMM memory first); elsewhere FFmpeg's NVENC where a one-frame trial encode works (FFmpeg builds
list h264_nvenc whether or not a GPU with NVENC is there), else the software encoder. No Jetson is at
hand here: its pipeline is tested by its text, and the same GStreamer writer runs with x264enc in the tests.
"""

from __future__ import annotations

import functools
import logging
import shlex
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.ingest.sources import gstreamer

log = logging.getLogger(__name__)

SOFTWARE = {"h264": "libx264", "hevc": "libx265"}
NVENC = {"h264": "h264_nvenc", "hevc": "hevc_nvenc"}
JETSON = {"h264": "nvv4l2h264enc", "hevc": "nvv4l2h265enc"}
MUXERS = {".mkv": "matroskamux", ".mov": "qtmux"}  # anything else: mp4mux
CONTAINERS = (".mp4", ".m4v", ".mov", ".mkv")  # what a video: sink writes (mp4mux, qtmux, matroskamux)
GST_PRESETS = {"x264enc": "speed-preset=veryfast", "x265enc": "speed-preset=veryfast"}
# the property that sets an element's keyframe interval (another element named by ?encoder=gst: keeps its own)
GST_GOP = {"x264enc": "key-int-max", "x265enc": "key-int-max", **{e: "iframeinterval" for e in JETSON.values()}}
TRIAL_TIMEOUT_S = 20


def choose(spec: str, codec: str, requested: str = "auto", jetson: bool | None = None) -> tuple[str, str]:
    """(tool, encoder): ("ffmpeg", FFmpeg encoder name) or ("gstreamer", element name); one line naming the
    sink and the fix when the tool or the element is missing."""
    jetson = gstreamer.is_jetson() if jetson is None else jetson
    if requested.startswith("gst:"):
        return "gstreamer", _gst_element(spec, requested[4:])
    if requested == "auto" and jetson and gstreamer.tools_available() is None:
        return "gstreamer", _gst_element(spec, JETSON[codec])
    if shutil.which("ffmpeg") is None:
        raise JetpipeError(f"sink {spec}: needs ffmpeg to encode video: apt install ffmpeg")
    if requested != "auto":
        why = encoder_fails(requested)
        if why:  # it would fail at the first frame, the sink counting failures from then on
            raise JetpipeError(f"sink {spec}: encoder {requested!r} cannot encode here ({why}): choose another "
                               f"?encoder= ({SOFTWARE[codec]}, {NVENC[codec]} where NVENC works) or auto")
        return "ffmpeg", requested
    return "ffmpeg", NVENC[codec] if nvenc_works(codec) else SOFTWARE[codec]


@functools.cache
def encoder_fails(name: str) -> str | None:
    """Why FFmpeg's encoder `name` cannot encode here (not built in, no device, ...), or None: one small frame
    is encoded as a trial."""
    trial = subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-f", "lavfi", "-i", "color=s=256x256:d=0.04",
                            "-frames:v", "1", "-c:v", name, "-f", "null", "-"], capture_output=True, text=True,
                           timeout=TRIAL_TIMEOUT_S)
    if trial.returncode == 0:
        return None
    return (trial.stderr.strip().splitlines() or ["no message"])[0][:160]


@functools.cache
def nvenc_works(codec: str) -> bool:
    """Whether FFmpeg's NVENC encodes here: listed, and one small frame encodes (a GPU with NVENC, its driver)."""
    name = NVENC[codec]
    listed = subprocess.run(["ffmpeg", "-hide_banner", "-encoders"], capture_output=True, text=True,
                            timeout=TRIAL_TIMEOUT_S).stdout
    if f" {name} " not in listed:
        return False
    why = encoder_fails(name)
    if why:
        log.info("video sinks: %s is built into ffmpeg but cannot encode here (%s): using %s", name, why,
                 SOFTWARE[codec])
        return False
    return True


# where each element of a video sink's GStreamer pipeline comes from (Debian's package names)
GST_PACKAGES = {"fdsrc": "gstreamer1.0-tools", "filesink": "gstreamer1.0-tools",
                "rawvideoparse": "gstreamer1.0-plugins-base", "videoconvert": "gstreamer1.0-plugins-base",
                "h264parse": "gstreamer1.0-plugins-bad", "h265parse": "gstreamer1.0-plugins-bad",
                "mp4mux": "gstreamer1.0-plugins-good", "qtmux": "gstreamer1.0-plugins-good",
                "matroskamux": "gstreamer1.0-plugins-good", "nvvidconv": "JetPack's GStreamer plugins"}


def check_gst_pipeline(spec: str, element: str, codec: str, path: Path) -> None:
    """Every element the sink's pipeline names is there, before a frame: a GStreamer partly installed (x264enc
    without a muxer) started, said "Broken pipe" ten times, wrote nothing and exited 0 (issue 49)."""
    needed = ["fdsrc", "rawvideoparse", "videoconvert", *(["nvvidconv"] if element in JETSON.values() else []),
              gstreamer.PARSERS[codec], _muxer(path), "filesink"]
    for name in needed:
        if not gst_has(name):
            raise JetpipeError(f"sink {spec}: GStreamer has no element {name!r} here, which writing with {element} "
                               f"needs: apt install {GST_PACKAGES.get(name, 'its GStreamer plugin package')}")


def _gst_element(spec: str, element: str) -> str:
    missing = gstreamer.tools_available()
    if missing:
        raise JetpipeError(f"sink {spec}: encoding with GStreamer needs {missing}")
    if not gst_has(element):
        raise JetpipeError(f"sink {spec}: GStreamer has no element {element!r} here (x264enc: apt install "
                           "gstreamer1.0-plugins-ugly; nvv4l2h264enc: a Jetson with JetPack)")
    return element


def gst_has(element: str) -> bool:
    return subprocess.run(["gst-inspect-1.0", element], capture_output=True).returncode == 0


def _muxer(path: Path) -> str:
    return MUXERS.get(Path(path).suffix.lower(), "mp4mux")


def fragmented(path: Path) -> bool:
    """MP4 and MOV are written as fragments, a keyframe each second: a file whose writer is killed (systemd's
    SIGKILL after TimeoutStopSec takes the encoder too) plays up to its last second, where a plain MP4 has no
    index (moov) until the end and does not open at all. Matroska plays cut short as it is."""
    return Path(path).suffix.lower() != ".mkv"


def ffmpeg_argv(encoder: str, codec: str, size_hw: tuple[int, int], fps: float, path: Path) -> list[str]:
    argv = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y", "-f", "rawvideo",
            "-pix_fmt", "bgr24", "-s", f"{size_hw[1]}x{size_hw[0]}", "-r", f"{fps:g}", "-i", "pipe:0",
            "-c:v", encoder, "-pix_fmt", "yuv420p", "-g", str(max(1, round(fps)))]
    if fragmented(path):
        argv += ["-movflags", "+frag_keyframe+empty_moov+default_base_moof"]
    if encoder == "libx264":
        argv += ["-preset", "veryfast"]
    if encoder == "libx265":
        argv += ["-preset", "veryfast", "-x265-params", "log-level=error"]
    if codec == "hevc":
        argv += ["-tag:v", "hvc1"]  # what players expect of HEVC in MP4
    return [*argv, str(path)]


def gst_argv(element: str, codec: str, size_hw: tuple[int, int], fps: float, path: Path) -> list[str]:
    """gst-launch-1.0 reading BGR frames on stdin; -e: an interrupt still ends the file properly."""
    height, width = size_hw
    rate = Fraction(fps).limit_denominator(1001)
    gop = max(1, round(fps))  # a keyframe a second: a fragment a second
    encode = " ".join(filter(None, [element, GST_PRESETS.get(element),
                                    f"{GST_GOP[element]}={gop}" if element in GST_GOP else None]))
    if element in JETSON.values():  # the hardware encoder takes NV12 in NVMM memory
        encode = f"nvvidconv ! video/x-raw(memory:NVMM),format=NV12 ! {encode}"
    muxer = _muxer(path)
    if fragmented(path):
        muxer += " fragment-duration=1000"
    pipeline = (f"fdsrc fd=0 ! rawvideoparse format=bgr width={width} height={height} "
                f"framerate={rate.numerator}/{rate.denominator} ! videoconvert ! video/x-raw,format=I420 ! "
                f"{encode} ! {gstreamer.PARSERS[codec]} ! {muxer} ! filesink location={gstreamer.quote(str(path))}")
    # one argv element per token, as the GStreamer sources run theirs (a quoted location keeps its spaces)
    return ["gst-launch-1.0", "-q", "-e", *shlex.split(pipeline)]
