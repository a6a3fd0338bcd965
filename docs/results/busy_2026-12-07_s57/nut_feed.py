"""A try, not a change (session 57): NVDEC's feed as NUT instead of MPEG-TS, so that PyAV's demuxing needs no H.264
parser (NUT frames and times each packet; FFmpeg's MPEG-TS demuxer parses H.264 and holds each frame until the next
begins). camera_start.py's remux arm with the remux writing NUT and PipeDemuxer opening it as NUT (its MPEG-TS
options dropped); the camera as bench_busy sends it.

    python docs/results/busy_2026-12-07_s57/nut_feed.py VIDEO.mp4
"""

import sys
import tempfile
from pathlib import Path

import av

root = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(root / "scripts" / "diag"), str(root / "scripts")]
import camera_start  # noqa: E402
from bench_busy import camera_stream  # noqa: E402

from jetpipe.runtime import nvdec_pipe  # noqa: E402

REMUX, OPEN = camera_start.remux_command, av.open


def as_nut(uri, copy_fd=None):
    argv = REMUX(uri, copy_fd)
    return [*argv[:argv.index("-f")], "-f", "nut", "-flush_packets", "1", "pipe:1"]


def main(video: Path) -> None:
    with tempfile.TemporaryDirectory() as folder:
        ts, schedule = camera_stream(video, Path(folder), 5.0)
    for name, command, feed_format in (("MPEG-TS (as now)", REMUX, "mpegts"), ("NUT", as_nut, "nut")):
        def opened(source, format=None, feed_format=feed_format, **options):
            if not isinstance(source, nvdec_pipe.FeedReader):
                return OPEN(source, format=format, **options)
            if feed_format != "mpegts":
                options.pop("options", None)
            return OPEN(source, format=feed_format, **options)

        camera_start.remux_command, av.open = command, opened
        for _ in range(2):
            _, times, sent = camera_start.read_camera(ts, schedule, lambda url: camera_start.remux(url, []))
            behind = camera_start.steady_behind(times, schedule, sent)
            print(f"{name}: first frame {(times[0] - sent) * 1e3:.0f} ms after the connection, then a frame out "
                  f"{behind[len(behind) // 2] * 1e3:.0f} ms (least {behind[0] * 1e3:.0f}) after the camera sent it",
                  flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
