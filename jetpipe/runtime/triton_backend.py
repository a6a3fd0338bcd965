"""A Triton Inference Server as a runtime's backend: `--backend triton://HOST:PORT/NAME`.

Frames are preprocessed here as with the local backends (the CPU path); each batch's input goes to the
server's model NAME over gRPC (tritonclient) and its outputs come back into the runtime's preallocated
output buffers, then the same postprocessing. The model is what `jetpipe export triton BUNDLE` writes, so
its tensors are the bundle's (checked at start-up against the manifest, with each output's sample shape
from one blank batch-1 request per input width: no local copy of the model runs).

A server down or a model missing at start-up is one line (exit 2). Lost while serving: the batch fails (the
daemon counts its frames failed and goes on), later batches fail at once without a request until a backoff
(0.5 s doubling to 10 s) has passed, then the next batch tries again; the first that succeeds logs the
reconnection. Requests are asynchronous: run() sends a batch and returns, finish() waits for its answer,
so with the daemon's buffer sets several batches are in flight and the round trip overlaps the capture and
preprocessing of the next ones.

Transport (`?shm=auto|cuda|system|off`, chosen at start-up and logged), with a server on this host (a
loopback address; auto):
  - CUDA shared memory (the GPU runtime): each buffer set's device input and outputs are registered with the
    server by their CUDA IPC handles; the server reads the preprocessed batch and writes its outputs in this
    GPU's memory, where the GPU postprocessing reads them. Nothing crosses the host.
  - system shared memory: each buffer set is one POSIX shared-memory region; the runtime's input and output
    buffers live in it (the GPU runtime copies its input there and page-locks it for the DMA), so a request
    carries only names and offsets.
Otherwise plain gRPC (the tensors in the messages). Under auto a server that refuses a kind (in a container
without the host's /dev/shm or GPU, or restricting the shared-memory API) is reached by the next one, said in
the log; `shm=cuda` or `shm=system` makes that an error. A server restarted while serving has forgotten the
regions: they are registered again before the first request after a failure.
"""

from __future__ import annotations

import base64
import ctypes
import functools
import logging
import mmap
import os
import threading
import time
from multiprocessing import shared_memory
from urllib.parse import parse_qs, urlsplit

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.runtime.api import TensorSpec
from jetpipe.runtime.base import at_width
from jetpipe.uri import is_loopback

log = logging.getLogger(__name__)

SCHEME = "triton://"
BACKOFF_S = (0.5, 10.0)  # first and longest wait before a lost server is asked again
TIMEOUT_S = 30.0         # one request's deadline: a hung server fails the batch instead of the pipeline
SHM_MODES = ("auto", "system", "cuda", "off")
PREPROCESS_PLACES = ("auto", "gpu", "cpu")  # where frames are preprocessed before they go to the server
ALIGN = mmap.PAGESIZE  # where each tensor starts in a set's region: no two share a page (each may be page-locked)
_DTYPES = {"FP32": np.float32, "FP16": np.float16, "INT64": np.int64, "INT32": np.int32, "UINT8": np.uint8,
           "BOOL": np.bool_}


def is_triton(backend: str) -> bool:
    return isinstance(backend, str) and backend.startswith(SCHEME)


def parse_uri(uri: str) -> tuple[str, str]:
    """triton://HOST:PORT/NAME[?QUERY] -> ("HOST:PORT", NAME); a malformed one is one line naming the form."""
    parts = urlsplit(uri)
    name = parts.path.strip("/")
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "triton" or not parts.hostname or port is None or not name or "/" in name:
        raise JetpipeError(f"backend {uri!r}: a Triton backend is triton://HOST:PORT/NAME (gRPC port, model name), "
                           "e.g. triton://127.0.0.1:8001/det")
    shm_mode(uri)
    return f"{parts.hostname}:{port}", name


def shm_mode(uri: str) -> str:
    """The URI's ?shm= (auto when absent)."""
    return _query(uri)["shm"]


def preprocess_place(uri: str) -> str:
    """The URI's ?preprocess=: auto (the GPU runtime's kernel where there is a GPU), gpu or cpu."""
    return _query(uri)["preprocess"]


def _query(uri: str) -> dict[str, str]:
    """?shm=auto|system|cuda|off&preprocess=auto|gpu|cpu; anything else is a mistake, said in one line."""
    query = {k: v[-1] for k, v in parse_qs(urlsplit(uri).query, keep_blank_values=True).items()}
    known = {"shm": SHM_MODES, "preprocess": PREPROCESS_PLACES}
    for key, value in query.items():
        if key not in known or value not in known[key]:
            raise JetpipeError(f"backend {uri!r}: the query takes shm={'|'.join(SHM_MODES)} (shared memory with a "
                               "server on this host: auto uses it on a loopback address) and preprocess="
                               f"{'|'.join(PREPROCESS_PLACES)}")
    return {key: query.get(key, values[0]) for key, values in known.items()}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


class TritonBackend:
    """The backend interface of backends.py, served by a Triton model (host buffers, like OrtCpuBackend)."""

    def __init__(self, uri: str, input_sample_shape, max_batch: int, widths=None, buffer_sets: int = 2,
                 device=None):
        """device: the GPU runtime's CudaDevice, whose device buffers may be shared with the server (CUDA
        shared memory: share())."""
        self.address, self.model = parse_uri(uri)
        self.name = f"triton ({self.address}/{self.model})"
        self.regions: list[shared_memory.SharedMemory] = []  # one per buffer set, with shared memory
        # CUDA shared memory: per buffer set, each tensor's (region name, IPC handle, bytes)
        self.cuda_regions: dict[int, dict[str, tuple[str, bytes, int]]] = {}
        self.device, self.buffer_sets = device, buffer_sets
        self._still_viewed: list[shared_memory.SharedMemory] = []  # closed while arrays viewed them
        try:
            import tritonclient.grpc as grpcclient
        except ImportError:
            raise JetpipeError("the Triton backend needs tritonclient: pip install 'tritonclient[grpc]'") from None
        self._grpc = grpcclient
        self.client = grpcclient.InferenceServerClient(self.address)
        self.widths = tuple(widths or (input_sample_shape[2],))
        self.max_batch = max_batch
        self._check_server()
        metadata = self.client.get_model_metadata(self.model, client_timeout=TIMEOUT_S)
        served_batch = self.client.get_model_config(self.model, client_timeout=TIMEOUT_S).config.max_batch_size
        if served_batch < max_batch:
            raise JetpipeError(f"Triton model {self.model!r} at {self.address} takes batches of up to {served_batch}, "
                               f"this runtime sends {max_batch}: lower --max-batch, or export the bundle again")
        (inp,) = metadata.inputs
        self.input = TensorSpec(inp.name, np.dtype(np.float32), tuple(input_sample_shape))
        self._output_types = {o.name: o.datatype for o in metadata.outputs}
        self.output_shapes, dtypes = self._probe_shapes()
        widest = self.widths[-1]
        self.outputs = [TensorSpec(name, dtypes[name], shape)
                        for name, shape in zip(self._output_types, self.output_shapes[widest])]
        self.views: dict[int, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
        # per buffer set: the request in flight (batch, width, answered event, [result, error])
        self.pending: dict[int, tuple[int, int, threading.Event, list]] = {}
        self.failures, self._retry_at, self._backoff, self._lost = 0, 0.0, BACKOFF_S[0], False
        self.mode = shm_mode(uri)
        cuda = device is not None and (self.mode == "cuda" or (self.mode == "auto" and is_loopback(self.address)))
        if self.mode == "cuda" and device is None:
            raise JetpipeError(f"backend {uri!r}: CUDA shared memory needs the GPU runtime (a GPU and PyCUDA here); "
                               "use ?shm=system")
        # CUDA shared memory is tried as the GPU runtime shares its first buffer set (share())
        self.transport = "CUDA shared memory" if cuda else self._choose_transport(self.mode, buffer_sets)
        self.name = f"triton ({self.address}/{self.model}, {self.transport})"

    def share(self, set_index: int, input_address: int, output_addresses: dict[str, int]) -> bool:
        """Register a buffer set's device input and outputs with the server as CUDA shared memory: the server
        reads the preprocessed batch and writes its outputs in this GPU's memory, no copy through the host.
        False: not used (another transport, or the server refused it under auto: system shared memory
        then, said in the log)."""
        if self.transport != "CUDA shared memory":
            return False
        tag = f"jetpipe-{os.getpid()}-{id(self):x}-{set_index}"
        regions = {self.input.name: (f"{tag}-in", self.device.ipc_handle(input_address),
                                     self.max_batch * self.input.nbytes(1))}
        for spec in self.outputs:
            regions[spec.name] = (f"{tag}-{len(regions)}", self.device.ipc_handle(output_addresses[spec.name]),
                                  self.max_batch * spec.nbytes(1))
        self.cuda_regions[set_index] = regions
        try:
            self._register_cuda(regions)
        except Exception as exc:
            del self.cuda_regions[set_index]
            self._drop_regions()
            if self.mode == "cuda":
                raise JetpipeError(f"Triton server {self.address}: CUDA shared memory failed ({_first_line(exc)}): "
                                   "the server must run on this machine's GPU; or use ?shm=system") from None
            log.warning("Triton server %s: CUDA shared memory failed (%s)", self.address, _first_line(exc))
            self.transport = self._choose_transport("auto", self.buffer_sets)
            self.name = f"triton ({self.address}/{self.model}, {self.transport})"
            return False
        if set_index == 0:
            log.info("Triton server %s: CUDA shared memory on device %d", self.address, self.device.ordinal)
        return True

    def _register_cuda(self, regions: dict[str, tuple[str, bytes, int]]) -> None:
        for name, handle, nbytes in regions.values():
            self._unregister(self.client.unregister_cuda_shared_memory, name, TIMEOUT_S)
            self.client.register_cuda_shared_memory(name, base64.b64encode(handle), self.device.ordinal, nbytes,
                                                    client_timeout=TIMEOUT_S)

    # --- shared memory ---------------------------------------------------------------------------
    def _layout(self) -> tuple[int, dict[str, int]]:
        """Bytes of a set's region, and where each output starts in it (the input at 0)."""
        def size(spec: TensorSpec) -> int:
            raw = self.max_batch * int(np.prod(spec.sample_shape)) * np.dtype(spec.dtype).itemsize
            return -(-raw // ALIGN) * ALIGN

        offsets, end = {}, size(self.input)
        for spec in self.outputs:
            offsets[spec.name], end = end, end + size(spec)
        return end, offsets

    def _choose_transport(self, mode: str, buffer_sets: int) -> str:
        if mode == "off" or (mode == "auto" and not is_loopback(self.address)):
            why = "shm=off" if mode == "off" else "the server is not on a loopback address"
            log.info("Triton server %s: plain gRPC (%s)", self.address, why)
            return "gRPC"
        size, self.offsets = self._layout()
        tag = f"jetpipe-{os.getpid()}-{id(self):x}"
        try:
            for index in range(buffer_sets):
                self.regions.append(shared_memory.SharedMemory(f"{tag}-{index}", create=True, size=size))
            self._register()
        except Exception as exc:  # /dev/shm full or absent; a server that cannot open the regions
            self._drop_regions()
            if mode == "system":
                raise JetpipeError(f"Triton server {self.address}: shared memory failed ({_first_line(exc)}): run the "
                                   "server on this host with access to its /dev/shm, or use ?shm=off") from None
            log.warning("Triton server %s: shared memory failed (%s): plain gRPC", self.address, _first_line(exc))
            return "gRPC"
        log.info("Triton server %s: system shared memory, %d region(s) of %.1f MB", self.address, buffer_sets,
                 size / 1e6)
        return "shared memory"

    def _register(self) -> None:
        """(Again) tell the server about every region: a restarted server has forgotten them."""
        for regions in self.cuda_regions.values():
            self._register_cuda(regions)
        for region in self.regions:
            self._unregister(self.client.unregister_system_shared_memory, region.name, TIMEOUT_S)
            self.client.register_system_shared_memory(region.name, "/" + region.name, region.size,
                                                      client_timeout=TIMEOUT_S)

    @staticmethod
    def _unregister(unregister, name: str, timeout: float) -> None:
        """Unregister a region the server may not hold (a new or restarted server, or one already gone)."""
        try:
            unregister(name, client_timeout=timeout)
        except Exception as exc:
            log.debug("unregistering %s: %s", name, exc)

    def _drop_regions(self) -> None:
        for regions in self.cuda_regions.values():
            for name, _, _ in regions.values():
                self._unregister(self.client.unregister_cuda_shared_memory, name, 5.0)
        self.cuda_regions = {}
        for region in self.regions:
            self._unregister(self.client.unregister_system_shared_memory, region.name, 5.0)
            region.unlink()
            try:
                region.close()
            except BufferError:  # arrays still view it (a caller kept a result): unmapped when they go
                self._still_viewed.append(region)
        self.regions = []

    def buffers(self, set_index: int):
        """The set's input and output arrays inside its region (the runtime uses them as its own buffers), or
        None with plain gRPC (the runtime allocates its own)."""
        if not self.regions:
            return None
        memory = self.regions[set_index].buf

        def array(spec: TensorSpec, offset: int) -> np.ndarray:
            count = self.max_batch * int(np.prod(spec.sample_shape))
            return np.ndarray((count,), spec.dtype, buffer=memory, offset=offset)

        return array(self.input, 0), {o.name: array(o, self.offsets[o.name]) for o in self.outputs}

    def _check_server(self) -> None:
        where = f"Triton server {self.address}"
        try:
            live = self.client.is_server_live(client_timeout=TIMEOUT_S)
            ready = live and self.client.is_model_ready(self.model, client_timeout=TIMEOUT_S)
        except Exception as exc:  # tritonclient's InferenceServerException: refused, unknown host, deadline
            raise JetpipeError(f"{where} does not answer ({_first_line(exc)}): start it, or check --backend") from None
        if not live:
            raise JetpipeError(f"{where} is not live: check the server's log")
        if not ready:
            raise JetpipeError(f"{where} has no ready model {self.model!r}: load it (jetpipe export triton BUNDLE -o "
                               f"REPO --name {self.model}, then tritonserver --model-repository REPO)")

    def _probe_shapes(self) -> tuple[dict[int, list[tuple]], dict[str, np.dtype]]:
        """Each output's sample shape at each width, from one blank batch-1 request."""
        shapes, dtypes = {}, {}
        for width in self.widths:
            blank = np.zeros((1, *self.input.sample_shape[:2], width), np.float32)
            try:
                result = self._infer(blank)
            except Exception as exc:
                raise JetpipeError(f"Triton model {self.model!r} at {self.address} fails on a blank "
                                   f"{list(blank.shape)} input ({_first_line(exc)}): is it this bundle's model?"
                                   ) from None
            found = [result.as_numpy(name) for name in self._output_types]
            for name, value in zip(self._output_types, found):
                if value is None or value.ndim == 0 or value.shape[0] != 1:
                    raise JetpipeError(f"Triton model {self.model!r}: output {name} is not batched on axis 0")
                dtypes[name] = value.dtype
            shapes[width] = [tuple(value.shape[1:]) for value in found]
        return shapes, dtypes

    def _infer(self, batch: np.ndarray, callback=None, region: int | None = None, width: int | None = None):
        """One request: answered here, or with `callback(result, error)` from the client's thread. region: the
        buffer set whose shared memory (system or CUDA) holds the input and takes the outputs; `batch` then
        gives the shape only."""
        request = self._grpc.InferInput(self.input.name, list(batch.shape), "FP32")
        wanted = [self._grpc.InferRequestedOutput(name) for name in self._output_types]
        if region is None:
            request.set_data_from_numpy(batch)
            return self._send(request, wanted, callback)
        nbytes = [len(batch) * int(np.prod(shape)) * np.dtype(spec.dtype).itemsize
                  for spec, shape in zip(self.outputs, self.output_shapes[width])]
        if region in self.cuda_regions:
            names = self.cuda_regions[region]
            request.set_shared_memory(names[self.input.name][0], batch.nbytes, offset=0)
            for output, spec, size in zip(wanted, self.outputs, nbytes):
                output.set_shared_memory(names[spec.name][0], size, offset=0)
        else:
            name = self.regions[region].name
            request.set_shared_memory(name, batch.nbytes, offset=0)
            for output, spec, size in zip(wanted, self.outputs, nbytes):
                output.set_shared_memory(name, size, offset=self.offsets[spec.name])
        return self._send(request, wanted, callback)

    def _send(self, request, wanted, callback):
        if callback is None:
            return self.client.infer(self.model, [request], outputs=wanted, client_timeout=TIMEOUT_S)
        return self.client.async_infer(self.model, [request], callback, outputs=wanted, client_timeout=TIMEOUT_S)

    def bind(self, set_index: int, input_address: int, output_addresses: dict[str, int]) -> None:
        """Host views of the runtime's buffers (addresses of numpy arrays it owns, sized for the widest)."""
        def view(address: int, dtype, sample_shape) -> np.ndarray:
            count = self.max_batch * int(np.prod(sample_shape))
            memory = (ctypes.c_byte * (count * np.dtype(dtype).itemsize)).from_address(address)
            return np.frombuffer(memory, dtype)

        self.views[set_index] = (view(input_address, self.input.dtype, self.input.sample_shape),
                                 {o.name: view(output_addresses[o.name], o.dtype, o.sample_shape)
                                  for o in self.outputs})

    def run(self, set_index: int, batch: int, stream=None, width: int | None = None) -> None:
        """Send the set's batch (its input is copied into the request: the buffer is free again at once);
        finish(set_index) waits for the answer."""
        width = width or self.widths[0]
        now = time.monotonic()
        if self._lost and now < self._retry_at:
            raise JetpipeError(f"Triton server {self.address} lost; asking again in {self._retry_at - now:.1f} s")
        shared = bool(self.regions or self.cuda_regions)
        sample = (*self.input.sample_shape[:2], width)
        if set_index in self.cuda_regions:  # the input is on the GPU: only its shape is needed here
            inputs = np.broadcast_to(np.float32(0), (batch, *sample))
        else:
            inputs = at_width(self.views[set_index][0], batch, sample)
        answer, answered = [None, None], threading.Event()
        try:
            if self._lost and shared:
                self._register()
            self._infer(inputs, callback=functools.partial(_answered, answer, answered),
                        region=set_index if shared else None, width=width)
        except Exception as exc:
            raise self._lose(exc) from None
        self.pending[set_index] = (batch, width, answered, answer)

    def finish(self, set_index: int) -> float:
        """Wait for the set's answer and copy its outputs into the set's buffers; returns the seconds waited.
        A failed request raises (the batch fails) and starts the backoff."""
        batch, width, answered, answer = self.pending.pop(set_index)
        started = time.perf_counter()
        if not answered.wait(TIMEOUT_S + 5.0):  # the client's own deadline should have answered first
            raise self._lose(TimeoutError(f"no answer in {TIMEOUT_S + 5.0:.0f} s"))
        result, error = answer
        if error is not None:
            raise self._lose(error)
        if not (self.regions or self.cuda_regions):  # with shared memory the server wrote them where they belong
            _, outputs = self.views[set_index]
            for spec, shape in zip(self.outputs, self.output_shapes[width]):
                np.copyto(at_width(outputs[spec.name], batch, shape), result.as_numpy(spec.name),
                          casting="same_kind")
        if self._lost:
            log.info("Triton server %s answers again after %d failed batch(es)", self.address, self.failures)
        self._lost, self._backoff = False, BACKOFF_S[0]
        return time.perf_counter() - started

    def _lose(self, exc: Exception) -> JetpipeError:
        """Count a failed request and start (or lengthen) the backoff; the error that fails the batch."""
        self.failures += 1
        self._retry_at = time.monotonic() + self._backoff
        wait, self._backoff, self._lost = self._backoff, min(self._backoff * 2, BACKOFF_S[1]), True
        return JetpipeError(f"Triton server {self.address}: {_first_line(exc)} (asking again in {wait:.1f} s)")

    def warm_batches(self) -> list[int]:
        return []

    def capture_graphs(self, stream) -> None:
        """No CUDA graphs: the server runs the model."""

    def close(self) -> None:
        for _, _, answered, _ in self.pending.values():  # requests still out: their answers are not wanted
            answered.wait(TIMEOUT_S)
        self.pending.clear()
        self.views.clear()
        self._drop_regions()
        try:
            self.client.close()
        except Exception as exc:  # closing a channel to a server already gone
            log.debug("closing the Triton client: %s", exc)


def _answered(answer: list, answered: threading.Event, result, error) -> None:
    """tritonclient's callback (its own thread): keep the answer, wake finish()."""
    answer[0], answer[1] = result, error
    answered.set()
