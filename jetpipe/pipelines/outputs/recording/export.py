"""A time range of a stream's recording as one MP4 (`jetpipe export recording`, GET /review/export): the
segments' own packets remuxed, never decoded or encoded, from the last keyframe at or before the range's
start to the last frame shown at or before its end, on one clock (each segment placed at its start); its
index at the front (faststart: it plays while it downloads).

The codec parameters are the first segment's: where a camera changed them within the range (a new
resolution), the export stops before the segment that changed them, and says so.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.outputs.recording.index import INDEX_NAME
from jetpipe.pipelines.outputs.recording.parts import parts_of, read_only
from jetpipe.pipelines.outputs.sinks.safe_open import linked_when_whole

log = logging.getLogger(__name__)

MAX_EXPORT_S = 24 * 3600.0  # one export covers at most a day (a bigger one: several)


class ExportError(JetpipeError):
    """What the caller asked cannot be exported (no recording then, a range that does not parse)."""


@dataclass
class Exported:
    path: Path
    start: float      # wall clock of its first frame shown
    end: float        # past its last
    packets: int
    segments: int
    bytes: int


def parse_when(text: str, what: str) -> float:
    """'2026-11-28T14:05:00' (the machine's local time), '...Z' or '...+01:00', or Unix seconds -> Unix seconds."""
    text = str(text).strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise ExportError(f"{what} {text!r} is not a time: write e.g. 2026-11-28T14:05:00 (local), "
                          "2026-11-28T13:05:00Z, or Unix seconds") from None
    return when.timestamp() if when.tzinfo else when.astimezone().timestamp()


def segments_between(folder: Path, stream: int, start: float, end: float) -> list[tuple]:
    """(file, start, end) of the stream's closed segments that overlap [start, end], oldest first, from every part
    of the recording (parts.py: the stream may have been recorded by one worker, then by another; read-only)."""
    parts = parts_of(folder)
    if not parts:
        raise ExportError(f"{folder} holds no recording index ({INDEX_NAME}): name the folder given to --record")
    found = []
    for _, part in parts:
        db = read_only(part)
        try:
            found += [(part / path, s, e) for path, s, e in db.execute(
                "SELECT path, start, end FROM segments WHERE stream = ? AND open = 0 AND start < ? AND end > ? "
                "ORDER BY start", (stream, end, start))]
        finally:
            db.close()
    return sorted(found, key=lambda row: row[1])


def export_range(folder: Path, stream: int, start: float, end: float, out: Path) -> Exported:
    """[start, end] (Unix seconds) of the stream's recording into a new file `out` (refused where anything has
    that name, a link too; written under a temporary name, then linked: no half file). ExportError where
    nothing was recorded then."""
    if not end > start:
        raise ExportError(f"the range ends ({end:.3f}) before it starts ({start:.3f}): give --from before --to")
    if end - start > MAX_EXPORT_S:
        raise ExportError(f"the range is {end - start:.0f} s: export at most {MAX_EXPORT_S:.0f} s (a day) at once")
    found = segments_between(folder, stream, start, end)
    if not found:
        raise ExportError(f"stream {stream} has no recording between {_iso(start)} and {_iso(end)}: GET "
                          "/review/api/recordings lists what there is")
    if os.path.lexists(out):
        raise ExportError(f"{out} is there already: name a new file (an export never overwrites one)")
    with linked_when_whole(out) as part:
        done = _remux(found, start, end, part)
    return Exported(out, done[0], done[1], done[2], done[3], out.stat().st_size)


def _remux(found: list[tuple], start: float, end: float, part: Path) -> tuple:
    """The segments' packets into `part`; (first shown, past last shown, packets, segments used)."""
    import av

    output = av.open(str(part), "w", format="mp4", options={"movflags": "+faststart"})
    written, used, first_wall, last_wall = 0, 0, None, None
    origin = target = None
    next_dts = -(1 << 62)  # past the last decode time written, in the segments' time base
    try:
        for path, seg_start, _ in found:
            with av.open(str(path)) as container:
                source = container.streams.video[0]
                if target is None:
                    target = output.add_stream_from_template(source)
                    template = source.codec_context
                elif not _same_codec(template, source.codec_context):
                    log.warning("export: %s has other codec parameters (a camera that changed them): the export "
                                "stops before it", path)
                    break
                packets = _in_range(container, source, seg_start, start, end, started=origin is not None)
                if not packets:
                    continue
                tb = source.time_base
                if origin is None:
                    origin = seg_start + float(min(p.dts if p.dts is not None else p.pts for p in packets) * tb)
                # placed at its start; never before what was written (a file read faster than real time has
                # segments whose wall clocks overlap): decode times only go forward
                first_dts = min(p.dts if p.dts is not None else p.pts for p in packets)
                shift = max(round((seg_start - origin) / float(tb)), next_dts - first_dts)
                for p in packets:
                    shown = seg_start + float(p.pts * tb)
                    first_wall = shown if first_wall is None else min(first_wall, shown)
                    last_wall = max(last_wall or shown, shown + float((p.duration or 0) * tb))
                    p.pts, p.dts = p.pts + shift, None if p.dts is None else p.dts + shift
                    next_dts = max(next_dts, (p.dts if p.dts is not None else p.pts) + max(1, p.duration or 0))
                    p.stream = target
                    output.mux(p)
                written += len(packets)
                used += 1
    finally:
        output.close()
    if not written:
        raise ExportError(f"nothing of the recording lies between {_iso(start)} and {_iso(end)}")
    return first_wall, last_wall, written, used


def _in_range(container, source, seg_start: float, start: float, end: float, started: bool) -> list:
    """The segment's packets in decode order from the last keyframe at or before `start` (from its first
    where the export has started already) to the last shown at or before `end`."""
    tb = float(source.time_base)
    packets = [p for p in container.demux(source) if p.size]
    first = 0
    if not started:
        keys = [k for k, p in enumerate(packets) if p.is_keyframe and seg_start + p.pts * tb <= start + 1e-6]
        first = keys[-1] if keys else 0
    kept = packets[first:]
    last = max((k for k, p in enumerate(kept) if seg_start + p.pts * tb <= end + 1e-6), default=-1)
    return kept[:last + 1]


def _same_codec(a, b) -> bool:
    return (a.name, a.width, a.height, bytes(a.extradata or b"")) == (b.name, b.width, b.height,
                                                                        bytes(b.extradata or b""))


def _iso(when: float) -> str:
    return datetime.fromtimestamp(when, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
