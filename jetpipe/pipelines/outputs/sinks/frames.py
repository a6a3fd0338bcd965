"""Sinks that show what the pipeline sees: results drawn on the frames, as video or JPEG files.

`video:PATH.mp4` encodes H.264 (`?codec=hevc`: HEVC). The encoder (`?encoder=auto`, the default): on a
Jetson GStreamer's hardware `nvv4l2h264enc` / `nvv4l2h265enc` (gst-launch-1.0); elsewhere FFmpeg's NVENC
(`h264_nvenc`) where a one-frame trial encode shows the GPU has one, else libx264 / libx265. Any FFmpeg
encoder by name (`?encoder=libx264`), any GStreamer element as `?encoder=gst:x264enc`. `?width=W` scales
the drawn frames (default: the source's size); a file's rate is its stream's (from its first two frames'
times, at most 30), `?fps=N` sets it (and the most frames a second it takes). `jpeg:FOLDER` writes
`s{stream}_{frame}.jpg` (`?every=N`: every Nth frame; `?quality=Q`, 1-100, default 95), encoded on the GPU
where the pipeline's JPEG encoder is (runtime/jpeg.py: nvImageCodec), else by OpenCV. With several streams a
video path gets `-s{stream}` before its suffix unless it holds `{stream}` itself.

These sinks draw in a thread per stream: the post stage only copies the frame (still YUV; from GPU memory
for NVDEC streams) into one of the sink's preallocated buffers; conversion, drawing and encoding happen
there. When all buffers are busy, a live stream's frame is dropped (counted in `dropped`), never slowing
inference; a file's frame waits for a buffer, as files wait for inference (an annotated video of a file has
every frame: under load it lost 3 of 24), up to WAIT_S (a sink that stopped drawing drops, counted).
close() finishes every file: the encoders get end-of-stream and write their container's index (a
SIGTERM'd daemon leaves playable files).
"""

from __future__ import annotations

import logging
import os
import queue
import re
import subprocess
import threading
import time
from pathlib import Path

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.frames import frame_shape
from jetpipe.lazy import lazy_import
from jetpipe.output_folders import check_new_file, check_writable
from jetpipe.pipelines.outputs import annotate
from jetpipe.pipelines.outputs.sinks import encoders, safe_open
from jetpipe.pipelines.outputs.sinks.base import SinkBase, sink_options

cv2 = lazy_import("cv2")
log = logging.getLogger(__name__)

JPEG_NAME = re.compile(r"s(\d+)_\d{6,}\.jpg")  # what a jpeg: sink writes, s{stream}_{frame:06d}.jpg
SPARE_BUFFERS = 2  # per stream, beyond a whole batch: one being drawn, one waiting
WAIT_S = 10.0      # a file's frame waits this long for a free buffer before it is dropped
_END = object()    # a removed stream's last work item


OPTION_BOUNDS = {"width": 8192, "fps": 1000.0, "every": 100_000, "quality": 100}  # the most each option means


def positive_option(spec: str, options: dict[str, str], key: str, kind=int, default=None):
    """?key=N as a number above 0 and at most OPTION_BOUNDS[key] (`default` when absent), or one line naming the
    sink and the key (fps=inf and width=100000000 were taken: an 8K frame is 7,680 wide)."""
    if key not in options:
        return default
    try:
        value = kind(options[key])
    except ValueError:
        value = None
    high = OPTION_BOUNDS.get(key, float("inf"))
    if value is None or not 0 < value <= high:
        raise JetpipeError(f"sink {spec}: {key}={options[key]!r}: give a number above 0, at most {high:g}")
    return value


class FrameSink(SinkBase):
    """Base: per-stream frame buffers, a worker thread, drop-when-busy."""

    takes_frames = True

    def __init__(self, spec: str, max_batch: int = 8, max_fps: float | None = None):
        """max_batch: a batch's frames may all come from one stream; each stream gets buffers for a whole
        batch and two more, allocated at its first frame. max_fps: frames taken per stream and second
        (a 30 fps video needs no more); the others are skipped without a copy."""
        self.spec, self.buffers = spec, max_batch + SPARE_BUFFERS
        self.period = 1.0 / max_fps if max_fps else 0.0
        self.by_pts = True
        self._free: dict[int, queue.SimpleQueue] = {}
        self._due: dict[int, float] = {}
        self._work: dict[int, queue.Queue] = {}     # one worker per stream: frames stay in order
        self._threads: list[threading.Thread] = []
        self._cut = False  # a bounded drain ran out: frames still waiting are dropped, not drawn

    def describe(self) -> str:
        return self.spec

    def offer(self, stream: int, frame, record, to_host=None, wait: bool = False) -> bool:
        """Copy a frame (YUV as it sits in the ring) for drawing; False when it was not taken. A frame in
        device memory (NVDEC) is copied with to_host(frame, out) (the runtime's frame_to_host). wait: a
        file's frame, which waits for a free buffer rather than being dropped."""
        if not self.wants(record) or (self.period and not self._due_now(stream, record)):
            return False  # not a frame this sink shows, or above its rate: skipped, not a drop
        shape = frame.data.shape if frame.data is not None else frame_shape(frame.format, *frame.hw)
        free = self._free.get(stream)
        if free is None:
            free = self._free[stream] = queue.SimpleQueue()
            for _ in range(self.buffers):
                free.put(np.empty(shape, np.uint8))  # allocated on the stream's first frame only
            self._work[stream] = queue.Queue()
            worker = threading.Thread(target=self._run, args=(stream,), name=f"sink-{stream}", daemon=True)
            worker.start()
            self._threads.append(worker)
        try:
            buffer = free.get(timeout=WAIT_S) if wait else free.get_nowait()
        except queue.Empty:
            self.dropped += 1
            return False
        if buffer.shape != shape:
            buffer = np.empty(shape, np.uint8)  # the stream changed size (a reconnect): new buffers once
        if frame.data is not None:
            np.copyto(buffer, frame.data)
        else:
            to_host(frame, buffer)
        self._work[stream].put((buffer, frame.format, record))
        return True

    def wants(self, record) -> bool:
        """Whether this sink shows the record's frame at all (decided before any copy)."""
        return True

    def _due_now(self, stream: int, record) -> bool:
        """At most one frame per period: of the stream's own time (pts) for files and cameras that have it,
        so a file processed faster than real time still gives every frame of a same-rate video; of the wall
        clock otherwise (and for a viewer)."""
        pts = record.pts if self.by_pts else None
        t = pts if pts is not None else time.monotonic()
        due = self._due.get(stream)
        if due is not None and due - 2 * self.period <= t < due - 1e-6:
            return False
        self._due[stream] = t + self.period  # also after time went back: a looped file, a reconnect
        return True

    def write(self, record) -> None:
        """Frame sinks take their records with the frames (offer)."""

    def end_stream(self, stream: int) -> None:
        """The stream was removed (its last frame was offered already): its worker finishes what it holds,
        ends the stream's output (finish_stream) and returns the stream's buffers."""
        work = self._work.get(stream)
        if work is not None:
            work.put(_END)

    def finish_stream(self, stream: int) -> None:
        """What a removed stream's output needs at its end (a video file's trailer)."""

    def _run(self, stream: int) -> None:
        while True:
            item = self._work[stream].get()
            if item is None:
                return
            if item is _END:
                try:
                    self.finish_stream(stream)
                except Exception as exc:
                    self.fail(exc)
                self._free.pop(stream), self._work.pop(stream), self._due.pop(stream, None)  # buffers go with it
                return
            buffer, fmt, record = item
            if self._cut:  # the drain's bound: dropped, counted, the stream's file still finished
                self.dropped += 1
                self._free[stream].put(buffer)
                continue
            try:
                self.consume(stream, buffer, fmt, record)
            except Exception as exc:  # a full disk, an encoder that died: counted, the others go on
                self.fail(exc)
            finally:
                self._free[stream].put(buffer)

    def consume(self, stream: int, frame: np.ndarray, fmt: str, record) -> None:
        raise NotImplementedError

    def cut_short(self) -> int:
        """Drop the frames waiting to be drawn (a bounded drain ran out); how many wait now."""
        self._cut = True
        return sum(work.qsize() for work in list(self._work.values()))

    def close(self) -> None:
        for work in list(self._work.values()):
            work.put(None)
        for worker in self._threads:
            worker.join()
        self.finish()
        if self.dropped:
            log.info("sink %s: %d frame(s) dropped while it was busy", self.describe(), self.dropped)

    def finish(self) -> None:
        pass


class VideoSink(FrameSink):
    def __init__(self, spec: str, streams: int, max_batch: int = 8, ids=None):
        """streams: how many the daemon serves (one: no number in the name); ids: those drawn here (None: all)."""
        path, options = sink_options(spec, ("width", "fps", "codec", "encoder"))
        if not path:
            raise JetpipeError(f"sink {spec}: name the file, e.g. video:out.mp4")
        if Path(path).suffix.lower() not in encoders.CONTAINERS:
            raise JetpipeError(f"sink {spec}: {Path(path).name!r}: name a video file ending in "
                               f"{', '.join(encoders.CONTAINERS)} (its container)")
        self.codec = options.get("codec", "h264")
        if self.codec not in encoders.SOFTWARE:
            raise JetpipeError(f"sink {spec}: codec {self.codec!r}: choose h264 or hevc")
        self.width = positive_option(spec, options, "width")
        self.fps = positive_option(spec, options, "fps", float, 30.0)
        self.fixed_rate = "fps" in options  # else each file at its stream's rate (up to fps), from two frames' times
        self._first: dict[int, tuple] = {}  # a stream's first drawn frame and its time, until the second comes
        self.template, self.numbered = Path(path), streams > 1
        self.paths = {i: _stream_path(self.template, i, streams) for i in (range(streams) if ids is None else ids)}
        for p in self.paths.values():
            check_new_file(p, "sink", f"sink {spec}")  # FFmpeg and GStreamer create no folder
        # the destination before the encoder: it needs no tool, and choosing may run a trial encode
        self.tool, self.encoder = encoders.choose(spec, self.codec, options.get("encoder", "auto"))
        if self.tool == "gstreamer":
            encoders.check_gst_pipeline(spec, self.encoder, self.codec, self.template)
        self.encoders: dict[int, subprocess.Popen] = {}
        self.written: dict[int, int] = {}  # frames handed to each stream's encoder: what its file must hold
        super().__init__(spec, max_batch, max_fps=self.fps)

    def consume(self, stream, frame, fmt, record) -> None:
        image = annotate.render(frame, fmt, record.detections, self.width, record.scene)
        t = record.pts if record.pts is not None else record.t_capture
        encoder = self.encoders.get(stream)
        if encoder is None and not self.fixed_rate and stream not in self._first:
            self._first[stream] = (image.copy(), t)  # its rate comes with the next frame
            return
        if encoder is None:
            first = self._first.pop(stream, None)
            encoder = self._start(stream, image.shape[:2], self._rate(first[1], t) if first else self.fps)
            if first is not None:
                self._write(stream, encoder, first[0])
        self._write(stream, encoder, image)

    def _write(self, stream: int, encoder, image) -> None:
        encoder.stdin.write(image.data)
        self.written[stream] = self.written.get(stream, 0) + 1

    def _rate(self, first: float, second: float) -> float:
        """Frames a second from two frames' times: the stream's rate, as the sink takes it (at most fps); fps
        where the times say nothing (equal, backwards, a looped file's jump)."""
        step = second - first
        return min(self.fps, round(1.0 / step, 3)) if step > 1e-3 else self.fps

    def _flush_first(self, streams) -> None:
        """Streams that ended after one drawn frame: their files, at fps."""
        for stream in streams:
            if stream in self._first:
                image = self._first.pop(stream)[0]
                self._write(stream, self._start(stream, image.shape[:2], self.fps), image)

    def _path(self, stream: int) -> Path:
        """Stream `stream`'s file; one added while serving (an ID beyond those checked at start) is checked now."""
        if stream not in self.paths:
            path = _stream_path(self.template, stream, 2 if self.numbered else 1)
            if os.path.lexists(path) or path in self.paths.values():
                raise JetpipeError(f"sink {self.spec}: {path} exists: stream {stream} is not drawn (a sink never "
                                   "overwrites a file)")
            self.paths[stream] = path
        return self.paths[stream]

    def _start(self, stream: int, size_hw: tuple[int, int], fps: float) -> subprocess.Popen:
        build = encoders.gst_argv if self.tool == "gstreamer" else encoders.ffmpeg_argv
        path = self._path(stream)
        safe_open.claim(path, self.spec)  # the encoder writes into a file the sink made, never through a link
        argv = build(self.encoder, self.codec, size_hw, fps, path)
        log.info("sink %s: stream %d -> %s (%s %s, %dx%d, %g fps)", self.spec, stream, path, self.tool,
                 self.encoder, size_hw[1], size_hw[0], fps)
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.encoders[stream] = process
        return process

    def finish_stream(self, stream: int) -> None:
        self._flush_first([stream])
        process = self.encoders.pop(stream, None)
        if process is not None:
            self._finish_file(stream, process)

    def finish(self) -> None:
        self._flush_first(list(self._first))
        for stream, process in list(self.encoders.items()):
            self._finish_file(stream, process)

    def _finish_file(self, stream: int, process: subprocess.Popen) -> None:
        try:
            process.stdin.close()  # end of stream: the encoder flushes and writes the container's index
        except OSError:
            pass
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        if code != 0:  # the file may be unfinished: a failure, counted in the summary
            why = (process.stderr.read().decode(errors="replace").strip().splitlines() or ["?"])[-1]
            self.fail(JetpipeError(f"the encoder of stream {stream} exited with {code}: {why}"))
            return
        why = _unplayable(self.paths[stream], self.written.get(stream, 0))
        if why:  # ffmpeg 5.1 exits 0 after failing to write the trailer (a full disk): look at the file
            self.fail(JetpipeError(f"{self.paths[stream]}: {why}"))


def _unplayable(path: Path, written: int) -> str | None:
    """Why a finished video file is not what was written (None: it opens and holds every frame)."""
    import av

    try:
        with av.open(str(path)) as container:
            streams = container.streams.video
            frames = streams[0].frames if streams else 0
            if streams and not frames:  # a fragmented MP4 has no index of them: its packets, counted (no decode)
                frames = sum(1 for packet in container.demux(streams[0]) if packet.size)
    except (OSError, av.FFmpegError) as exc:
        return f"unplayable ({str(exc).strip()[:120]}): the disk may be full"
    if not streams:
        return "holds no video stream"
    if frames and frames < written:
        return f"holds {frames} of the {written} frames written: the disk may be full"
    return None


class JpegSink(FrameSink):
    def __init__(self, spec: str, max_batch: int = 8, jpeg=None, ids=None):
        """jpeg: the pipeline's JPEG encoder (runtime.jpeg: the GPU's where it can be had); None: OpenCV's.
        ids: the streams drawn here (None: all; a GPU's worker looks only for its own streams' frames)."""
        self.jpeg = jpeg
        path, options = sink_options(spec, ("every", "width", "quality"))
        self.folder = Path(path)
        if path:
            check_writable(self.folder / "frame.jpg", "sink")  # names first: a too-long one fails every lookup
        if not path or not self.folder.is_dir():
            raise JetpipeError(f"sink {spec}: {path!r} is not a folder: create it first")
        earlier = sorted(p.name for p in self.folder.iterdir() if (m := JPEG_NAME.fullmatch(p.name))
                         and (ids is None or int(m.group(1)) in ids))
        if earlier:  # the names this sink writes: never overwrite them
            raise JetpipeError(f"sink {spec}: {self.folder} holds frames already ({earlier[0]}, ...): name an "
                               "empty folder (a sink never overwrites files)")
        self.every = positive_option(spec, options, "every", default=1)
        self.width = positive_option(spec, options, "width")
        self.quality = positive_option(spec, options, "quality", default=95)
        super().__init__(spec, max_batch)

    def wants(self, record) -> bool:
        return record.frame % self.every == 0

    def consume(self, stream, frame, fmt, record) -> None:
        image = annotate.render(frame, fmt, record.detections, self.width, record.scene)
        path = self.folder / f"s{stream}_{record.frame:06d}.jpg"
        if self.jpeg is not None:
            data = self.jpeg.encode_image(image, self.quality)
        else:
            ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, self.quality])
            if not ok:
                raise OSError(f"could not encode {path.name}")
        safe_open.write_whole(path, data)  # a new file, whole, never through a link


def _stream_path(path: Path, stream: int, streams: int) -> Path:
    if "{stream}" in path.name:
        return path.with_name(path.name.replace("{stream}", str(stream)))
    return path if streams == 1 else path.with_name(f"{path.stem}-s{stream}{path.suffix}")
