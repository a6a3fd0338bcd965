"""NVDEC files decoded in processes of their own (`decode_processes`), the frames written into this process's
ring slots through CUDA IPC (runtime.nvdec_procs says how a decode process works and why).

This side spawns the processes and keeps a link thread for each: it grants credits (ring slots, taken as
the capture loop takes them: a file's only while its queue has room, a live stream's dropping its oldest
queued frame when none is free), turns the records that come back into Packets for the batcher, and passes
on what the process says of a stream (ended, failed, reopened). The daemon sees a RemoteNvdecSource: a
source whose frames come through the link instead of a capture thread. The link waits on the process's
pipe and on a wake pipe that the batcher writes when one of its streams' frames is taken (room for a file).
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import pickle
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_for_any
from pathlib import Path

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.ingest.sources.base import not_teed
from jetpipe.runtime.nvdec_procs import (
    CREDIT,
    RECORD,
    TAG_CREDITS,
    TAG_FRAMES,
    TAG_PACKETS,
    pack_message,
    read_round,
    worker_main,
)
from jetpipe.video import FrameInfo, Packet, file_bit_rate

log = logging.getLogger(__name__)

LIVE_CREDITS = 2        # slots a live stream's process may hold: the frame being decoded and the next
START_TIMEOUT_S = 120.0  # a decode process spawns (imports, CUDA context) and opens a file within this
POLL_S = 0.05           # the longest a link waits without looking at stops
RESPAWN_MAX_S = 10.0    # the longest wait before a decode process that exited is replaced
STARVED_S = 0.001       # every ring slot in flight on the GPU: look again this soon (a release is not signalled)
# a decode process's threads unless told: each queues a frame of each of its streams (decode, copy) before it waits
# for their copies, so a few keep NVDEC busy, and every waiting thread costs CPU in NVIDIA's video library's
# polling. On H100s, 32 and 64 streams: 4 threads 94-97 % of PyNvVideoCodec alone on 1.5-1.6 CPU cores (three
# runs); 8 threads 82-96 % on 1.7-2.1; a thread a stream (32) 87-95 % on 2.6-3.0 (docs/lab/benchmarks.md)
AUTO_DECODE_THREADS = 4
CPU_SAID = ("ready", "opened", "unsupported", "ended", "exited")  # messages whose last field is the process's CPU


class DecodeProcessError(JetpipeError):
    """A decode process could not start."""


class RemoteNvdecSource:
    """A file NVDEC decodes in a decode process: what the daemon asks of a source; its frames come through
    the process's link, never through read_into."""

    memory = "device"
    decoder_name = "nvdec"
    shares_thread = False
    paced_by_caller = True
    keeps_packets = True  # its process's demuxer sends them (the link adds them to the ring)
    tee_packets = not_teed  # (files only)

    def __init__(self, uri, loop: bool, realtime: bool, info: FrameInfo, remote_id: int, process: int):
        """uri: the file's SourceURI."""
        self.source_uri, self.uri, self.location = uri, uri.text, uri.location
        self.packet_ring = None  # clips.PacketRing, set by the clips writer
        self.loop, self.realtime, self.live = loop, realtime, realtime
        self.info, self.remote_id, self.process = info, remote_id, process
        self.decode_errors = 0

    def open(self) -> FrameInfo:
        return self.info

    def due_in(self) -> float:
        return 0.0

    def describe(self) -> str:
        return f"{self.uri} (nvdec, decode process {self.process})"

    @property
    def bit_rate(self) -> float:
        return file_bit_rate(self.location)

    def interrupt(self) -> None:
        """Stopping is asked through the link (the stream's stop event)."""

    def restart(self) -> bool:
        """A file decoded in a process has no connection to end."""
        return False

    def close(self) -> None:
        """The decoder lives in the decode process, closed when it exits."""


@dataclass
class _Remote:
    source: RemoteNvdecSource
    limit: int                       # frames to decode (0: no limit)
    handle: object = None            # the daemon's Stream, once its capture started
    reopening: bool = False          # its process was replaced: no credit until the new one opened it
    tokens: dict = field(default_factory=dict)   # credit token -> ring slot, while the process holds it
    next_token: int = 0
    frames: int = 0                  # frames delivered
    remove_sent: bool = False
    packets_asked: bool = False      # its process was asked for its packets (clips)

    def open_message(self) -> bytes:
        """Its open, for a process that takes it over: what is left of its frame limit."""
        left = max(1, self.limit - self.frames) if self.limit else 0
        source = self.source
        return _open_message(source.remote_id, source.location, source.loop, source.realtime, left)


def keep_packets(remotes: dict, batches: list) -> None:
    """A decode process's demuxed packets (runtime.nvdec_procs.round_message), into the clips rings of their
    streams (remote id -> _Remote), timed as a source's keeping is."""
    for rid, time_base, annexb, packets in batches:
        remote = remotes.get(rid)
        ring = None if remote is None else remote.source.packet_ring
        if ring is None:  # removed meanwhile
            continue
        started = time.thread_time()  # (a batch of packets: one clock read pays)
        if ring.time_base is None:
            ring.time_base, ring.annexb = time_base, annexb
        for fields in packets:
            ring.add(Packet(*fields))
        ring.cpu_s += time.thread_time() - started


def _open_message(remote_id: int, location: str, loop: bool, realtime: bool, limit: int) -> bytes:
    return pack_message("open", remote_id, location, loop, realtime, limit)


class _Waker:
    """Stands for a threading.Condition in the batcher's room_waiter: notify() wakes the link through a pipe.
    Called with the batcher's lock held, once per frame taken: a flag keeps it to one write per wake."""

    def __init__(self):
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)
        self._pending = False

    def notify(self, n: int = 1) -> None:
        if not self._pending:
            self._pending = True
            try:
                os.write(self.write_fd, b"x")
            except BlockingIOError:  # full: a wake is pending anyway
                pass

    notify_all = notify

    def clear(self) -> None:
        self._pending = False
        try:
            os.read(self.read_fd, 4096)
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)


class _Link:
    """One decode process and the thread that serves it."""

    def __init__(self, index: int, context, device, host, start_thread, lanes: int):
        self.index, self.device, self.host = index, device, host
        self._context, self._lanes = context, lanes
        self.waker = _Waker()
        self._spawn()
        self.remotes: dict[int, _Remote] = {}
        self.opening: dict[int, list] = {}     # remote id -> [event, answer]
        self.cpu_s = 0.0                        # the process's CPU time, as it last said
        self.cpu_spent = 0.0                    # the CPU time of the processes it replaced
        self.lock = threading.Lock()            # remotes, opening; and one writer on the pipe at a time
        self.closing, self.gone = False, None   # gone: why the process is no longer there
        self.ready = threading.Event()
        self.finished = threading.Event()       # its thread ended: the pipes may be closed
        self._starved = False
        self._backoff = 0.5                     # before a process that exited is replaced
        self.native_id: int | None = None       # its thread's, for its CPU time
        start_thread(self._run, f"decode-link-{index}")

    def _spawn(self) -> None:
        parent, child = self._context.Pipe(duplex=True)
        self.process = self._context.Process(
            target=worker_main, name=f"jetpipe-decode-{self.index}", daemon=True,
            args=(child, self.device.ordinal, self._lanes, logging.getLogger().getEffectiveLevel()))
        self.process.start()
        child.close()
        self.conn = parent
        self.handles_sent: set[int] = set()     # the slots whose IPC handle this process was sent

    def __len__(self) -> int:
        return len(self.remotes)

    def send(self, data: bytes) -> None:
        with self.lock:
            self.conn.send_bytes(data)

    # --- opening ---------------------------------------------------------------------------------------------
    def open(self, remote_id: int, uri, loop: bool, realtime: bool, limit: int, timeout: float):
        """("opened", info fields) or ("unsupported", why) from the process."""
        waiting = [threading.Event(), None]
        with self.lock:
            self.opening[remote_id] = waiting
        self.send(_open_message(remote_id, uri.location, loop, realtime, limit))
        if not waiting[0].wait(timeout):
            with self.lock:
                self.opening.pop(remote_id, None)
            self.send(pack_message("remove", remote_id))  # should it open after all: not decoded for nothing
            return ("unsupported", f"decode process {self.index} did not open it within {timeout:.0f} s")
        return waiting[1]

    # --- the thread ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        self.native_id = threading.get_native_id()
        try:
            while not (self.closing and not self.remotes):
                try:
                    self._serve()
                except (EOFError, OSError) as exc:
                    if self.closing or self.gone is not None:
                        raise
                    self._replace(exc)
        except (EOFError, OSError) as exc:
            self._lost(f"decode process {self.index} exited ({exc or type(exc).__name__})")
        except Exception as exc:  # a fault here: its streams end, said why, rather than wait for frames forever
            log.exception("decode process %d: its link failed", self.index)
            self._lost(f"decode process {self.index}: its link failed ({type(exc).__name__}: {exc})")
        finally:
            self.finished.set()

    def _serve(self) -> None:
        """One turn: credits granted, then what the process sent or the batcher woke it for. A stream's packets
        are asked for before its credits: the process reads its messages in order, so its first frame's packets
        (the keyframe and parameter sets a clip starts with) are kept."""
        if self.gone is None:
            self._ask_packets()
            self._grant()
        ready = wait_for_any([self.conn, self.waker.read_fd], STARVED_S if self._starved else POLL_S)
        if self.waker.read_fd in ready:
            self.waker.clear()
        if self.conn in ready:
            self._receive()
        self._ask_removals()

    def _replace(self, exc: BaseException) -> None:
        """The process exited while serving (a crash in the decoder, killed): nothing writes the slots it held
        now. Its streams count a failure and a reconnect, and are opened again in a new process after a
        backoff (as a source that fails in this process is)."""
        self.process.join(5)
        if self.process.is_alive():  # its pipe failed, not the process: it must not write the slots any more
            self.process.kill()
            self.process.join(5)
        why = f"decode process {self.index} exited (exit code {self.process.exitcode})"
        with self.lock:
            remotes = [r for r in self.remotes.values() if r.handle is not None]
            for rid in [rid for rid, r in self.remotes.items() if r.handle is None]:
                del self.remotes[rid]  # opened, never started: not reopened
        self._refuse_opening(why)
        log.error("%s: its %d stream(s) open in a new one in %.1f s", why, len(remotes), self._backoff)
        for remote in remotes:
            self._free_credits(remote)
            remote.reopening, remote.packets_asked = True, False
            self.host.failed(remote.handle, why, self._backoff)
        self.conn.close()
        self.cpu_spent, self.cpu_s = self.cpu_spent + self.cpu_s, 0.0
        resume = time.monotonic() + self._backoff
        while time.monotonic() < resume:
            if self.closing:  # the run is over: no new process
                raise EOFError(why)
            time.sleep(0.05)
        self._backoff = min(2 * self._backoff, RESPAWN_MAX_S)
        self._spawn()
        for remote in remotes:
            self.send(remote.open_message())

    def _grant(self) -> None:
        """Credits for every started stream that wants more, in one message (the slots' IPC handles first,
        once each)."""
        credits, handles, starved = [], {}, False
        with self.lock:
            remotes = [(rid, r) for rid, r in self.remotes.items()
                       if r.handle is not None and not (r.remove_sent or r.reopening)]
        for rid, remote in remotes:
            for _ in range(self.host.credits_wanted(remote.handle, len(remote.tokens))):
                slot = self.host.acquire(remote.handle)
                if slot is None:
                    starved = True
                    break
                key = self.host.slot_address(remote.handle, slot)
                if key not in self.handles_sent:
                    with self.device.active():
                        handles[key] = self.device.ipc_handle(key)
                    self.handles_sent.add(key)
                token = remote.next_token
                remote.next_token += 1
                remote.tokens[token] = slot
                credits.append(CREDIT.pack(rid, token, key))
        self._starved = starved
        if handles:
            self.send(pack_message("handles", handles))
        if credits:
            self.send(TAG_CREDITS + b"".join(credits))

    def _receive(self) -> None:
        while True:
            data = self.conn.recv_bytes()
            if data[:1] == TAG_FRAMES:
                self._frames(memoryview(data)[1:])
            elif data[:1] == TAG_PACKETS:  # a round whose packets clips keep: the packets first
                batches, records = read_round(memoryview(data))
                keep_packets(self.remotes, batches)
                self._frames(records)
            else:
                self._message(pickle.loads(data[1:]))
            if not self.conn.poll(0):
                return

    def _frames(self, payload) -> None:
        for rid, token, pts, errors in RECORD.iter_unpack(payload):
            remote = self.remotes[rid]
            slot = remote.tokens.pop(token)
            remote.source.decode_errors = errors
            self.host.deliver(remote.handle, slot, None if math.isnan(pts) else pts, remote.frames)
            remote.frames += 1

    def _message(self, message: tuple) -> None:
        kind = message[0]
        if kind in CPU_SAID:
            self.cpu_s = max(self.cpu_s, message[-1])
        if kind in ("opened", "unsupported"):
            with self.lock:
                waiting = self.opening.pop(message[1], None)
            if waiting is not None:
                waiting[1] = (kind, message[2])
                waiting[0].set()
            else:
                self._reopened(message[1], kind == "opened", message[2])
        elif kind == "ended":  # after the stream's last record: a slot it still holds will not be written
            _, rid, how, why, _frames, errors, _cpu = message
            with self.lock:
                remote = self.remotes.pop(rid, None)
            if remote is not None and remote.handle is not None:
                remote.source.decode_errors = errors
                self._free_credits(remote)
                self.host.ended(remote.handle, how, why, remote.frames)
        elif kind == "failed":
            _, rid, why, backoff = message
            remote = self.remotes.get(rid)
            if remote is not None and remote.handle is not None:
                self.host.failed(remote.handle, why, backoff)
        elif kind in ("ready", "exited"):
            self.ready.set()
        elif kind == "broken":
            self.gone = message[1]
            self.ready.set()

    def _reopened(self, rid: int, opened: bool, answer) -> None:
        """A replaced process's answer for a stream it took over."""
        remote = self.remotes.get(rid)
        if remote is None:
            return
        if opened:
            remote.reopening, self._backoff = False, 0.5
            return
        with self.lock:
            self.remotes.pop(rid, None)
        self.host.ended(remote.handle, "failed", f"the new decode process could not open it: {answer}",
                        remote.frames)

    def _ask_removals(self) -> None:
        with self.lock:
            asked = [rid for rid, r in self.remotes.items() if not r.remove_sent and
                     (self.closing or (r.handle is not None and self.host.stopping(r.handle)))]
            for rid in asked:
                self.remotes[rid].remove_sent = True
        for rid in asked:
            self.send(pack_message("remove", rid))

    def _ask_packets(self) -> None:
        """Streams given a clips ring since the last turn: their process sends their packets from now on."""
        with self.lock:
            asked = [rid for rid, r in self.remotes.items()
                     if r.source.packet_ring is not None and not (r.packets_asked or r.reopening or r.remove_sent)]
            for rid in asked:
                self.remotes[rid].packets_asked = True
        for rid in asked:
            self.send(pack_message("packets", rid))

    def _lost(self, why: str) -> None:
        """The process is gone: nothing writes the slots it held now; its streams end, said why."""
        self.gone = self.gone or why
        self.ready.set()
        with self.lock:
            remotes, self.remotes = list(self.remotes.values()), {}
        self._refuse_opening(why)
        for remote in remotes:
            if remote.handle is None or self.closing:  # closing: the run is over, its rings about to be freed
                continue
            self._free_credits(remote)
            self.host.ended(remote.handle, "failed", why, remote.frames)

    def _refuse_opening(self, why: str) -> None:
        """The opens waiting for a process that is gone are answered: not opened (decoded in this process)."""
        with self.lock:
            opening, self.opening = list(self.opening.values()), {}
        for waiting in opening:
            waiting[1] = ("unsupported", why)
            waiting[0].set()

    def _free_credits(self, remote: _Remote) -> None:
        """The slots of the credits a stream holds are the ring's again: its process will not write them."""
        for slot in remote.tokens.values():
            self.host.release(remote.handle, slot)
        remote.tokens.clear()

    def close(self, timeout: float) -> None:
        self.closing = True
        self.waker.notify()
        try:
            self.send(pack_message("exit"))
        except OSError:
            pass
        self.process.join(timeout)
        if self.process.is_alive():
            log.warning("decode process %d did not exit within %.0f s: killed", self.index, timeout)
            self.process.kill()
            self.process.join(5)
        self.finished.wait(5)  # the thread reads the pipe's end once the process is gone
        self.conn.close()
        self.waker.close()


def thread_cpu_seconds(native_id: int | None) -> float:
    """Another thread's CPU time (time.thread_time() reads only the caller's), from /proc: Linux, 0.0
    elsewhere or once the thread ended."""
    if native_id is None:
        return 0.0
    try:
        fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15


def decoding_threads(streams: int, processes: int, asked: int = 0) -> int:
    """Threads a decode process decodes with: `asked` (serve's decode_threads), or a thread for each stream of
    its share, AUTO_DECODE_THREADS at most."""
    return asked or min(AUTO_DECODE_THREADS, math.ceil(streams / processes))


class DecodeProcesses:
    """`count` decode processes on `device`, serving the streams the daemon opens through them (up to
    `streams`: each process gets a decoding thread for each of its share, AUTO_DECODE_THREADS at most; `threads`,
    when given, instead. Each waiting thread costs CPU in NVIDIA's video library, which polls for its frame).

    host: the daemon, which answers for a stream (its Stream handle): credits_wanted(handle, held),
    acquire(handle) -> ring slot | None, slot_address(handle, slot), deliver(handle, slot, pts, frame_no),
    release(handle, slot), ended(handle, how, why, frames), failed(handle, why, backoff), stopping(handle).
    start_thread(target, name): a started thread (the daemon's, which counts its CPU)."""

    def __init__(self, count: int, device, host, start_thread, streams: int, timeout: float = START_TIMEOUT_S,
                 threads: int = 0):
        context = multiprocessing.get_context("spawn")  # a forked child cannot use CUDA
        self.timeout = timeout
        self.links: list[_Link] = []
        self._next_id = 0
        self._cpu_marks: list[float] = []
        self._link_marks: list[float] = []
        lanes = decoding_threads(streams, count, threads)
        try:
            for k in range(count):
                self.links.append(_Link(k, context, device, host, start_thread, lanes))
            deadline = time.monotonic() + timeout
            for link in self.links:
                if not link.ready.wait(max(0.0, deadline - time.monotonic())) or link.gone:
                    raise DecodeProcessError(f"decode process {link.index} did not start"
                                             f"{': ' + link.gone if link.gone else f' within {timeout:.0f} s'}: "
                                             "set decode_processes = 0 to decode in this process")
        except BaseException:
            self.close()
            raise

    def open(self, uri, loop: bool, realtime: bool, limit: int) -> RemoteNvdecSource | str:
        """A RemoteNvdecSource for a video file, opened in the least loaded process; or why NVDEC cannot
        take it there (the caller decodes it in this process)."""
        link = min((lk for lk in self.links if lk.gone is None), key=len, default=None)
        if link is None:
            return "no decode process is running"
        remote_id, self._next_id = self._next_id, self._next_id + 1
        kind, answer = link.open(remote_id, uri, loop, realtime, limit, self.timeout)
        if kind != "opened":
            return answer
        source = RemoteNvdecSource(uri, loop, realtime, FrameInfo(*answer), remote_id, link.index)
        with link.lock:
            link.remotes[remote_id] = _Remote(source, limit)
        return source

    def start(self, handle) -> None:
        """Frames for this stream (its source a RemoteNvdecSource) from now on."""
        link = self.links[handle.source.process]
        with link.lock:
            remote = link.remotes.get(handle.source.remote_id)
            if remote is not None:
                remote.handle = handle
        if remote is None:  # its process is gone
            link.host.ended(handle, "failed", link.gone or "decode process gone", 0)
            return
        link.waker.notify()

    def waker(self, handle):
        """What the batcher notifies when a frame of this stream is taken."""
        return self.links[handle.source.process].waker

    def wake(self) -> None:
        for link in self.links:
            link.waker.notify()

    def mark_cpu(self) -> None:
        """The run starts: cpu_seconds() counts from here (a process's start-up and opening are not the run's)."""
        self._cpu_marks = [link.cpu_spent + link.cpu_s for link in self.links]
        self._link_marks = [thread_cpu_seconds(link.native_id) for link in self.links]

    def link_cpu_seconds(self) -> float:
        """The CPU time of the link threads (in this process) since mark_cpu()."""
        marks = self._link_marks or [0.0] * len(self.links)
        return sum(thread_cpu_seconds(link.native_id) - mark for link, mark in zip(self.links, marks))

    def cpu_seconds(self) -> float:
        """The decode processes' CPU time since mark_cpu(), as they last said it (each says it as a stream of its
        opens and ends: at the end of a run, once its last stream ended)."""
        marks = self._cpu_marks or [0.0] * len(self.links)
        return sum(link.cpu_spent + link.cpu_s - mark for link, mark in zip(self.links, marks))

    def close(self) -> None:
        for link in self.links:
            link.closing = True
            link.waker.notify()
        for link in self.links:
            link.close(timeout=10.0)
        self.links = []
