"""NVDEC decoding in a process of its own, into the serving process's device ring slots (CUDA IPC).

Why a process: in one process every decoded frame takes the GIL a few times (PyNvVideoCodec's Decode, the
copy into the slot, its synchronize), and at 32-64 streams the capture threads held a light model at 43-77 %
of what NVDEC decodes (issue 27). PyNvVideoCodec's own cost (~0.4 ms of CPU a frame) is here in a process
with a GIL of its own; the serving process only turns records into batches (87-95 % of NVDEC's rate with 1-2
processes; docs/lab/benchmarks.md).

The serving process owns the memory: it allocates the rings as before and hands this process *credits*,
each a ring slot to fill (a token and the slot's allocation, whose IPC handle it sends once). For each credit
a lane (a thread, a few streams each, as many lanes as the serving side's decode_threads) decodes its stream's
next frame and queues its device-to-device copy into the slot; once a frame of each of its streams is queued,
the lane waits for the copies and answers with fixed-size records (stream, token, presentation time, decode
errors), the round's in one message. A stream
decodes only while it holds credits: the serving process grants them as its queue has room (files: every
frame kept) or as slots are free (--realtime files, paced here by their frame rate; the serving process
drops their oldest when behind).

Messages both ways are bytes: a tag, then either packed fixed-size structs (credits, records: the hot path,
no pickling) or a pickled tuple (opening, removing, ending a stream: rare). A stream whose packets the serving
process keeps (clips around events) has each round's demuxed packets in the round's message, pickled as tuples
ahead of the records: its ring holds a frame's packet before the frame's event can ask for it.
"""

from __future__ import annotations

import ctypes
import logging
import pickle
import signal
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from jetpipe.runtime.cuda import CudaDevice
from jetpipe.runtime.nvdec import NvdecSource, first_line, import_nvdec
from jetpipe.runtime.ring import DeviceSlot
from jetpipe.uri import parse
from jetpipe.video import EndOfStream, KeepClock

log = logging.getLogger(__name__)

CREDIT = struct.Struct("<iiQ")      # stream, token, allocation key (the slot's address in the serving process)
RECORD = struct.Struct("<iidi")     # stream, token, presentation time (s; NaN: unknown), decode errors so far
PACKETS_LENGTH = struct.Struct("<I")  # a round's pickled packets, ahead of its records
TAG_CREDITS, TAG_FRAMES, TAG_MESSAGE, TAG_PACKETS = b"C", b"F", b"M", b"P"
IDLE_WAIT_S = 0.05      # the longest a lane waits when none of its streams has a frame due
CU_CTX_SCHED_BLOCKING_SYNC = 0x04
RETRY_MAX_S = 10.0      # a stream that failed is opened again after a backoff up to this


def pack_message(*message) -> bytes:
    return TAG_MESSAGE + pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def round_message(batches: list, records: list[bytes]) -> bytes:
    """A lane's round in one message: its frames' records, after the packets it demuxed for the serving process's
    clips rings, if any: [(stream, time base, Annex B codec, [Packet fields as a tuple, ...]), ...]
    (PacketBatch.take's, with the stream). One message, not one each: one write here and at most one turn of the
    serving process's link there, and a round's records never arrive apart from its packets. (Measured against
    two messages: no difference larger than the runs' spread; docs/lab/benchmarks.md.)"""
    if not batches:
        return TAG_FRAMES + b"".join(records)
    packets = pickle.dumps(batches, protocol=pickle.HIGHEST_PROTOCOL)
    return b"".join((TAG_PACKETS, PACKETS_LENGTH.pack(len(packets)), packets, *records))


def read_round(message: memoryview) -> tuple[list, memoryview]:
    """A TAG_PACKETS message's packets (round_message's batches) and its records (RECORD structs)."""
    length, = PACKETS_LENGTH.unpack_from(message, 1)
    start = 1 + PACKETS_LENGTH.size
    return pickle.loads(message[start:start + length]), message[start + length:]


@dataclass
class _Decoding:
    """A stream this process decodes: its source, the credits it holds, its progress."""

    stream: int
    source: object
    frame_bytes: int
    limit: int                      # frames to decode, 0: no limit
    credits: deque = field(default_factory=deque)   # (token, allocation key)
    frames: int = 0
    retry_at: float = 0.0           # a failed stream: monotonic time of its next open
    backoff: float = 0.5
    failed: bool = False
    paced: bool = False             # its pace (--realtime) started at its first credit


class PacketBatch(KeepClock):
    """Stands for a clips ring in a decode process: NvdecSource keeps its stream's packets here (as it would in
    the ring), and the stream's lane sends them on to the serving process's ring with the round's records."""

    def __init__(self):
        self.time_base = self.annexb = None  # set by the source at its first packet
        self.cpu_s = 0.0
        self.packets: list[tuple] = []  # a Packet's fields: a tuple pickles and unpickles faster than a dataclass

    def add(self, packet) -> None:
        self.packets.append((packet.t, packet.data, packet.pts, packet.dts, packet.duration, packet.key))

    def add_from(self, address: int, size: int, t: float, pts: int | None, dts: int | None, duration: int,
                 key: bool) -> None:
        """A packet's bytes at address, in the demuxer's buffer (it reuses it): copied."""
        self.packets.append((t, ctypes.string_at(address, size), pts, dts, duration, key))

    def take(self) -> tuple | None:
        """(time base, Annex B codec, packets) of what was kept since the last take; None if nothing was."""
        if not self.packets:
            return None
        packets, self.packets = self.packets, []
        return self.time_base, self.annexb, packets


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]  # CUipcMemHandle


class _IpcSlots:
    """Allocations of the serving process opened here, once each (cuIpcOpenMemHandle), by their key."""

    def __init__(self):
        self._libcuda = ctypes.CDLL("libcuda.so.1")
        self._pointers: dict[int, int] = {}
        self._handles: dict[int, bytes] = {}
        self._lock = threading.Lock()  # lanes open handles; each once

    def learn(self, handles: dict[int, bytes]) -> None:
        self._handles.update(handles)

    def address(self, key: int, device) -> int:
        pointer = self._pointers.get(key)
        if pointer is None:
            with self._lock, device.active():
                pointer = self._pointers.get(key) or self._open(key)
        return pointer

    def _open(self, key: int) -> int:
        handle = _IpcHandle.from_buffer_copy(self._handles[key])  # a struct passed by value, not a pointer
        opened = ctypes.c_uint64()
        status = self._libcuda.cuIpcOpenMemHandle_v2(ctypes.byref(opened), handle, ctypes.c_uint(1))
        if status != 0:
            raise RuntimeError(f"cuIpcOpenMemHandle failed with CUDA error {status}")
        self._pointers[key] = opened.value
        return opened.value

    def close(self) -> None:
        for pointer in self._pointers.values():
            self._libcuda.cuIpcCloseMemHandle(ctypes.c_uint64(pointer))
        self._pointers.clear()


class DecodeWorker:
    """A decode process: its main thread reads messages; lanes (threads, LANES at most) decode the streams, each
    lane a few in turn. Several lanes keep several frames in flight on NVDEC: a decode waits for the GPU
    (the frame's copy out of the decoder, its copy into the slot), and a process with one context on the
    GPU among others waits for its turn there."""

    def __init__(self, conn, ordinal: int, lanes: int):
        self.conn = conn
        self.device = CudaDevice(ordinal)
        self.nvc = import_nvdec()
        self.slots = _IpcSlots()
        self.lanes = [_Lane(self, k) for k in range(lanes)]
        self._lane_of: dict[int, _Lane] = {}   # stream -> the lane it was given at its open
        self.removed: list = []     # sources of streams that ended or were removed, not closed yet
        self.lock = threading.Lock()   # removed; and one writer on the pipe at a time
        self.running = True

    def lane(self, stream: int) -> _Lane:
        """A stream's lane (lane 0 for one never opened here: its credits and removal find nothing there)."""
        return self._lane_of.get(stream, self.lanes[0])

    def assign_lane(self, stream: int) -> _Lane:
        """The lane with the fewest streams. Not the stream's number modulo the lanes: the serving process opens
        streams in the least loaded of its processes in turn, so with 2 processes each saw every other number,
        and half of its lanes got two streams while the other half stayed idle."""
        lane = min(self.lanes, key=lambda candidate: len(candidate.streams))
        self._lane_of[stream] = lane
        return lane

    def send(self, data: bytes) -> None:
        with self.lock:
            self.conn.send_bytes(data)

    def say(self, *message) -> None:
        self.send(pack_message(*message))

    # --- messages ------------------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            while self.running:
                data = self.conn.recv_bytes()
                if data[:1] == TAG_CREDITS:
                    for stream, token, key in CREDIT.iter_unpack(memoryview(data)[1:]):
                        self.lane(stream).credit(stream, token, key)
                else:
                    self._handle(pickle.loads(data[1:]))
        except (EOFError, BrokenPipeError, ConnectionResetError):  # the serving process is gone
            pass
        finally:
            self.close()

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "open":
            self._open(*message[1:])
        elif kind == "handles":
            self.slots.learn(message[1])
        elif kind == "remove":
            self.lane(message[1]).remove(message[1])
        elif kind == "packets":
            self.lane(message[1]).keep_packets(message[1])
        elif kind == "exit":
            self.running = False

    # --- streams -------------------------------------------------------------------------------------------
    def _open(self, stream: int, location: str, loop: bool, realtime: bool, limit: int) -> None:
        """Open a file for NVDEC; answer ("opened", stream, info fields) or ("unsupported", stream, why)."""
        self._close_removed()  # their decoders' memory, before another decoder takes some
        try:
            source = NvdecSource(self.device, self.nvc, parse(location), loop, realtime)
            info = source.open()
        except Exception as exc:  # not 8-bit 4:2:0, a codec the GPU lacks, not a video: FFmpeg decodes it
            self.say("unsupported", stream, first_line(exc), time.process_time())
            return
        source.paced_by_caller = True  # paced by its lane (due_in), never asleep inside a read
        self.assign_lane(stream).add(_Decoding(stream, source, info.height * info.width * 3 // 2, limit))
        self.say("opened", stream, (info.format, info.height, info.width, info.standard, info.range, info.fps),
                 time.process_time())

    def ended(self, decoding: _Decoding, how: str, why: str = "") -> None:
        """The stream is done here (ended, removed, at its limit), said after its last record: the slots of
        the credits it still holds are the serving process's again."""
        with self.lock:
            self.removed.append(decoding.source)
        self._lane_of.pop(decoding.stream, None)  # streams come and go (the control API): the map keeps none
        self.say("ended", decoding.stream, how, why, decoding.frames, decoding.source.decode_errors,
                 time.process_time())

    def _close_removed(self) -> None:
        """Close the decoders of streams that ended or were removed. Not at once: freeing a decoder's memory
        waits for the GPU, and at a stop every stream ends while the serving process drains its batches."""
        with self.lock:
            removed, self.removed = self.removed, []
        for source in removed:
            try:
                source.close()
            except Exception as exc:
                log.warning("decode process: closing %s: %s", source.uri, exc)

    def close(self) -> None:
        self.running = False
        for lane in self.lanes:
            lane.stop()
        for lane in self.lanes:
            self.removed += lane.release()
        self._close_removed()
        with self.device.active():
            self.slots.close()
        self.device.close()


class _Lane:
    """A thread of a decode process and the streams it decodes, a frame each in turn."""

    def __init__(self, worker: DecodeWorker, index: int):
        self.worker, self.index = worker, index
        self.cond = threading.Condition()
        self.streams: dict[int, _Decoding] = {}
        self._removing: set[int] = set()
        self._thread: threading.Thread | None = None

    def add(self, decoding: _Decoding) -> None:
        with self.cond:
            self.streams[decoding.stream] = decoding
            if self._thread is None:  # started with its first stream
                self._thread = threading.Thread(target=self._run, name=f"decode-lane-{self.index}", daemon=True)
                self._thread.start()
            self.cond.notify()

    def credit(self, stream: int, token: int, key: int) -> None:
        with self.cond:
            decoding = self.streams.get(stream)
            if decoding is not None:
                if not decoding.paced:  # its first credit: it was opened at start-up, it is read from now
                    decoding.source.pace_from_now()
                    decoding.paced = True
                decoding.credits.append((token, key))
                self.cond.notify()

    def remove(self, stream: int) -> None:
        with self.cond:
            self._removing.add(stream)
            self.cond.notify()

    def keep_packets(self, stream: int) -> None:
        """The stream's packets go to the serving process from now on (its clips' ring)."""
        with self.cond:
            decoding = self.streams.get(stream)
            if decoding is not None and decoding.source.packet_ring is None:
                decoding.source.packet_ring = PacketBatch()

    def stop(self) -> None:
        with self.cond:
            self.cond.notify()
        if self._thread is not None:
            self._thread.join()

    def release(self) -> list:
        """The sources still here (the process exits)."""
        sources = [d.source for d in self.streams.values()]
        self.streams.clear()
        return sources

    def _run(self) -> None:
        try:
            self._decode()
        except (EOFError, OSError):  # the serving process is gone: the process ends
            self.worker.running = False

    def _decode(self) -> None:
        while self.worker.running:
            with self.cond:
                removed = [self.streams.pop(s) for s in self._removing if s in self.streams]
                self._removing.clear()
                now = time.monotonic()
                turn = [d for d in self.streams.values()
                        if (d.failed and d.retry_at <= now) or (not d.failed and d.credits and d.source.due_in() <= 0)]
                if not (turn or removed):
                    self.cond.wait(self._idle_wait(now))
                    continue
            for decoding in removed:
                self.worker.ended(decoding, "removed")
            records = self._round(turn)
            batches = self._packets_taken(turn)
            if records or batches:
                self.worker.send(round_message(batches, records))

    @staticmethod
    def _packets_taken(turn: list[_Decoding]) -> list:
        """The packets the round demuxed, of the streams whose packets are kept."""
        return [(d.stream, *taken) for d in turn
                if d.source.packet_ring is not None and (taken := d.source.packet_ring.take()) is not None]

    def _idle_wait(self, now: float) -> float:
        """Until the soonest paced frame or retry is due, at most IDLE_WAIT_S."""
        soonest = IDLE_WAIT_S
        for d in self.streams.values():
            if d.failed:
                soonest = min(soonest, d.retry_at - now)
            elif d.credits:
                soonest = min(soonest, d.source.due_in())
        return max(0.0, soonest)

    def _round(self, turn: list[_Decoding]) -> list[bytes]:
        """A frame of each stream whose turn it is: every decode and copy queued first, then the copies waited
        for. Waiting for each copy before the next stream's decode kept a lane's NVDEC work and its waits in
        series (8 lanes for 32 streams gave 73 % of NVDEC's rate; docs/lab/benchmarks.md)."""
        started = []  # (decoding, the time of its frame in flight)
        for decoding in turn:
            if decoding.failed:
                self._retry(decoding)
            elif (in_flight := self._start(decoding)) is not None:
                started.append(in_flight)
        return [r for r in (self._finish(*s) for s in started) if r is not None]

    def _start(self, decoding: _Decoding) -> tuple[_Decoding, float | None] | None:
        """Its next frame decoded and its copy into the credit's slot queued: (decoding, the frame's time), or
        None when it ended or failed."""
        _token, key = decoding.credits[0]
        info = decoding.source.info
        try:
            slot = DeviceSlot(self.worker.slots.address(key, self.worker.device), decoding.frame_bytes,
                              info.format, info.height, info.width)
            return decoding, decoding.source.start_read(slot)
        except EndOfStream:
            self._end(decoding, "ended")
        except Exception as exc:  # a read that failed: said, the stream opened again after a backoff
            self._read_failed(decoding, exc)
        return None

    def _read_failed(self, decoding: _Decoding, exc: Exception) -> None:
        decoding.source.close()
        self._failed(decoding, exc)

    def _finish(self, decoding: _Decoding, pts: float | None) -> bytes | None:
        """The record of a frame whose copy is done (None: the copy failed, or the stream is at its limit)."""
        try:
            decoding.source.finish_read()
        except Exception as exc:
            self._read_failed(decoding, exc)
            return None
        token, _key = decoding.credits.popleft()
        decoding.frames += 1
        record = RECORD.pack(decoding.stream, token, float("nan") if pts is None else pts,
                             decoding.source.decode_errors)
        if decoding.limit and decoding.frames >= decoding.limit:
            # its last packets and record before its end, so that they count
            self.worker.send(round_message(self._packets_taken([decoding]), [record]))
            self._end(decoding, "limit")
            return None
        return record

    def _end(self, decoding: _Decoding, how: str) -> None:
        with self.cond:
            self.streams.pop(decoding.stream, None)
        self.worker.ended(decoding, how)

    def _failed(self, decoding: _Decoding, exc: Exception) -> None:
        decoding.failed, decoding.retry_at = True, time.monotonic() + decoding.backoff
        self.worker.say("failed", decoding.stream, str(exc)[:300], decoding.backoff)
        decoding.backoff = min(decoding.backoff * 2, RETRY_MAX_S)

    def _retry(self, decoding: _Decoding) -> None:
        try:
            decoding.source.open()
        except Exception as exc:
            self._failed(decoding, exc)
            return
        decoding.failed, decoding.backoff = False, 0.5


def blocking_sync(ordinal: int) -> None:
    """This process's primary context waits for the GPU asleep, not spinning: its lanes wait there most of
    the time (each a core, spinning)."""
    driver, device = ctypes.CDLL("libcuda.so.1"), ctypes.c_int()
    if driver.cuInit(0) == 0 and driver.cuDeviceGet(ctypes.byref(device), ordinal) == 0:
        driver.cuDevicePrimaryCtxSetFlags_v2(device, ctypes.c_uint(CU_CTX_SCHED_BLOCKING_SYNC))


def worker_main(conn, ordinal: int, lanes: int, log_level: int) -> None:
    """A decode process's entry (multiprocessing, spawned: CUDA cannot be forked)."""
    # Ctrl-C reaches the whole process group, and systemd's SIGTERM every process of the unit: the serving
    # process stops its streams, drains, then asks this one to exit (the pipe's end if it is killed)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s decode-%(process)d %(message)s")
    try:
        blocking_sync(ordinal)
        worker = DecodeWorker(conn, ordinal, lanes)
    except Exception as exc:
        try:
            conn.send_bytes(pack_message("broken", f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
        return
    conn.send_bytes(pack_message("ready", time.process_time()))
    worker.run()
    try:
        conn.send_bytes(pack_message("exited", time.process_time()))
    except OSError:
        pass
