"""`jetpipe serve` configuration: a TOML file or flags, validated at start.

Errors name the key, the bad value and what is allowed.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from jetpipe import limits
from jetpipe.errors import JetpipeError
from jetpipe.limits import MAX_BATCH, MAX_DECODE_PROCESSES, MAX_DECODE_THREADS, MAX_QUEUE_DEPTH, MAX_SIDE, MAX_STREAMS
from jetpipe.pipelines.amounts import parse_bytes, parse_seconds, say_bytes
from jetpipe.pipelines.core import ground
from jetpipe.pipelines.core.events import rules
from jetpipe.pipelines.core.secondary import SecondaryConfig
from jetpipe.pipelines.core.tracking import TRACKERS
from jetpipe.pipelines.core.tracking.appearance import check_reid_bundle
from jetpipe.pipelines.ingest.sources import DECODERS
from jetpipe.pipelines.outputs.sinks import HELP as SINKS_HELP
from jetpipe.pipelines.outputs.sinks import check_sink
from jetpipe.pipelines.service.gpus import plan as gpu_plan
from jetpipe.runtime.cuda import MEMORY_MODES
from jetpipe.runtime.jpeg import ENCODERS as JPEG_ENCODERS
from jetpipe.runtime.open import BACKEND_HELP, BACKENDS, check_backend
from jetpipe.runtime.triton_backend import is_triton
from jetpipe.tasks import TASKS
from jetpipe.uri import SCHEMES, is_loopback

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (JetPack 6)
    import tomli as tomllib


log = logging.getLogger(__name__)

POSTPROCESS_PLACES = ("auto", "gpu", "cpu")
TOKEN_ENV = "JETPIPE_CONTROL_TOKEN"  # the control API's bearer token, kept out of files and process lists
MIN_TOKEN_CHARS = 16  # a shorter bearer token is guessable
_HOST_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*\.?")
MAX_BUDGET_MS = 60_000  # a latency budget beyond a minute is a typo
MAX_BATCH_TIMEOUT_MS = 10_000  # a batch waits at most this for its frames (beyond: every stream stalls)
MAX_FRAMES = 10**12           # --frames: more than a year of 30 fps is no limit; say 0
MAX_DURATION_S = 10 * 366 * 86_400.0  # --duration: ten years (inf parsed and meant nothing: say 0)
MIN_BUDGET_MS = 1.0  # below, no frame can be captured, batched and run in time: every frame would be dropped
# sources a control API caller may start unless the operator says otherwise: cameras and RTSP streams (a gst:
# pipeline runs any GStreamer element, files and http/udp/tcp reach what the daemon's user can)
DEFAULT_CONTROL_SCHEMES = ("csi", "v4l2", "rtsp", "rtsps", "synthetic")


class ConfigError(JetpipeError):
    """The configuration is malformed."""


@dataclass
class SourceConfig:
    uri: str
    loop: bool = False       # files: start again at the end
    realtime: bool = False   # files: pace at the file's frame rate (then dropped like a camera when behind)
    decoder: str = "auto"    # auto | nvdec | ffmpeg | gstreamer | opencv (see jetpipe.pipelines.ingest.sources)
    hwaccel: str = ""        # FFmpeg hardware decoding of files (cuda, qsv, ...); "" = software
    gpu: int | None = None   # with --gpus: the GPU that serves it (None: placed by load)
    moving_camera: bool = False  # it pans, shakes or zooms: its motion measured from its frames, tracks follow
    record: str = ""         # with [record]: all | events | off ("": [record] mode)


@dataclass
class ControlConfig:
    """Streams added and removed while serving (GET/POST/DELETE /streams on the metrics server)."""

    enabled: bool = False
    max_streams: int = 0   # streams served at once, allocated at start-up (0: the sources given)
    token: str = ""        # Authorization: Bearer TOKEN on every control request; required off loopback
    # what a caller may start (control.SourcePolicy): these URI schemes, and files only inside these folders
    allow_schemes: list[str] = field(default_factory=lambda: list(DEFAULT_CONTROL_SCHEMES))
    allow_folders: list[str] = field(default_factory=list)


EVENT_TYPES = ("line_cross", "zone_enter", "zone_exit", "loiter", "occupancy", "speed")


@dataclass
class ClipsConfig:
    """Clips around events (pipelines/outputs/clips/): each stream's compressed packets kept, cut into MP4 files
    without decoding or encoding."""

    folder: str = ""              # where the clips go ("": no clips)
    before_s: float = 5.0         # a clip starts at the last keyframe at or before the event's time - before_s
    after_s: float = 5.0          # and ends at its time + after_s
    on: list[str] = field(default_factory=lambda: ["line_cross", "zone_enter", "loiter", "occupancy"])
    ring_mb: float = 64.0         # the packets kept per stream, at most (before_s + after_s + a GOP of them)
    max_total_mb: float = 0.0     # the folder's clips, at most (the oldest go); 0: 10,000, or with [record] a
    #                               tenth of its max_size (counted in it)
    max_age_h: float = 0.0        # and none older than this (0: no limit)


@dataclass
class SnapshotsConfig:
    """A JPEG of the frame of each event (pipelines/outputs/snapshots.py), encoded on the GPU where it can be."""

    folder: str = ""              # where the pictures go ("": none)
    on: list[str] = field(default_factory=lambda: ["line_cross", "zone_enter", "loiter", "occupancy"])
    box: bool = True              # the events' boxes outlined on the frame
    crop: bool = False            # and a picture of each event's box alone beside it
    quality: int = 90             # JPEG quality, 1-100
    encoder: str = "auto"         # auto (the GPU's nvJPEG where it can be had, else OpenCV) | gpu | cpu
    buffers: int = 8              # frames waiting for the encoder at most (beyond: dropped, counted)
    max_total_mb: float = 0.0     # the folder's pictures, at most (the oldest go); 0: 2,000, or with [record] a
    #                               twentieth of its max_size (counted in it)
    max_age_h: float = 0.0        # and none older than this (0: no limit)


RECORD_MODES = ("all", "events", "off")


@dataclass
class RecordConfig:
    """Continuous recording (pipelines/outputs/recording/): each stream's packets as segment files, an index,
    within a size, an age and a floor of free space. Sizes and ages are parsed at validate() (amounts.py):
    "200MB", "7d"; after it they are bytes and seconds."""

    folder: str = ""              # where the recording goes ("": none)
    mode: str = "all"             # all | events (only the segments within the clips' before_s / after_s of one)
    segment_s: float = 10.0       # a segment's length (it ends at the first keyframe past it)
    max_size: int | str = "10GB"  # the folder at most: segments, the index (the oldest segments go first)
    max_age: float | str = 0      # segments without an event kept this long at most (0: no limit)
    events_max_age: float | str = 0  # segments with an event (0: as long as the size allows)
    min_free: int | str = "1GB"   # the file system's free space kept at least (a disk shared with others)


_SOURCE_KEYS = {"uri": str, "loop": bool, "realtime": bool, "decoder": str, "hwaccel": str, "gpu": int,
                "moving_camera": bool, "record": str}
_CLIPS_KEYS = {"folder": str, "before_s": (int, float), "after_s": (int, float), "on": list, "ring_mb": (int, float),
               "max_total_mb": (int, float), "max_age_h": (int, float)}
_SNAPSHOTS_KEYS = {"folder": str, "on": list, "box": bool, "crop": bool, "quality": int, "encoder": str,
                   "buffers": int, "max_total_mb": (int, float), "max_age_h": (int, float)}
_RECORD_KEYS = {"folder": str, "mode": str, "segment_s": (int, float), "max_size": (int, str),
                "max_age": (int, float, str), "events_max_age": (int, float, str), "min_free": (int, str)}
_CONTROL_KEYS = {"enabled": bool, "max_streams": int, "token": str, "allow_schemes": list, "allow_folders": list}
_SECONDARY_KEYS = {"bundle": str, "name": str, "classes": list, "min_size": int, "max_per_frame": int,
                   "direction": str, "direction_threshold": (int, float), "every_track": int, "backend": str,
                   "priority": str}


@dataclass
class PipelineConfig:
    bundle: Path
    sources: list[SourceConfig]
    sinks: list[str] = field(default_factory=list)
    max_batch: int | None = None       # default: the bundle's
    batch_timeout_ms: float = 5.0      # 16 x 1080p30 on an H100: p99 25.8 ms at 5, 42 ms at 20 (docs/lab/benchmarks.md)
    latency_budget_ms: float = 0.0     # capture to results: batches cut to keep it (0: off, batch_timeout_ms only)
    queue_depth: int = 4               # frames per stream waiting to be batched
    capture_threads: int = 0           # threads reading the streams that can share one (NVDEC files): 0 = auto
    decode_processes: int | str = "auto"  # processes NVDEC files are decoded in (0: this one; auto: decode_choice)
    decode_threads: int = 0            # decoding threads in each (0: a thread a stream, 4 at most)
    backend: str = "auto"
    memory: str = "auto"
    task: str | None = None            # default: the bundle's
    postprocess: str = "auto"          # auto (GPU with the GPU runtime) | gpu | cpu
    tracker: str = "none"              # none | iou | bytetrack | botsort: a track_id per detected box
    reid: str = ""                     # botsort's looks: "colour" (the built-in cue) or an embedding bundle
    reid_in_events: bool = False       # an object's event carries its track's look (float16, base64)
    frames: int = 0                    # stop each source after N frames (0: no limit)
    duration: float = 0.0              # stop after S seconds (0: until SIGTERM)
    metrics_listen: str = "127.0.0.1:9108"   # "" disables /metrics and /healthz
    metrics_hosts: list[str] = field(default_factory=list)  # Host names it answers to beyond the defaults
    max_frame_hw: tuple[int, int] = (1080, 1920)  # frame buffers' bound; not set: the video files' largest
    max_frame_set: bool = False        # max_frame_hw given ([pipeline], --max-frame-size): a bound, not sized
    reconnect_max_s: float = 10.0
    log_every_s: float = 5.0
    stall_timeout_s: float = 0.0       # a live stream without a frame this long reconnects (0: max(5 s, 10 frames))
    fail_timeout_s: float = 30.0       # every batch failing this long stops serve, exit 1 (0: never)
    stop_timeout_s: float = 20.0       # a stop's drain at most this long, then the queued frames go (0: no bound)
    secondaries: list[SecondaryConfig] = field(default_factory=list)  # models run on the primary's boxes
    control: ControlConfig = field(default_factory=ControlConfig)
    clips: ClipsConfig = field(default_factory=ClipsConfig)
    record: RecordConfig = field(default_factory=RecordConfig)
    snapshots: SnapshotsConfig = field(default_factory=SnapshotsConfig)
    zones: list = field(default_factory=list)   # events.Zone: [[zone]] tables, --zone
    lines: list = field(default_factory=list)   # events.Line: [[line]] tables, --line
    calibrations: list = field(default_factory=list)  # ground.Calibration: [[calibration]], a stream's ground plane
    gpus: list[int] | str | None = None  # "all" or GPU numbers: a worker per GPU (pipelines/service/gpus); None: one
    workers_per_gpu: int | str = "auto"  # serving processes a GPU (> 1: behind the face; auto: workers_choice)
    model_instances: int | str = "auto"  # copies of the primary model running batches at once (ONNX Runtime
    #                                      CUDA; auto: two where the streams come near the model's rate, else one)


_PIPELINE_KEYS = {"bundle": str, "max_batch": int, "batch_timeout_ms": (int, float),
                  "latency_budget_ms": (int, float), "queue_depth": int, "capture_threads": int,
                  "decode_processes": (int, str), "decode_threads": int,
                  "backend": str, "memory": str, "task": str, "postprocess": str, "tracker": str, "reid": str,
                  "reid_in_events": bool, "frames": int,
                  "duration": (int, float), "max_frame_hw": list, "reconnect_max_s": (int, float),
                  "stall_timeout_s": (int, float), "fail_timeout_s": (int, float), "stop_timeout_s": (int, float),
                  "log_every_s": (int, float), "gpus": (str, list), "workers_per_gpu": (int, str),
                  "model_instances": (int, str)}
_TABLES = {"pipeline", "source", "sink", "metrics", "secondary", "control", "clips", "snapshots", "zone",
           "line", "calibration", "record"}


def _check_keys(where: str, table: dict, allowed) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key {key!r}; allowed: {', '.join(sorted(allowed))}")


def load(path: str | Path) -> PipelineConfig:
    """The config file, checked whole."""
    return validate(read(path), str(path))


def read(path: str | Path, bundle: Path | None = None) -> PipelineConfig:
    """The config file's tables, not yet checked as a whole (validate(): the command line's flags may still
    complete it, e.g. with --source; bundle: --bundle's, where the file need not name one)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config {path} is a folder: name the TOML file, e.g. {path / 'jetpipe.toml'}")
    if not path.is_file():
        raise ConfigError(f"config {path} not found")
    try:
        # TOML is UTF-8 whatever the locale says; a byte-order mark (Windows editors write one) is dropped
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}): "
                          "TOML files are UTF-8; save it as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"config {path} cannot be read ({exc.strerror})") from None
    _check_keys(str(path), data, _TABLES)
    pipeline = data.get("pipeline", {})
    _check_keys(f"{path} [pipeline]", pipeline, _PIPELINE_KEYS)
    _check_types(f"{path} [pipeline]", pipeline, _PIPELINE_KEYS)
    if "bundle" not in pipeline and bundle is None:
        raise ConfigError(f"{path}: [pipeline] bundle is required (a folder written by `jetpipe convert`; or --bundle)")
    sources = [SourceConfig(**t) for t in _tables(path, data, "source", _SOURCE_KEYS, "uri", "")]
    sinks = [t["uri"] for t in _tables(path, data, "sink", {"uri": str}, "uri", f" ({SINKS_HELP})")]
    secondaries = [SecondaryConfig(**{**t, "bundle": Path(t["bundle"]), "classes": tuple(t.get("classes", ())),
                                      **({"direction": Path(t["direction"])} if "direction" in t else {})})
                   for t in _tables(path, data, "secondary", _SECONDARY_KEYS, "bundle",
                                    " (a folder written by `jetpipe convert`)")]
    metrics = data.get("metrics", {})
    _check_keys(f"{path} [metrics]", metrics, {"listen", "hosts"})
    _check_types(f"{path} [metrics]", metrics, {"listen": str, "hosts": list})
    control = data.get("control", {})
    _check_keys(f"{path} [control]", control, _CONTROL_KEYS)
    _check_types(f"{path} [control]", control, _CONTROL_KEYS)
    clips = data.get("clips", {})
    _check_keys(f"{path} [clips]", clips, _CLIPS_KEYS)
    _check_types(f"{path} [clips]", clips, _CLIPS_KEYS)
    record = data.get("record", {})
    _check_keys(f"{path} [record]", record, _RECORD_KEYS)
    _check_types(f"{path} [record]", record, _RECORD_KEYS)
    snapshots = data.get("snapshots", {})
    _check_keys(f"{path} [snapshots]", snapshots, _SNAPSHOTS_KEYS)
    _check_types(f"{path} [snapshots]", snapshots, _SNAPSHOTS_KEYS)
    zones = [rules.from_table(t, "zone", f"{path} [[zone]] #{i + 1}")
             for i, t in enumerate(_array_of_tables(path, data, "zone"))]
    lines = [rules.from_table(t, "line", f"{path} [[line]] #{i + 1}")
             for i, t in enumerate(_array_of_tables(path, data, "line"))]
    try:
        calibrations = [ground.from_table(t, f"{path} [[calibration]] #{i + 1}")
                        for i, t in enumerate(_array_of_tables(path, data, "calibration"))]
    except ground.CalibrationError as exc:
        raise ConfigError(str(exc)) from None
    options = {k: v for k, v in pipeline.items() if k != "bundle"}
    if "max_frame_hw" in options:
        options["max_frame_hw"], options["max_frame_set"] = tuple(options["max_frame_hw"]), True
    config = PipelineConfig(bundle=bundle or Path(pipeline["bundle"]), sources=sources, sinks=sinks,
                            secondaries=secondaries,
                            control=ControlConfig(**control), clips=ClipsConfig(**clips), record=RecordConfig(**record),
                            snapshots=SnapshotsConfig(**snapshots), zones=zones, lines=lines,
                            calibrations=calibrations, **options)
    if "listen" in metrics:
        config.metrics_listen = str(metrics["listen"])
    config.metrics_hosts = list(metrics.get("hosts", []))
    return config


def _check_listen(listen: str, where: str) -> None:
    """'' (off) or HOST:PORT with a port from 1 to 65535."""
    if not listen:
        return
    _host, _, port = listen.rpartition(":")
    if not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ConfigError(f"{where}: metrics listen = {listen!r}: write HOST:PORT with a port from 1 to 65535 "
                          "(e.g. 127.0.0.1:9108), or '' to turn the metrics server off")


def source_from_table(table, where: str) -> SourceConfig:
    """A source spec given as a table (a POST /streams body): the keys and types a [[source]] takes, then the
    same checks as the config's sources. ConfigError names what is wrong."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected an object with a uri, e.g. {{\"uri\": \"rtsp://camera/stream\"}}")
    _check_keys(where, table, _SOURCE_KEYS)
    if "uri" not in table:
        raise ConfigError(f"{where}: uri is required")
    _check_types(where, table, _SOURCE_KEYS)
    source = SourceConfig(**table)
    _check_source(source, where)
    return source


def _tables(path: Path, data: dict, name: str, keys: dict, required: str, hint: str) -> list[dict]:
    """The [[name]] tables, each checked: known keys, the required one present (`hint` says what it is),
    value types."""
    tables = _array_of_tables(path, data, name)
    for i, table in enumerate(tables):
        where = f"{path} [[{name}]] #{i + 1}"
        _check_keys(where, table, keys)
        if required not in table:
            raise ConfigError(f"{where}: {required} is required{hint}")
        _check_types(where, table, keys)
    return tables


def _array_of_tables(path: Path, data: dict, name: str) -> list[dict]:
    value = data.get(name, [])
    if isinstance(value, dict):
        raise ConfigError(f"{path}: [{name}] is one table; write [[{name}]] (an array of tables, one per {name})")
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ConfigError(f"{path}: {name} = {str(value)[:80]!r} is not a table: write each {name} as a "
                          f"[[{name}]] table of its own, e.g. [[source]] with uri = \"synthetic\" below it")
    return value


def _check_types(where: str, table: dict, kinds: dict) -> None:
    for key, kind in kinds.items():
        value = table.get(key)
        if key in table and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
            raise ConfigError(f"{where} {key} = {value!r}: expected {_kind_name(kind)}")


def _kind_name(kind) -> str:
    names = {str: "a string", int: "an integer", list: "a list", (int, float): "a number",
             bool: "true or false", (str, list): "a string or a list", (int, str): "an integer or a string",
             (int, float, str): "a number or a string"}
    return names.get(kind, str(kind))


def _check_source(src: SourceConfig, where: str) -> None:
    if not src.uri.strip():
        raise ConfigError(f"{where}: source uri is empty: write a video file, a camera or a stream URI")
    if src.decoder not in DECODERS:
        raise ConfigError(f"{where}: source {src.uri!r}: decoder = {src.decoder!r}: allowed {' | '.join(DECODERS)}")
    if src.record and src.record not in RECORD_MODES:
        raise ConfigError(f"{where}: source {src.uri!r}: record = {src.record!r}: allowed {' | '.join(RECORD_MODES)}")
    if src.hwaccel and not src.hwaccel.replace("_", "").isalnum():
        raise ConfigError(f"{where}: source {src.uri!r}: hwaccel = {src.hwaccel!r}: an FFmpeg hardware device "
                          "type such as cuda or qsv ('jetpipe doctor' lists them)")


def _check_metrics_hosts(config: PipelineConfig, where: str) -> None:
    for name in config.metrics_hosts:
        if not (isinstance(name, str) and (name == "*" or _HOST_NAME.fullmatch(name))):
            raise ConfigError(f"{where}: metrics hosts: {name!r} is not a host name: names such as edge-7 or "
                              "edge-7.example.com that clients put in Host, or \"*\" for any (behind a proxy "
                              "that checks them)")


def _check_source_policy(control: ControlConfig, where: str) -> None:
    """The schemes and folders the control API may start sources from: known schemes, existing folders."""
    for scheme in control.allow_schemes:
        if scheme not in SCHEMES or scheme == "file":
            raise ConfigError(f"{where}: control allow_schemes: {scheme!r}: choose from "
                              f"{', '.join(s for s in SCHEMES if s != 'file')} (files: allow_folders, "
                              "--control-folder DIR)")
    for folder in control.allow_folders:
        if not isinstance(folder, str) or not os.path.isdir(folder):
            raise ConfigError(f"{where}: control allow_folders: {folder!r} is not a folder: name an existing "
                              "folder whose files the control API may serve")
        if os.path.realpath(folder) == "/":
            log.warning("control API: every file this user can read may be served (allow_folders includes /)")


def _check_control(config: PipelineConfig, where: str) -> None:
    control = config.control
    _check_source_policy(control, where)
    given = control.token or os.environ.get(TOKEN_ENV, "")
    control.token = given.strip()  # a Secret file's newline: the header's token arrives stripped
    if given and (not control.token or any(c.isspace() for c in control.token)):
        raise ConfigError(f"{where}: the control token {'is only spaces' if not control.token else 'holds spaces'}: "
                          "a bearer token is one word (e.g. `openssl rand -hex 16`)")
    if not 0 <= control.max_streams <= MAX_STREAMS:
        raise ConfigError(f"{where}: control max_streams = {control.max_streams}: from 0 (the sources given) to "
                          f"{MAX_STREAMS}")
    if control.token and len(control.token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"{where}: the control token has {len(control.token)} characters: use at least "
                          f"{MIN_TOKEN_CHARS} (e.g. `openssl rand -hex 16`)")
    if not control.enabled:
        return
    if control.max_streams and control.max_streams < len(config.sources):
        raise ConfigError(f"{where}: control max_streams = {control.max_streams} is fewer than the "
                          f"{len(config.sources)} sources given: raise it, or leave it 0 (the sources given)")
    if not (control.max_streams or config.sources):
        raise ConfigError(f"{where}: the control API with no source needs room for one: set [control] max_streams "
                          "(or --max-streams N)")
    if not config.metrics_listen:
        raise ConfigError(f"{where}: the control API is served by the metrics server, which is off: set "
                          "--metrics HOST:PORT ([metrics] listen)")
    if not control.token and not is_loopback(config.metrics_listen):
        raise ConfigError(f"{where}: the control API on {config.metrics_listen} (not loopback) needs a bearer "
                          f"token: set {TOKEN_ENV} (or [control] token), or listen on 127.0.0.1")


def _check_clips(config: PipelineConfig, where: str) -> None:
    """Bounds, the event types, and a folder this user can write (made where missing)."""
    clips = config.clips
    if not clips.folder:
        return
    if clips.max_total_mb == 0:  # auto (a recording's budget then counts it: _check_record)
        clips.max_total_mb = CLIPS_AUTO_MB
    for key, low, high in (("before_s", 0.0, 300.0), ("after_s", 0.0, 300.0), ("ring_mb", 1.0, 4096.0),
                           ("max_total_mb", 1.0, 1e9), ("max_age_h", 0.0, 1e6)):
        value = getattr(clips, key)
        if not low <= value <= high:
            raise ConfigError(f"{where}: clips {key} = {value}: from {low:g} to {high:g}")
    if clips.before_s + clips.after_s <= 0:
        raise ConfigError(f"{where}: clips before_s + after_s = 0: a clip needs a length")
    _check_event_types(clips.on, f"{where}: clips on")
    _check_folder(Path(clips.folder), f"{where}: clips folder")


MIN_RECORD_BYTES = 4_000_000  # the index and one short segment; a stream's own need is checked as it opens


def _check_record(config: PipelineConfig, where: str) -> None:
    """Sizes and ages parsed and bounded, the mode, and a folder this user can write (made where missing). What
    the streams' bit rates need of the budget is checked as they open (recording.recorder)."""
    record = config.record
    if not record.folder:
        if any(s.record for s in config.sources):
            raise ConfigError(f"{where}: a source sets record, and nothing is recorded: add --record DIR "
                              "([record] folder)")
        return
    if record.mode not in RECORD_MODES[:2]:
        raise ConfigError(f"{where}: record mode = {record.mode!r}: allowed all | events (a source's record = "
                          "\"off\" leaves it out)")
    if not 2.0 <= record.segment_s <= 600.0:
        raise ConfigError(f"{where}: record segment_s = {record.segment_s}: seconds from 2 to 600")
    for key, parse, flag in (("max_size", parse_bytes, "--record-max-size"), ("min_free", parse_bytes, ""),
                             ("max_age", parse_seconds, "--record-max-age"), ("events_max_age", parse_seconds, "")):
        try:
            setattr(record, key, parse(getattr(record, key)))
        except ValueError as exc:
            raise ConfigError(f"{where}: record {key} ({flag or '[record]'}): {exc}") from None
    if not MIN_RECORD_BYTES <= record.max_size <= 10**16:
        raise ConfigError(f"{where}: record max_size = {say_bytes(record.max_size)}: from "
                          f"{say_bytes(MIN_RECORD_BYTES)} (the index and a segment) to 10 PB")
    _share_record_budget(config, where)
    if record.max_age and record.events_max_age and record.events_max_age < record.max_age:
        raise ConfigError(f"{where}: record events_max_age is shorter than max_age: segments with events are kept "
                          "longer, not shorter")
    _check_folder(Path(record.folder), f"{where}: record folder")
    if config.metrics_listen and not config.control.token and not is_loopback(config.metrics_listen):
        raise ConfigError(f"{where}: the review API (/review) on {config.metrics_listen} (not loopback) serves the "
                          f"recordings and needs a bearer token: set {TOKEN_ENV} (or [control] token), or listen on "
                          "127.0.0.1")


CLIPS_AUTO_MB, SNAPSHOTS_AUTO_MB = 10_000.0, 2_000.0  # without a recording
CLIPS_SHARE, SNAPSHOTS_SHARE = 0.10, 0.05  # of a recording's max_size, where their own is not set


def _share_record_budget(config: PipelineConfig, where: str) -> None:
    """Clips and snapshots are counted in the recording's max_size: theirs, where not set, is a share of it, and
    what they may hold is kept from the segments (media_reserve)."""
    record = config.record
    for table, share in ((config.clips, CLIPS_SHARE), (config.snapshots, SNAPSHOTS_SHARE)):
        if table.folder and table.max_total_mb == 0:
            table.max_total_mb = round(record.max_size * share / 1e6, 3)
    left = record.max_size - media_reserve(config)
    if left < MIN_RECORD_BYTES:
        raise ConfigError(f"{where}: record max_size = {say_bytes(record.max_size)} leaves "
                          f"{say_bytes(max(left, 0))} for the recording after the clips' and snapshots' "
                          f"max_total_mb: raise --record-max-size or lower theirs")


def media_reserve(config: PipelineConfig) -> int:
    """Bytes of a recording's budget the clips and snapshots may hold: their max_total_mb (each writer makes room
    before it writes: retention.Room), with the blocks their files take beyond their bytes."""
    reserve = 0
    if config.clips.folder:
        reserve += int((config.clips.max_total_mb or CLIPS_AUTO_MB) * 1e6 * 1.01)
    if config.snapshots.folder:
        reserve += int((config.snapshots.max_total_mb or SNAPSHOTS_AUTO_MB) * 1e6 * 1.02)
    return reserve


def _check_snapshots(config: PipelineConfig, where: str) -> None:
    """Bounds, the event types, the encoder's name, and a folder this user can write (made where missing)."""
    snapshots = config.snapshots
    if not snapshots.folder:
        return
    if snapshots.max_total_mb == 0:
        snapshots.max_total_mb = SNAPSHOTS_AUTO_MB
    for key, low, high in (("quality", 1, 100), ("buffers", 1, 256), ("max_total_mb", 1.0, 1e9),
                           ("max_age_h", 0.0, 1e6)):
        value = getattr(snapshots, key)
        if not low <= value <= high:
            raise ConfigError(f"{where}: snapshots {key} = {value}: from {low:g} to {high:g}")
    if snapshots.encoder not in JPEG_ENCODERS:
        raise ConfigError(f"{where}: snapshots encoder = {snapshots.encoder!r}: choose {', '.join(JPEG_ENCODERS)}")
    _check_event_types(snapshots.on, f"{where}: snapshots on")
    _check_folder(Path(snapshots.folder), f"{where}: snapshots folder")
    if not (config.zones or config.lines or config.control.enabled):
        log.warning("snapshots are taken of events, and no zone or line makes any: add --zone or --line")


def _check_event_types(types: list, where: str) -> None:
    if not types or any(t not in EVENT_TYPES for t in types):
        raise ConfigError(f"{where} = {types}: event types from {', '.join(EVENT_TYPES)}")


def _check_folder(folder: Path, where: str) -> None:
    """A folder this user can write, made where it is missing; one line otherwise."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{where} {folder} is not a folder this user can write: name one")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{where} {folder}: cannot make it ({exc.strerror}): name a folder this user can "
                          "write") from None
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{where} {folder} is not a folder this user can write: name one")


def validate(config: PipelineConfig, where: str = "config") -> PipelineConfig:
    if not config.sources and not config.control.enabled:
        raise ConfigError(f"{where}: no source: add a [[source]] uri (or --source), e.g. synthetic")
    checks = [
        (config.max_batch is None or config.max_batch >= 1, "max_batch", "a positive integer"),
        (0 <= config.batch_timeout_ms <= MAX_BATCH_TIMEOUT_MS, "batch_timeout_ms",
         f"milliseconds from 0 to {MAX_BATCH_TIMEOUT_MS:,}"),
        (config.latency_budget_ms == 0 or MIN_BUDGET_MS <= config.latency_budget_ms <= MAX_BUDGET_MS,
         "latency_budget_ms", f"0 (off) or milliseconds from {MIN_BUDGET_MS} to {MAX_BUDGET_MS}"),
        (1 <= config.queue_depth <= MAX_QUEUE_DEPTH, "queue_depth", f"an integer from 1 to {MAX_QUEUE_DEPTH}"),
        (0 <= config.capture_threads <= MAX_STREAMS, "capture_threads",
         f"an integer from 0 (auto: half the cores) to {MAX_STREAMS}"),
        (config.decode_processes == "auto" or (type(config.decode_processes) is int
                                                and 0 <= config.decode_processes <= MAX_DECODE_PROCESSES),
         "decode_processes", f"auto (where they pay) or an integer from 0 (decode in the serving process) to "
                             f"{MAX_DECODE_PROCESSES}"),
        (0 <= config.decode_threads <= MAX_DECODE_THREADS, "decode_threads",
         f"an integer from 0 (auto: a thread a stream, 4 at most) to {MAX_DECODE_THREADS}"),
        (config.backend in BACKENDS or is_triton(config.backend), "backend", BACKEND_HELP),
        (config.memory in MEMORY_MODES, "memory", " | ".join(MEMORY_MODES)),
        (config.postprocess in POSTPROCESS_PLACES, "postprocess", " | ".join(POSTPROCESS_PLACES)),
        (config.tracker in TRACKERS, "tracker", " | ".join(TRACKERS)),
        (0 <= config.frames <= MAX_FRAMES, "frames", f"an integer from 0 (no limit) to {MAX_FRAMES:,}"),
        (0 <= config.duration <= MAX_DURATION_S, "duration", f"seconds from 0 (no limit) to {MAX_DURATION_S:,.0f}"),
        (0.01 <= config.reconnect_max_s <= 3600, "reconnect_max_s", "seconds from 0.01 to 3600"),
        (0.1 <= config.log_every_s <= 1e9, "log_every_s", "seconds from 0.1 to 1e9 (1e9: never)"),
        (0 <= config.stall_timeout_s <= 3600, "stall_timeout_s", "seconds from 0 (auto: max(5, 10 frame periods)) "
                                                                 "to 3600"),
        (0 <= config.fail_timeout_s <= 86400, "fail_timeout_s", "seconds from 0 (never) to 86400"),
        (0 <= config.stop_timeout_s <= 3600, "stop_timeout_s", "seconds from 0 (no bound) to 3600"),
        (len(config.max_frame_hw) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_SIDE
                                                for v in config.max_frame_hw), "max_frame_hw",
         f"[height, width], two integers from 1 to {MAX_SIDE}"),
        (config.max_batch is None or config.max_batch <= MAX_BATCH, "max_batch", f"at most {MAX_BATCH}"),
        (config.workers_per_gpu == "auto" or (type(config.workers_per_gpu) is int
                                               and 1 <= config.workers_per_gpu <= limits.MAX_WORKERS_PER_GPU),
         "workers_per_gpu", f"auto (two where CUDA MPS runs and 24 or more cameras share a GPU) or an integer "
                            f"from 1 to {limits.MAX_WORKERS_PER_GPU}"),
        (config.model_instances == "auto" or (type(config.model_instances) is int
                                              and 1 <= config.model_instances <= limits.MAX_MODEL_INSTANCES),
         "model_instances", f"auto (two where the streams come near the model's rate) or an integer from 1 to "
                            f"{limits.MAX_MODEL_INSTANCES}"),
    ]
    for ok, key, allowed in checks:
        if not ok:
            raise ConfigError(f"{where}: {key} = {getattr(config, key)!r}: allowed {allowed}")
    if config.decode_threads and config.decode_processes == 0:
        raise ConfigError(f"{where}: decode_threads = {config.decode_threads} sets the threads of decode processes, "
                          "and there are none: add decode_processes = N (--decode-processes N)")
    _check_listen(config.metrics_listen, where)
    _check_metrics_hosts(config, where)
    _check_control(config, where)
    if is_triton(config.backend):
        check_backend(config.backend)
    for secondary in config.secondaries:
        if secondary.backend:
            try:
                check_backend(secondary.backend)
            except JetpipeError as exc:
                raise ConfigError(f"{where}: secondary {secondary.label!r}: {exc}") from None
        elif is_triton(config.backend):
            raise ConfigError(f"{where}: secondary {secondary.label!r}: the primary runs on a Triton server "
                              f"({config.backend}); give the secondary its own backend in its [[secondary]] table: "
                              "backend = 'triton://HOST:PORT/NAME' (its model on a server) or 'auto' (run it here)")
    for src in config.sources:
        _check_source(src, where)
    _check_sinks(config, where)
    for secondary in config.secondaries:
        if any(not isinstance(c, (str, int)) or isinstance(c, bool) for c in secondary.classes):
            raise ConfigError(f"{where}: secondary {secondary.label!r}: classes = {list(secondary.classes)}: class "
                              "names (strings) or numbers")
    if len({s.label for s in config.secondaries}) != len(config.secondaries):
        raise ConfigError(f"{where}: two secondaries are named alike ({', '.join(s.label for s in config.secondaries)})"
                          ": give each a name")
    if config.task is not None:
        if config.task not in TASKS:
            raise ConfigError(f"{where}: task = {config.task!r}: allowed {' | '.join(TASKS)}")
    _check_calibrations(config, where)
    _check_rules(config, where)
    _check_moving_cameras(config, where)
    _check_reid(config, where)
    for rule in (r for r in [*config.zones, *config.lines] if r.speed_limit_kmh):
        check_speed_rule(rule, {c.stream: c for c in config.calibrations}, where)
    _check_record(config, where)  # first: it sizes the clips' and the snapshots' shares of its budget
    _check_clips(config, where)
    _check_snapshots(config, where)
    _check_gpus(config, where)
    return config


def _check_gpus(config: PipelineConfig, where: str) -> None:
    """--gpus and the streams' pins (their numbers; the GPUs themselves are looked at when serving starts)."""
    for spec in config.sources:
        if spec.gpu is not None and not 0 <= spec.gpu < limits.MAX_GPUS:
            raise ConfigError(f"{where}: source {spec.uri!r}: gpu = {spec.gpu}: a GPU number from 0 to "
                              f"{limits.MAX_GPUS - 1}")
    flag = "--gpus"
    if config.workers_per_gpu != "auto" and config.workers_per_gpu > 1 and config.gpus is None:
        config.gpus, flag = [0], "--workers-per-gpu"  # the GPU one process serves on: its workers behind the face
    try:
        if config.gpus is not None:
            config.gpus = gpu_plan.parse(config.gpus, where)
        gpu_plan.check(config, where, flag)
    except gpu_plan.GpuError as exc:
        raise ConfigError(str(exc)) from None


def _check_sinks(config: PipelineConfig, where: str) -> None:
    """Each sink's URI and options (a broker's too, without connecting to it)."""
    for uri in config.sinks:
        try:
            check_sink(uri)
        except JetpipeError as exc:
            raise ConfigError(f"{where}: {exc}") from None


def _check_moving_cameras(config: PipelineConfig, where: str) -> None:
    """A moving camera's tracks follow its motion in botsort: with another tracker or none, one line."""
    moving = [s for s in config.sources if s.moving_camera]
    if moving and config.tracker != "botsort":
        raise ConfigError(f"{where}: source {moving[0].uri!r}: moving_camera = true moves its tracks with the "
                          f"camera, which botsort does (tracker = {config.tracker!r}): set tracker = \"botsort\"")


def _check_reid(config: PipelineConfig, where: str) -> None:
    """Looks are botsort's (with another tracker or none, one line), from the colour cue or an embedding
    bundle (checked here: a bundle of another task is one line); without a tracker botsort is turned on."""
    if config.reid_in_events and not config.reid:
        raise ConfigError(f"{where}: reid_in_events = true puts the tracks' looks in the events: give the tracker "
                          "looks with reid = \"colour\" or an embedding bundle (--reid)")
    if not config.reid:
        return
    if config.tracker == "none":
        log.info("reid = %r gives the tracker looks: tracker botsort turned on", config.reid)
        config.tracker = "botsort"
    if config.tracker != "botsort":
        raise ConfigError(f"{where}: reid = {config.reid!r} gives botsort the objects' looks; tracker = "
                          f"{config.tracker!r}: set tracker = \"botsort\" (--tracker botsort)")
    try:
        check_reid_bundle(config.reid, f"{where}: reid")
    except JetpipeError as exc:
        raise ConfigError(str(exc)) from None


def _check_calibrations(config: PipelineConfig, where: str) -> None:
    """Each stream's ground plane (those made in code too): one a stream, of a stream that exists (with the
    control API any ID may come later); positions and speeds need tracks, so botsort is turned on without a
    tracker."""
    seen: set[int] = set()
    for calibration in config.calibrations:
        at = f"{where}: calibration of stream {calibration.stream}"
        try:
            ground.check(calibration, at)
        except ground.CalibrationError as exc:
            raise ConfigError(str(exc)) from None
        if calibration.stream in seen:
            raise ConfigError(f"{at}: the stream has two calibrations: keep one")
        if calibration.stream >= len(config.sources) and not config.control.enabled:
            raise ConfigError(f"{at}: the stream does not exist (the streams are 0 to {len(config.sources) - 1})")
        if calibration.stream < len(config.sources) and config.sources[calibration.stream].moving_camera:
            raise ConfigError(f"{at}: the source is a moving camera (moving_camera = true): a ground plane is "
                              "measured from a fixed view; calibrate a fixed camera, or drop one of the two")
        seen.add(calibration.stream)
    if config.calibrations and config.tracker == "none":
        log.info("calibrated streams give tracks' positions and speeds: tracker botsort turned on")
        config.tracker = "botsort"


def check_speed_rule(rule, calibrations: dict, where: str) -> None:
    """A rule with a speed limit measures speeds: each stream it names has a calibration (a rule of every
    stream: at least one has; it measures where they are), and its points lie on the ground, not above the
    horizon, where they are in the calibration's units."""
    at = f"{where}: {rule.kind} {rule.name!r}: speed_limit_kmh {rule.speed_limit_kmh:g}"
    if not rule.streams and not calibrations:
        raise ConfigError(f"{at}: no stream has a [[calibration]]: speeds need 4+ points of a stream's ground with "
                          "their positions in metres (docs/serve.md, Speed)")
    for stream in rule.streams:
        if stream not in calibrations:
            raise ConfigError(f"{at}: stream {stream} has no [[calibration]]: speeds need 4+ points of its ground "
                              "with their positions in metres (docs/serve.md, Speed)")
    for stream in rule.streams or sorted(calibrations):
        calibration = calibrations[stream]
        if calibration.units == rule.units and not calibration.plane.in_front(rule.points).all():
            raise ConfigError(f"{at}: a point of the {rule.kind} is above stream {stream}'s horizon (not on its "
                              "ground): draw it on the ground")


def _check_rules(config: PipelineConfig, where: str) -> None:
    """Zones and lines: each checked (those made in code too, not only from a table or a flag), named apart;
    they count tracks, so with rules and no tracker botsort is turned on (it keeps an ID through occlusion:
    a visit interrupted by a pillar stays one visit)."""
    event_rules = [*config.zones, *config.lines]
    if not event_rules:
        return
    try:
        for rule in event_rules:
            rules.check(rule, f"{where}: {rule.kind} {rule.name!r}")
        rules.check_names_unique(event_rules, where)
        rules.check_count(event_rules, where)
    except rules.RuleError as exc:
        raise ConfigError(str(exc)) from None
    if config.tracker == "none":
        log.info("%d zone(s) and line(s) count tracks: tracker botsort turned on (--tracker chooses another)",
                 len(event_rules))
        config.tracker = "botsort"
