"""The CUDA context, streams and allocations: the only owner of CUDA resources.

One context per process: the device's *primary* context, which TensorRT and
ONNX Runtime (CUDA runtime API) use too. Every thread that issues CUDA work
pushes it (`with device.active():`); nothing is created at import.
Every allocation goes through `alloc` / `pinned`, which count them, so tests
can show the frame loop allocates nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.runtime.probe import PYCUDA_MISSING, probe_gpu

log = logging.getLogger(__name__)

MEMORY_MODES = ("auto", "mapped", "staged", "device")
_CU_STREAM_NON_BLOCKING = 1
_CU_EVENT_DISABLE_TIMING = 2


class GpuUnavailable(JetpipeError):
    """No PyCUDA or no usable GPU: the caller may fall back to the CPU runtime."""


def import_pycuda():
    try:
        import pycuda.driver as cuda
    except ImportError:
        raise GpuUnavailable(PYCUDA_MISSING) from None
    return cuda


class CudaDevice:
    """A GPU, its primary context and jetpipe's allocation accounting."""

    def __init__(self, ordinal: int = 0):
        facts = probe_gpu(ordinal)
        if not facts.usable:
            raise GpuUnavailable(facts.reason)
        cuda = import_pycuda()
        self.cuda, self.ordinal, self.facts = cuda, ordinal, facts
        self.device = cuda.Device(ordinal)
        self.name, self.compute_capability = facts.name, facts.compute_capability
        self.integrated, self.can_map_host_memory = facts.integrated, facts.can_map_host_memory
        self.context = self.device.retain_primary_context()
        self.allocations = 0
        self._owned: list = []

    @contextlib.contextmanager
    def active(self):
        """Make the primary context current on this thread for the block."""
        self.context.push()
        try:
            yield self
        finally:
            self.cuda.Context.pop()

    def memory_mode(self, requested: str = "auto") -> str:
        """Integrated GPU (Jetson): mapped zero-copy frames; discrete: pinned staging + async copy."""
        if requested not in MEMORY_MODES:
            raise JetpipeError(f"memory mode {requested!r}: choose one of {', '.join(MEMORY_MODES)}")
        if requested == "auto":
            return "mapped" if self.integrated else "staged"
        if requested == "mapped" and not self.can_map_host_memory:
            raise JetpipeError(f"{self.name} cannot map host memory: use memory 'staged'")
        return requested

    def alloc(self, nbytes: int):
        """Device memory (call inside `active()`); freed by close()."""
        allocation = self.cuda.mem_alloc(max(1, int(nbytes)))
        self.allocations += 1
        self._owned.append(allocation)
        return allocation

    def pinned(self, shape, dtype, mapped: bool = False) -> np.ndarray:
        """Page-locked host memory; `mapped` makes it readable by kernels (zero copy)."""
        flags = self.cuda.host_alloc_flags.DEVICEMAP if mapped else 0
        array = self.cuda.pagelocked_empty(shape, dtype, mem_flags=flags)
        self.allocations += 1
        self._owned.append(array)
        return array

    def register_host(self, array: np.ndarray) -> np.ndarray:
        """Page-lock memory allocated elsewhere (a shared-memory region) for asynchronous copies to and from
        it; unregistered by close(). Through the driver API itself: PyCUDA's register_host_memory fails under
        NumPy 2 ("Cannot set the NumPy array 'base' dependency more than once")."""
        driver = libcuda()
        address = array.ctypes.data
        status = driver.cuMemHostRegister_v2(ctypes.c_void_p(address), ctypes.c_size_t(array.nbytes), 0)
        if status != 0:
            raise JetpipeError(f"cuMemHostRegister of {array.nbytes} bytes failed with CUDA error {status}")
        self.allocations += 1
        self._owned.append(_Registered(driver, address, array))
        return array

    def ipc_handle(self, allocation: int) -> bytes:
        """The CUDA IPC handle of a device allocation (its base address): another process on this machine (a
        Triton server) opens it and reads and writes the allocation in place."""
        handle = (ctypes.c_ubyte * 64)()  # CUipcMemHandle
        status = libcuda().cuIpcGetMemHandle(ctypes.byref(handle), ctypes.c_uint64(int(allocation)))
        if status != 0:
            raise JetpipeError(f"cuIpcGetMemHandle failed with CUDA error {status}")
        return bytes(handle)

    @staticmethod
    def device_pointer(mapped_array: np.ndarray) -> int:
        return int(mapped_array.base.get_device_pointer())

    def stream(self, non_blocking: bool = False):
        """non_blocking: the stream does not wait for work on the legacy default stream (CU_STREAM_NON_BLOCKING)."""
        self.allocations += 1
        stream = self.cuda.Stream(flags=1 if non_blocking else 0)
        self._owned.append(stream)
        return stream

    def priority_lane(self) -> PriorityLane:
        """A stream at the device's highest priority (call inside `active()`); destroyed by close()."""
        lane = PriorityLane(libcuda())
        self.allocations += 1
        self._owned.append(lane)
        return lane

    def event(self, blocking: bool = False):
        """blocking: synchronize() sleeps until the event instead of spinning on a core (and the
        event cannot time stages)."""
        self.allocations += 1
        flags = self.cuda.event_flags
        event = self.cuda.Event(flags.BLOCKING_SYNC | flags.DISABLE_TIMING if blocking else 0)
        self._owned.append(event)
        return event

    def describe(self) -> dict:
        """What reports say of the device (no CUDA call)."""
        return {"kind": "gpu", "name": self.name, "compute_capability": self.compute_capability,
                "integrated": self.integrated, "total_memory_mib": self.facts.total_memory_mib}

    def free_memory(self) -> int:
        free, _total = self.cuda.mem_get_info()
        return int(free)

    def close(self) -> None:
        """Free everything this object allocated, then release the primary context."""
        if self.context is None:
            return
        with self.active():
            for item in reversed(self._owned):
                if hasattr(item, "free"):
                    item.free()
                elif hasattr(item, "base") and hasattr(item.base, "free"):
                    item.base.free()
                elif isinstance(item, _Registered):
                    item.unregister()
            self._owned.clear()
        self.context.detach()
        self.context = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class PriorityLane:
    """A stream at the GPU's highest priority for one runtime's inference (Triton's model priority, PRIORITY_MAX):
    while another model's kernels fill the GPU, each SM that frees up takes this stream's blocks first.

    PyCUDA's streams take no priority, so this one is made through the driver API, and its work is ordered with
    the runtime's own stream by two events: it starts after everything queued there before it, and what is
    queued there after it waits for it. A CUDA graph launched here runs at the stream's priority (graphs are
    instantiated without per-node priorities). One thread submits to a lane: the events are reused, a wait
    taking the event as its last record left it."""

    def __init__(self, driver):
        self._driver = driver
        least, greatest = ctypes.c_int(), ctypes.c_int()
        check_status(driver.cuCtxGetStreamPriorityRange(ctypes.byref(least), ctypes.byref(greatest)),
                     "cuCtxGetStreamPriorityRange")
        self.priority = greatest.value  # the highest is the lowest number (0 is the default)
        self._stream, self._started, self._ended = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        try:
            # non-blocking: ordered by its events only, never behind work on the legacy default stream
            check_status(driver.cuStreamCreateWithPriority(ctypes.byref(self._stream), _CU_STREAM_NON_BLOCKING,
                                                           ctypes.c_int(self.priority)), "cuStreamCreateWithPriority")
            for event in (self._started, self._ended):
                check_status(driver.cuEventCreate(ctypes.byref(event), _CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        except JetpipeError:
            self.free()  # not owned by the device yet: what was made is released here
            raise

    @property
    def handle(self) -> int:
        return self._stream.value

    def stream_priority(self) -> int:
        """The priority the driver gives the stream (what the tests check)."""
        value = ctypes.c_int()
        check_status(self._driver.cuStreamGetPriority(self._stream, ctypes.byref(value)), "cuStreamGetPriority")
        return value.value

    def run_after(self, stream, work) -> None:
        """`work(self)` enqueued on this lane after everything queued on `stream` (a PyCUDA stream), and
        `stream`'s later work after it."""
        d, other = self._driver, ctypes.c_void_p(stream.handle)
        check_status(d.cuEventRecord(self._started, other), "cuEventRecord")
        check_status(d.cuStreamWaitEvent(self._stream, self._started, 0), "cuStreamWaitEvent")
        work(self)
        check_status(d.cuEventRecord(self._ended, self._stream), "cuEventRecord")
        check_status(d.cuStreamWaitEvent(other, self._ended, 0), "cuStreamWaitEvent")

    def synchronize(self) -> None:
        check_status(self._driver.cuStreamSynchronize(self._stream), "cuStreamSynchronize")

    def free(self) -> None:
        """Destroy the stream and its events (the device's close(), with the context current)."""
        for event in (self._started, self._ended):
            if event:
                self._driver.cuEventDestroy_v2(event)
        if self._stream:
            self._driver.cuStreamDestroy_v2(self._stream)
        self._stream, self._started, self._ended = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()


def check_status(status: int, what: str) -> None:
    """A CUDA driver API call's result: anything but CUDA_SUCCESS raises, naming the call."""
    if status != 0:
        raise JetpipeError(f"{what} failed with CUDA error {status}")


class _Registered:
    """Host memory page-locked by register_host: unpinned at close (the array keeps the memory alive)."""

    def __init__(self, driver, address: int, array: np.ndarray):
        self.driver, self.address, self.array = driver, address, array

    def unregister(self) -> None:
        self.driver.cuMemHostUnregister(ctypes.c_void_p(self.address))


@functools.cache
def libcuda():
    """The CUDA driver library, loaded once: the calls PyCUDA does not bind (graphs, priorities, IPC handles)."""
    return ctypes.CDLL("libcuda.so.1")
