"""Where a TCP MPEG-TS camera's frame waits before the demuxer NVDEC reads gives it (session 57): the camera's own
MPEG-TS with and without each PES's length (FFmpeg leaves a video PES's out by default), read through jetpipe's remux
ffmpeg or passed on as it is (scripts/socket_remux.py, as the GPU bench does); camera_start.py's steady figure.

    python docs/results/busy_2026-12-07_s57/held_by_lengths.py VIDEO.mp4    # a 1080p30 video without B-frames
"""

import sys
import tempfile
from pathlib import Path

root = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(root / "scripts" / "diag"), str(root / "scripts")]
import bench_busy  # noqa: E402
import camera_start  # noqa: E402

REMUX = camera_start.remux_command


def passed_on(uri, copy_fd=None):
    return [sys.executable, str(root / "scripts" / "socket_remux.py"), "-i", uri.location, "pipe:1"]


def camera(video: Path, lengths: bool):
    """bench_busy's camera stream, its MPEG-TS written with each PES's length where asked."""
    run = bench_busy.subprocess.run

    def with_lengths(argv, *args, **kwargs):
        if lengths and isinstance(argv, list) and argv[:1] == ["ffmpeg"] and "mpegts" in argv:
            argv = [*argv[:-1], "-omit_video_pes_length", "0", argv[-1]]
        return run(argv, *args, **kwargs)

    bench_busy.subprocess.run = with_lengths
    try:
        with tempfile.TemporaryDirectory() as folder:
            return bench_busy.camera_stream(video, Path(folder), 5.0)
    finally:
        bench_busy.subprocess.run = run


def main(video: Path) -> None:
    for lengths in (False, True):
        ts, schedule = camera(video, lengths)
        for name, command in (("through the remux", REMUX), ("passed on as it is", passed_on)):
            camera_start.remux_command = command
            _, times, sent = camera_start.read_camera(ts, schedule, lambda url: camera_start.remux(url, []))
            behind = camera_start.steady_behind(times, schedule, sent)
            print(f"camera's MPEG-TS {'with' if lengths else 'without'} PES lengths, {name}: a frame out "
                  f"{behind[len(behind) // 2] * 1e3:.0f} ms (least {behind[0] * 1e3:.0f}) after the camera sent it",
                  flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
