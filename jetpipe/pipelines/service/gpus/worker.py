"""A GPU's worker: `python -m jetpipe.pipelines.service.gpus.worker`, started by the face with CUDA_VISIBLE_DEVICES set
to its GPU. It reads its Job from standard input, serves its streams as the one-process daemon does, hands its
records to the face (channel.py) and says its summary last. The face's `stop` line (or the face going away)
drains it; `abort` drops what is queued, as a second signal does."""

from __future__ import annotations

import logging
import signal
import sys
import threading

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.ingest.streams import Share
from jetpipe.pipelines.service.closing import exit_now
from jetpipe.pipelines.service.daemon import Pipeline
from jetpipe.pipelines.service.gpus.channel import ForwardSink, Outbox, read_job, worker_name

log = logging.getLogger(__name__)


def main() -> int:
    job = read_job(sys.stdin.buffer)
    said = worker_name(job.gpu, job.k).lower()
    logging.basicConfig(level=logging.INFO, format=f"%(levelname)s: [{said}] %(message)s", stream=sys.stderr)
    for noisy in ("onnxslim", "PyNvVideoCodec"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the face says when to stop (a terminal's Ctrl-C reaches it)
    outbox = Outbox(job.fd)
    try:
        share = Share(job.ids, job.total, ForwardSink(outbox, job.records), job.first_added, job.stride,
                      job.resume)
        pipeline = Pipeline(job.config, share=share)
    except JetpipeError as exc:
        outbox.send("E", {"error": str(exc)})
        return 2
    address = pipeline.server.address if pipeline.server is not None else None
    engine_fps = pipeline.runtime.max_batch_fps()  # the face weighs the GPUs by it when placing added streams
    if engine_fps:
        log.info("the model runs %.0f frames/s at batch %d here", engine_fps, pipeline.runtime.max_batch)
    outbox.send("H", {"address": address, "backend": pipeline.runtime.backend_name, "engine_fps": engine_fps})
    threading.Thread(target=_obey, args=(pipeline, sys.stdin.buffer), name="face", daemon=True).start()
    summary = pipeline.run()
    outbox.send("S", {**summary, "stream_ids": pipeline.report.stream_ids()})  # the lists' IDs, added ones too
    outbox.close()
    return 0


def _obey(pipeline, commands) -> None:
    """The face's lines: stop, abort SIGNAL; their end (the face is gone) stops too."""
    for line in commands:
        word, _, rest = line.decode().strip().partition(" ")
        if word == "stop":
            pipeline.stop()
        elif word == "abort":
            pipeline.abort(rest or "SIGTERM")
    if not pipeline.stop_event.is_set():
        log.warning("the face went away: stopping")
        pipeline.stop()


if __name__ == "__main__":
    exit_now(main())  # not through the interpreter's shutdown: the face's reader thread is blocked in a read
