#!/usr/bin/env python3
"""Stands in for `ffmpeg` where a machine's ffmpeg cannot read a socket (the GPU machines' static ffmpeg 6.0 dies
with SIGSEGV on tcp:// input), for benchmarks of network cameras there (bench_busy.py --remux-shim puts it first
on PATH as `ffmpeg`, the real one in JETPIPE_REAL_FFMPEG; the GPU tests of network streams run it in place of
the remux command there).

jetpipe's remux command (sources/ffmpeg.py remux_command: `ffmpeg ... -i tcp://HOST:PORT ... pipe:1`, or with a
recording's copy `-f tee "[...]pipe\\:1|[...]pipe\\:N"`) is served by copying the socket's bytes, which are
MPEG-TS already, to stdout and to fd N (dropped where that copy's reader went, as the tee's onfail=ignore);
every other command runs the real ffmpeg. What the serving process does with the bytes is the same; the copy's
own CPU is this process's, not the serving process's.
"""

from __future__ import annotations

import os
import socket
import sys


def main(argv: list[str]) -> None:
    url = argv[argv.index("-i") + 1] if "-i" in argv[:-1] else ""
    if not url.startswith("tcp://"):
        real = os.environ["JETPIPE_REAL_FFMPEG"]
        os.execv(real, [real, *argv])
    copy = int(argv[-1].rsplit("pipe\\:", 1)[1]) if "tee" in argv else None
    host, port = url.split("://", 1)[1].split("?", 1)[0].rsplit(":", 1)
    with socket.create_connection((host, int(port))) as conn:
        while data := conn.recv(1 << 16):
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
            if copy is not None:
                try:
                    os.write(copy, data)
                except BrokenPipeError:
                    copy = None


if __name__ == "__main__":
    main(sys.argv[1:])
