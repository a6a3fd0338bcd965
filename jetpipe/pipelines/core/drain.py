"""A stop's drain, bounded: what is queued when a stop comes (SIGTERM, --duration) is finished, for at most
stop_timeout_s; then the frames still queued and those waiting in the frame sinks (drawing, encoding) are
dropped, counted, and the run ends with its files finished and its summary written, inside the service manager's
own stop timeout (the shipped unit's TimeoutStopSec=30, after which systemd kills the whole group). The stage
threads' end is bounded too (StageJoin): a batch the GPU never finishes leaves them behind instead of the stop.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)


class DrainBound:
    def __init__(self, seconds: float, batcher, sinks):
        """seconds: the drain's bound (0: none); batcher, sinks: what is dropped when it is reached."""
        self.seconds, self.batcher, self.sinks = seconds, batcher, sinks
        self.cut: dict | None = None  # the summary's drain_cut_short, once the bound was reached
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """A stop came: the drain has `seconds` from now (a later stop does not restart it)."""
        with self._lock:
            if self.seconds and self._timer is None:
                self._timer = threading.Timer(self.seconds, self._reached)
                self._timer.daemon = True
                self._timer.start()

    def cancel(self) -> None:
        """The run is through: nothing is dropped."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()

    def _reached(self) -> None:
        queued = self.batcher.abort()
        waiting = self.sinks.cut_short()
        self.cut = {"after_s": self.seconds, "queued_frames_dropped": queued, "sink_frames_dropped": waiting}
        log.warning("the drain reached stop_timeout_s = %g s: %d queued frame(s) and %d waiting in the frame sinks "
                    "dropped; finishing the batches in flight and the files", self.seconds, queued, waiting)


# no batch collected for this long while the run ends: a stage is stuck (a hung GPU kernel); at least ten times the
# longest batch yet (a big model on the CPU runtime). Inside what the service manager allows a stop (30 s).
STAGE_STUCK_S = 15.0
JOIN_POLL_S = 0.2


class StageJoin:
    """The run's end joins the stage threads, bounded: where no batch is collected for STAGE_STUCK_S (progress()
    unchanged) while a stage thread still runs, the stages are left behind. A batch the GPU never finishes (a hung
    kernel or driver) blocks the post thread in its wait and the GPU thread on a free buffer set; joined without a
    bound, they made a stop wait forever, a second signal too."""

    def __init__(self, progress, stuck_s: float | None = None, unstick=None):
        """progress(): a value that changes whenever a stage gets on (the batches collected); unstick(): called
        once when they stand still, before any is left behind: why, where it freed what held them (the sinks'
        writer given up on: SinkFanout.give_up), else None."""
        self.progress, self.stuck_s = progress, STAGE_STUCK_S if stuck_s is None else stuck_s
        self.unstick, self.unstuck = unstick, None  # unstuck: what unstick() said
        self.left_behind: list[str] = []  # names of the threads given up on
        self._last, self._since = progress(), time.monotonic()

    def __call__(self, thread: threading.Thread) -> bool:
        """Wait for the thread to end; False where it is left behind (at once once one was)."""
        while thread.is_alive() and not self.left_behind:
            thread.join(JOIN_POLL_S)
            now = self.progress()
            if now != self._last:
                self._last, self._since = now, time.monotonic()
            elif thread.is_alive() and time.monotonic() - self._since >= self.stuck_s:
                if self.unstick is not None and self.unstuck is None and (freed := self.unstick()):
                    self.unstuck, self._since = freed, time.monotonic()  # held by the sinks: they go on now
                    continue
                self.left_behind.append(thread.name)
        if thread.is_alive() and thread.name not in self.left_behind:
            self.left_behind.append(thread.name)
        return not thread.is_alive()


def patience_s(stages, floor_s: float) -> float:
    """How long the stages (StageLoops) may show no progress before they count as stuck: floor_s, or ten of their
    longest batch yet where that is longer (a model that takes seconds a batch on the CPU runtime). The run's end
    (end_stages) and /healthz hold them to the same rule."""
    return max(floor_s, 10 * stages.longest_batch_s)


def end_stages(stages, gpu: threading.Thread, post: threading.Thread, chained: threading.Thread | None,
               sinks) -> list[str]:
    """The sources are done: the GPU stage returns, then the post (and secondary) stage once it has collected what
    was submitted. The names of the threads left behind where they got stuck (StageJoin); the run's failure then
    says so. A post stage held by the sinks' writer (blocked in a write, its queue full) is not stuck: the writer is
    given up on (sinks.give_up) and the stages finish."""
    join = StageJoin(lambda: (stages.metrics.batches, stages.secondary_reads, sinks.written),
                     patience_s(stages, STAGE_STUCK_S), unstick=sinks.give_up)
    join(gpu)
    stages.end_post()
    join(post)
    if chained is not None:
        stages.end_secondary()
        join(chained)
    if join.left_behind:
        stages.failure = stages.failure or (
            f"no batch finished for {join.stuck_s:g} s while the run ended: {', '.join(join.left_behind)} left "
            "behind (a batch the GPU never finished: a hung kernel or driver; nvidia-smi and the kernel log say more)")
        log.error("%s", stages.failure)
    return join.left_behind


class WriterWatch:
    """For a run's end with no stage threads of its own to join (the face of several GPUs: its records come from
    the workers' pipes): where the sinks' writer stands inside a write with no record written for STAGE_STUCK_S,
    it is given up on (SinkFanout.give_up). The records then are dropped and counted instead of holding the
    workers' pipes, so the workers finish their drain and end with their summaries."""

    def __init__(self, sinks, stuck_s: float | None = None):
        self.sinks, self.stuck_s = sinks, STAGE_STUCK_S if stuck_s is None else stuck_s
        self._last, self._since = sinks.written, time.monotonic()

    def check(self, ending: bool) -> None:
        """Called often (each JOIN_POLL_S or so) from the run's start; ending: a stop came. While the run goes on
        a blocked writer only holds the records back (the workers' budgets drop frames); at its end it is given
        up on, at once where it stood still that long already."""
        written = self.sinks.written
        if written != self._last or self.sinks.writing is None:
            self._last, self._since = written, time.monotonic()
        elif ending and not self.sinks.given_up and time.monotonic() - self._since >= self.stuck_s:
            self.sinks.give_up()


def end_writer(stages, sinks, writer: threading.Thread) -> list[str]:
    """The sinks' writer thread ends once it has written what is queued. Where no record is written for
    STAGE_STUCK_S (a sink blocked in a write: a reader that stopped reading stdout), or the stages' end already gave
    it up, it is left behind: its records dropped and counted, the run's failure names the sink. The thread's name
    in a list where it was left behind. stages: what holds the run's `failure` (the daemon's StageLoops, the
    --gpus face)."""
    sinks.finish()
    if sinks.given_up:  # while the stages ended: its write has not returned since
        writer.join(JOIN_POLL_S)
    else:
        StageJoin(lambda: sinks.written, STAGE_STUCK_S)(writer)
    left = [writer.name] if writer.is_alive() else []
    if left:  # given up now, or again: what was queued since (clips' and pictures' records) is dropped too
        sinks.give_up()
    if sinks.given_up:
        stages.failure = stages.failure or (
            f"{sinks.given_up}: {sinks.records_dropped} record(s) not written"
            + (", the sinks' writer left behind" if left else ""))
        log.error("%s", stages.failure)
    return left
