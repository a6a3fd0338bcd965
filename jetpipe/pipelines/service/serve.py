"""`jetpipe serve` and `jetpipe demo`: run a Pipeline with signal handling and a summary."""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import sys
import tempfile
import threading
from pathlib import Path

from jetpipe import bundle as bundles
from jetpipe.convert import ConvertOptions, convert
from jetpipe.errors import BundleError
from jetpipe.models import BUILTIN, DEFAULT_MODEL
from jetpipe.output_folders import check_new_file
from jetpipe.pipelines.config import PipelineConfig, SourceConfig, validate
from jetpipe.pipelines.core.secondary import SecondaryConfig
from jetpipe.pipelines.service.closing import exit_if_left_behind, exit_now, write_bounded
from jetpipe.pipelines.service.daemon import Pipeline
from jetpipe.pipelines.service.gpus import workers_choice
from jetpipe.pipelines.service.gpus.face import MultiGpuFace
from jetpipe.spec import preset

log = logging.getLogger(__name__)


class StopSignals:
    """SIGTERM and SIGINT while a run goes: the handler only records the signal; a thread of its own acts on it.
    The first stops the run (the sources stop, what is queued drains, bounded by stop_timeout_s), a later one
    aborts it (the queued frames dropped, the batches in flight finished). The handler used to do the stopping
    itself: a second signal that came while the first one's work held a lock (`timeout`'s SIGTERM to the child,
    then to its group) ran the same work again in the same thread and waited for that lock forever. A signal
    after the run ended changes nothing. Our handler stays until the summary is written: Python's own raised
    KeyboardInterrupt in the main thread while the inference threads ran, and the process aborted (SIGABRT,
    no summary)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, pipeline):
        self.pipeline = pipeline
        self.received: queue.SimpleQueue = queue.SimpleQueue()  # its put() may be called from a signal handler
        self.names: list[str] = []  # the signals acted on, in order
        self._ended = False
        self._previous: dict = {}
        self._thread = threading.Thread(target=self._act, name="stop-signals", daemon=True)

    def _record(self, signum, frame) -> None:
        self.received.put(signum)  # nothing else here: no lock, no thread, no logging

    def _act(self) -> None:
        while (signum := self.received.get()) is not None:
            if self._ended:
                continue
            name = signal.Signals(signum).name
            self.names.append(name)
            if len(self.names) == 1:
                log.info("%s: stopping sources, draining queued frames (again to drop them)", name)
                self.pipeline.stop()
            else:
                self.pipeline.abort(name)

    def __enter__(self) -> StopSignals:
        self._thread.start()
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._record)
        return self

    def __exit__(self, *exc) -> None:
        self._ended = True
        self.received.put(None)
        self._thread.join(timeout=5.0)  # an abort under way finishes (it only drops and counts)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def run_pipeline(config: PipelineConfig, on_result=None, then=None) -> dict:
    """Run until done or SIGTERM/SIGINT (StopSignals: the first drains, a second drops what is queued) and return
    the summary; then(summary), where given, runs while a late signal is still only recorded (the summary is
    written whole)."""

    chosen = workers_choice.resolve(config)
    if chosen is not None:
        log.info("workers_per_gpu auto: %s", chosen.why)
    # with --gpus (or workers), a worker a GPU behind one face (pipelines/service/gpus), stopped the same way
    pipeline = Pipeline(config, on_result=on_result) if config.gpus is None else MultiGpuFace(config)
    with StopSignals(pipeline):
        summary = pipeline.run()
        if then is not None:
            then(summary)
    return summary


READER_DIR = "demo-ppocr-rec"  # the demo's recognizer, beside its detector's bundle


def _converted(name: str, folder: Path) -> None:
    """The built-in model `name` converted into `folder`, unless a valid bundle is there already."""
    model = BUILTIN[name]
    try:
        bundles.load(folder)
    except BundleError as exc:  # none yet, or an older / damaged one: convert replaces only a bundle
        if (folder / bundles.MANIFEST).is_file():
            log.info("rebuilding the demo bundle: %s", exc)
        print(f"converting the built-in {name} model to {folder} ...", file=sys.stderr)
        convert(ConvertOptions(model=model.path(), output=folder, input_size=model.input_size,
                               input_width_range=model.width_range, max_batch=8, spec=preset(model.preset),
                               task=model.task, progress=False, force=True, output_flag="--bundle-dir"))


class SummaryFile:
    """Where `serve --summary` writes the run's summary: '-' (stdout) or a new file, checked before the run
    (a file there already, a folder that is not: one line) and written when it ends (temp file, then linked
    into place: never over a file that appeared meanwhile)."""

    def __init__(self, path: str):
        self.path = None if path == "-" else Path(path)
        self.stuck = False  # '-' where stdout did not take it (the process then ends through exit_now)
        if self.path is not None:
            check_new_file(self.path, "--summary")

    def write(self, summary: dict) -> None:
        text = json.dumps({"summary": summary}) + "\n"
        if self.path is None:
            if not write_bounded(sys.stdout, text):  # `--sink stdout` given up on holds stdout's lock
                self.stuck = True
                log.error("--summary -: not written to stdout: a write to it did not return (a reader that stopped "
                          "reading); the summary is on stderr")
            return
        fd, temp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as file:
                file.write(text)
            os.link(temp, self.path)  # fails where a file of that name appeared during the run
        except FileExistsError:
            log.error("--summary %s: a file of that name appeared during the run; the summary is on stderr", self.path)
        finally:
            os.unlink(temp)


def serve(config: PipelineConfig, summary_to: SummaryFile | None = None) -> int:
    """0 when the run ended (or one signal stopped it); 1 when every batch failed for fail_timeout_s; 128 + the
    signal when a second one cut the drain short:
    the summary says what was processed and written either way (on stderr, and to summary_to)."""
    def write(summary: dict) -> None:
        print(json.dumps({"summary": summary}), file=sys.stderr)
        if summary_to is not None:
            summary_to.write(summary)

    summary = run_pipeline(config, then=write)
    if _failed(summary):
        return 1
    interrupted = summary.get("interrupted")
    code = 128 + signal.Signals[interrupted["signal"]].value if interrupted else 0
    if summary_to is not None and summary_to.stuck:  # the interpreter's exit would flush stdout: wait forever
        exit_now(code)
    return code


def demo(duration: float = 10.0, bundle_dir: str | Path = "bundles/demo-ppocr-det", sinks=(),
         backend: str | None = None) -> int:
    """Convert the built-in PP-OCRv4 detector and recognizer (cached) and serve two synthetic cameras for a
    while: the detector finds the text lines, the recognizer reads each (a secondary stage)."""

    bundle = Path(bundle_dir)
    reader = bundle.with_name(READER_DIR)
    for name, folder in ((DEFAULT_MODEL, bundle), ("ppocr-rec", reader)):
        _converted(name, folder)
    cameras = [SourceConfig("synthetic:1280x720@15:nv12"), SourceConfig("synthetic:640x480@15:yuyv")]
    # a frame of each camera a batch: on the CPU runtime (where a demo most often runs) a batch of 8 held four
    # frames of each camera and came out at the same frames/s three times as late (docs/lab/benchmarks.md)
    config = validate(PipelineConfig(
        bundle=bundle, sources=cameras, secondaries=[SecondaryConfig(reader, name="text")],
        sinks=list(sinks or []), duration=duration, metrics_listen="", log_every_s=1e9,
        backend=backend or "auto", max_batch=len(cameras)))
    shown = {0: -1.0, 1: -1.0}

    def show(record):
        import time

        if record.type is not None:  # an event's, a clip's: the console shows frames
            return
        now = time.monotonic()
        if now - shown[record.stream] >= 1.0:  # one line per stream per second
            shown[record.stream] = now
            found = record.detections
            read = [e["text"].strip() for e in found.secondary["text"] if e and e["text"].strip()]
            words = " ".join(repr(t) for t in read[:6])
            print(f"stream {record.stream} frame {record.frame:>4}: {len(found)} text boxes, read "
                  f"{words}{' ...' if len(read) > 6 else ''}  ({record.latency_ms['total']:.0f} ms)")

    summary = run_pipeline(config, on_result=show)
    if summary.get("left_behind"):  # ends the process: a print to a stdout nobody reads would wait forever
        _failed(summary)
    print(f"\n{summary['backend']}: {sum(summary['processed'])} frames in {summary['seconds']} s "
          f"({summary['throughput_fps']} frames/s), dropped {sum(summary['dropped'])} while busy, "
          f"latency p50 {summary['latency_ms']['total'].get('0.5', 0):.0f} ms "
          f"p99 {summary['latency_ms']['total'].get('0.99', 0):.0f} ms")
    return 1 if _failed(summary) else 0


def _failed(summary: dict) -> bool:
    """A run that failed says why on stderr; where it left a stage behind, the process ends here with 1."""
    if not summary.get("failure"):
        return False
    print(f"error: {summary['failure']}", file=sys.stderr)
    exit_if_left_behind(summary, 1)
    return True
