"""CUDA graphs through the driver API (ctypes): PyCUDA 2026.1 has no graph binding.

Capture a stream's work once, replay it per batch: one launch instead of many.
A graph fixes addresses and shapes, so callers capture one per batch size and
buffer set and refill the same buffers.
"""

from __future__ import annotations

import ctypes

from jetpipe.errors import JetpipeError
from jetpipe.runtime.cuda import check_status, libcuda

CAPTURE_MODE_THREAD_LOCAL = 1


def _symbol(*names):
    lib = libcuda()
    for name in names:
        if hasattr(lib, name):
            return getattr(lib, name)
    raise JetpipeError(f"the CUDA driver has none of {', '.join(names)}: update the driver")


class CudaGraph:
    """`with CudaGraph.capture(stream) as g: <enqueue work>` then `g.launch(stream)`."""

    def __init__(self):
        self._graph = ctypes.c_void_p()
        self._exec = ctypes.c_void_p()

    @classmethod
    def capture(cls, stream):
        return _Capture(cls(), stream)

    def launch(self, stream) -> None:
        check_status(_symbol("cuGraphLaunch")(self._exec, ctypes.c_void_p(stream.handle)), "cuGraphLaunch")

    def close(self) -> None:
        if self._exec:
            _symbol("cuGraphExecDestroy")(self._exec)
            self._exec = ctypes.c_void_p()
        if self._graph:
            _symbol("cuGraphDestroy")(self._graph)
            self._graph = ctypes.c_void_p()


class _Capture:
    def __init__(self, graph: CudaGraph, stream):
        self.graph, self.stream = graph, ctypes.c_void_p(stream.handle)

    def __enter__(self) -> CudaGraph:
        begin = _symbol("cuStreamBeginCapture_v2", "cuStreamBeginCapture")
        check_status(begin(self.stream, ctypes.c_int(CAPTURE_MODE_THREAD_LOCAL)), "cuStreamBeginCapture")
        return self.graph

    def __exit__(self, exc_type, exc, tb) -> None:
        end = _symbol("cuStreamEndCapture")
        result = end(self.stream, ctypes.byref(self.graph._graph))
        if exc_type is not None:
            self.graph.close()
            return
        check_status(result, "cuStreamEndCapture")
        instantiate = _symbol("cuGraphInstantiateWithFlags")
        check_status(instantiate(ctypes.byref(self.graph._exec), self.graph._graph, ctypes.c_ulonglong(0)),
                     "cuGraphInstantiateWithFlags")
