"""A clip as an MP4 made of the input's own packets: remuxed, never decoded or encoded (`ffmpeg -c copy`),
its index at the front (faststart: it plays while it downloads).

Written into a file this makes under a temporary name (refused where anything has that name, a link too),
then linked to its name, which must not exist (nothing is overwritten), so that a reader never sees
half a clip."""

from __future__ import annotations

import io
import os
from pathlib import Path

from jetpipe.pipelines.ingest.packet_ring import Packet
from jetpipe.pipelines.outputs.sinks.safe_open import linked_when_whole


def open_template(ring, packets: list[Packet] = ()):
    """A container whose video stream has the codec parameters a clip copies (opened once per stream: a probe
    of the file each clip cost 0.1-0.2 s of CPU at 1080p): the input file itself, or for Annex B packets
    (NVDEC's) a raw stream of the ring's first GOP, whose parameter sets FFmpeg reads (its MP4 muxer then
    writes the packets in MP4's form). packets: the clip's, whose first GOP serves where the ring holds none
    (it started again since they were taken)."""
    import av

    if ring.annexb is None:
        return av.open(ring.template)
    first = ring.first_gop() or first_gop(packets)
    if not first:
        raise OSError("the ring holds no keyframe yet")
    return av.open(io.BytesIO(first), format=ring.annexb)


def first_gop(packets: list[Packet]) -> bytes:
    """The bytes of the packets from the first keyframe up to the next."""
    keys = [k for k, p in enumerate(packets) if p.key][:2]
    if not keys:
        return b""
    return b"".join(p.data for p in packets[keys[0]:keys[1] if len(keys) > 1 else len(packets)])


def write_clip(path: Path, template, time_base, packets: list[Packet]) -> None:
    """packets (decode order, from a keyframe) into an MP4 at `path`, with the codec parameters of the
    `template` container's video stream; timestamps start near 0. Raises OSError or av.error.FFmpegError;
    leaves no partial file."""
    import av

    if os.path.lexists(path):  # checked again, atomically, by the link at the end
        raise FileExistsError(f"{path} is there already: a clip never overwrites a file")
    with linked_when_whole(path) as part:
        out = av.open(str(part), "w", format="mp4", options={"movflags": "+faststart"})
        try:
            stream = out.add_stream_from_template(template.streams.video[0])
            base = min(p.dts if p.dts is not None else p.pts for p in packets)
            for p in packets:
                packet = av.Packet(p.data)
                packet.pts = None if p.pts is None else p.pts - base
                packet.dts = None if p.dts is None else p.dts - base
                packet.duration, packet.is_keyframe = p.duration, p.key
                packet.stream, packet.time_base = stream, time_base
                out.mux(packet)
        finally:
            out.close()
