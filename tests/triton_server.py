"""A real Triton server (nvidia-pytriton's tritonserver + Python backend) hosting a bundle's ONNX model
through ONNX Runtime: what the tests and scripts/bench_triton.py run the `triton://` backend against.

`TritonServer` (imported in the project's venv) starts this file as a script in the Triton venv, which
prints "ready" once the model is served and serves until killed:

    .venv-triton/bin/python tests/triton_server.py BUNDLE NAME GRPC_PORT HTTP_PORT METRICS_PORT ...

Two ways to host the model: through pytriton (its Triton() binds a Python function; each request goes from
tritonserver's Python backend stub on to pytriton's own process and back), or `python-backend`: pytriton's
tritonserver binary started here on the model repository `jetpipe export triton` writes, its config.pbtxt
pointed at Triton's Python backend (`backend: "python"` for `platform: "onnxruntime_onnx"`, the one line
changed) and a model.py beside the exported model.onnx that runs it with ONNX Runtime inside the backend's
stub, as a user of Triton's Python backend writes it (one hop fewer; still not Triton's own C++ ONNX Runtime
backend, which pytriton does not ship). With `gpu`, the Python backend's instances are GPU instances that take
a batch in CUDA shared memory as a GPU tensor and bind it to ONNX Runtime's CUDA provider where it is.
"""

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).parents[1]
TRITON_PYTHON = Path(os.environ.get("JETPIPE_TRITON_PYTHON", ROOT / ".venv-triton" / "bin" / "python"))
START_S = 180  # a loaded 2-core machine starts tritonserver in seconds; this only bounds a broken start
STOP_S = 60    # its graceful stop takes a second or two; this only bounds a hung one
HOSTS = ("pytriton", "python-backend")
CUDA_POOL_BYTES = 1 << 30


def gpu_here() -> bool:
    """Whether this machine has an NVIDIA GPU (its device nodes): the Python backend's GPU instances need one."""
    return any(Path("/dev").glob("nvidia[0-9]*"))


@functools.cache
def gpu_model(python: Path) -> bool:
    """Whether the server's model runs on the GPU: a GPU here and CUDA in the server venv's ONNX Runtime. The
    GPU instances (inputs left on the GPU: FORCE_CPU_ONLY_INPUT_TENSORS "no") and the model's provider are
    decided from this one check: where they were decided apart (a GPU, but an ONNX Runtime without CUDA in the
    venv) the model was handed GPU tensors it could not read ("Tensor is stored in GPU")."""
    if not gpu_here():
        return False
    probe = subprocess.run([str(python), "-c", "import onnxruntime as o; "
                            "print('CUDAExecutionProvider' in o.get_available_providers())"],
                           capture_output=True, text=True, timeout=120)
    return probe.stdout.strip() == "True"


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class TritonServer:
    """This file run in the Triton venv on free ports; start() waits until it serves, stop() kills it."""

    def __init__(self, bundle: Path, name: str, log: Path, python: Path = TRITON_PYTHON, restrict_shm: bool = False,
                 gpu: bool = False, instances: int = 1, host: str = "pytriton"):
        """restrict_shm: shared-memory registration needs an access-token header (`--grpc-restricted-protocol`,
        pytriton's default); otherwise open, as a plain tritonserver. gpu: the model runs on ONNX Runtime's
        CUDA provider where the Triton venv has it (else on the CPU: bit-equal to the local onnxruntime-cpu).
        host: "pytriton" or "python-backend" (the module's doc)."""
        if host not in HOSTS:
            raise ValueError(f"host is one of {HOSTS}, not {host!r}")
        self.bundle, self.name, self.log, self.python = bundle, name, log, python
        self.restrict_shm, self.gpu, self.instances = restrict_shm, gpu, instances  # instances: of the model
        self.host = host
        self.ports = free_ports(3)
        self.process = None

    @property
    def uri(self) -> str:
        return f"triton://127.0.0.1:{self.ports[0]}/{self.name}"

    def start(self) -> None:
        seen = self.log.stat().st_size if self.log.exists() else 0  # a restart: only what it says now counts
        out = self.log.open("a")
        repository = self.log.with_name(self.log.stem + "-repository")
        gpu = self.gpu and gpu_model(self.python)  # asked for where it cannot be: the model runs on the CPU
        if self.host == "python-backend":
            python_backend_repository(self.bundle, self.name, repository / "models", self.instances, gpu)
        self.process = subprocess.Popen([str(self.python), __file__, str(self.bundle), self.name,
                                         *map(str, self.ports), str(int(self.restrict_shm)), str(int(gpu)),
                                         str(self.instances), self.host, str(repository)],
                                        stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_S
        while "ready" not in self.log.read_text()[seen:].split() and not self._model_ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Triton server did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def _model_ready(self) -> bool:
        """The server's own word (HTTP /v2/models/NAME/ready). The script's "ready" line is missing from its log
        at times: a CI run waited out START_S on a server whose model was loaded and served at once."""
        url = f"http://127.0.0.1:{self.ports[1]}/v2/models/{self.name}/ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return answer.status == 200
        except OSError:  # not listening yet, or 400 while the model loads
            return False

    def stop(self) -> None:
        """Ctrl-C to the server's process group, as a user stops it: pytriton and tritonserver shut down and
        unlink their shared-memory regions in /dev/shm. Killed outright, each start left one behind (~40 MB of
        RAM for good: a day of test runs filled the 24 GB /dev/shm, and the suite was OOM-killed). Killed
        only if it has not ended within STOP_S."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGINT)  # the server and the tritonserver it started
        try:
            self.process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(60)


MODEL_PY = '''"""The exported model.onnx through ONNX Runtime in Triton's Python backend (tests/triton_server.py).

On the GPU (JETPIPE_TRITON_GPU=1 and ONNX Runtime's CUDA provider there) the model reads its input where Triton
hands it: with FORCE_CPU_ONLY_INPUT_TENSORS "no" in config.pbtxt, a batch a client put in CUDA shared memory
arrives as a GPU tensor (opened by CUDA IPC in this stub) and is bound to the session by its device address
(IOBinding), so the batch never visits the host (its outputs, a third of its size, do); a batch in system
shared memory is read as a host array.
"""
import ctypes
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):  # the head of DLPack's DLManagedTensor
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def dlpack_address(capsule) -> tuple[int, list[int]]:
    """A DLPack capsule's data address and shape (the capsule keeps the memory; the caller keeps the capsule)."""
    tensor = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    return tensor.data + tensor.byte_offset, [tensor.shape[i] for i in range(tensor.ndim)]


class TritonPythonModel:
    def initialize(self, args):
        model = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        self.device = int(args.get("model_instance_device_id") or 0)
        cuda = os.environ.get("JETPIPE_TRITON_GPU") == "1" and \\
            "CUDAExecutionProvider" in ort.get_available_providers()
        providers = ([("CUDAExecutionProvider", {"device_id": self.device})] if cuda else []) + \\
            ["CPUExecutionProvider"]
        self.session = ort.InferenceSession(str(model), providers=providers)
        self.cuda = cuda
        self.input = self.session.get_inputs()[0].name
        self.dtype = DTYPES.get(self.session.get_inputs()[0].type, np.float32)
        self.outputs = [o.name for o in self.session.get_outputs()]

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, self.input)
            if not self.cuda or tensor.is_cpu():
                results = self.session.run(None, {self.input: tensor.as_numpy()})
                tensors = [pb_utils.Tensor(n, r) for n, r in zip(self.outputs, results)]
            else:
                tensors = [pb_utils.Tensor(n, r) for n, r in zip(self.outputs, self._run_device(tensor))]
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses

    def _run_device(self, tensor):
        """The input bound where it is (its DLPack capsule keeps the memory open until the run is done); the
        outputs copied to the host by the run. Handed back as GPU tensors (DLPack) they were slower on an H100
        (685 against 738 frames/s; not looked into further)."""
        binding = self.session.io_binding()
        capsule = tensor.to_dlpack()
        address, shape = dlpack_address(capsule)
        binding.bind_input(self.input, "cuda", self.device, self.dtype, shape, address)
        for name in self.outputs:
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding)
        del capsule
        return binding.copy_outputs_to_cpu()
'''


def python_backend_repository(bundle: Path, name: str, repository: Path, instances: int, gpu: bool = False) -> None:
    """`jetpipe export triton` into `repository`, its platform swapped for Triton's Python backend, and MODEL_PY
    beside the model. CPU instances (the stubs; ONNX Runtime picks the device), or with `gpu` GPU instances that
    take their inputs where the client put them (FORCE_CPU_ONLY_INPUT_TENSORS "no": a batch in CUDA shared
    memory stays on the GPU). Runs in the project's venv (jetpipe); replaces the export of an earlier start."""
    from jetpipe.export.triton import PLATFORMS, TritonExport, export

    folder = export(TritonExport(bundle, repository, name, instance_kind="gpu" if gpu else "cpu",
                                 instances=instances, force=True))
    config = folder / "config.pbtxt"
    platform = f'platform: "{PLATFORMS["onnxruntime"][0]}"'
    assert platform in config.read_text(), config.read_text()
    text = config.read_text().replace(platform, 'backend: "python"')
    if gpu:
        text += 'parameters {\n  key: "FORCE_CPU_ONLY_INPUT_TENSORS"\n  value: { string_value: "no" }\n}\n'
    config.write_text(text)
    (folder / "1" / "model.py").write_text(MODEL_PY)


def serve_python_backend(name: str, ports: list[int], gpu: bool, folder: Path) -> None:
    """pytriton's tritonserver on folder/models (python_backend_repository's), its Python backend set up in
    folder/backends."""
    import pytriton

    package = Path(pytriton.__file__).parent
    backend = folder / "backends" / "python"
    shutil.rmtree(backend.parent, ignore_errors=True)  # this server's own, made again at each start
    backend.mkdir(parents=True)
    for part in ("libtriton_python.so", "triton_python_backend_utils.py"):
        (backend / part).symlink_to(package / "tritonserver" / "backends" / "python" / part)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"  # the stub embeds this Python
    (backend / "triton_python_backend_stub").symlink_to(package / "tritonserver" / "python_backend_stubs" / version /
                                                         "triton_python_backend_stub")
    env = dict(os.environ, JETPIPE_TRITON_GPU=str(int(gpu)))
    libs = package.parent / "nvidia_pytriton.libs"
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, [env.get("LD_LIBRARY_PATH"), str(libs)]))
    # the stub's embedded Python finds its prefix by looking for python3 on PATH: this venv's, with its packages
    # (as pytriton starts it)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    server = subprocess.Popen([str(package / "tritonserver" / "bin" / "tritonserver"),
                               f"--model-repository={folder / 'models'}", f"--backend-directory={backend.parent}",
                               f"--grpc-port={ports[0]}", f"--http-port={ports[1]}", f"--metrics-port={ports[2]}",
                               # GPU tensors between the server and the stubs go through this pool where a
                               # client's CUDA region cannot be handed on; 64 MB (the default) is below a batch
                               *([f"--cuda-memory-pool-byte-size=0:{CUDA_POOL_BYTES}"] if gpu else [])],
                              env=env)
    try:
        _wait_until_served(server, name, ports[0])
        print("ready", flush=True)
        server.wait()
    except KeyboardInterrupt:  # Ctrl-C reached tritonserver too (the process group), at any point after its start:
        server.wait()          # its shutdown unlinks its shared memory, and the caller's stop() waits for this process


def _wait_until_served(server: subprocess.Popen, name: str, grpc_port: int) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    deadline = time.monotonic() + START_S
    while server.poll() is None and time.monotonic() < deadline:
        try:
            if client.is_model_ready(name):
                return
        except Exception:  # not listening yet
            pass
        time.sleep(0.2)
    server.kill()
    raise SystemExit(f"tritonserver did not serve {name}")


def main() -> None:
    if sys.argv[9] == "python-backend":
        serve_python_backend(sys.argv[2], [int(p) for p in sys.argv[3:6]], sys.argv[7] == "1", Path(sys.argv[10]))
        return
    import numpy as np  # the Triton venv's (numpy < 2)
    import onnxruntime as ort
    from pytriton.decorators import batch
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    bundle, name, grpc_port, http_port, metrics_port = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    restricted = ["shared-memory"] if sys.argv[6] == "1" else []
    wanted = ("CUDAExecutionProvider", "CPUExecutionProvider") if sys.argv[7] == "1" else ("CPUExecutionProvider",)
    manifest = json.loads((Path(bundle) / "manifest.json").read_text())
    providers = [p for p in wanted if p in ort.get_available_providers()]
    sessions = [ort.InferenceSession(str(Path(bundle) / "model.onnx"), providers=providers)
                for _ in range(int(sys.argv[8]))]
    session = sessions[0]
    input_name = session.get_inputs()[0].name
    output_names = [o.name for o in session.get_outputs()]

    def instance(own):
        @batch
        def infer(**inputs):
            return dict(zip(output_names, own.run(None, {input_name: inputs[input_name]})))
        return infer

    sample = tuple(session.get_inputs()[0].shape[1:])
    config = TritonConfig(grpc_port=grpc_port, http_port=http_port, metrics_port=metrics_port)
    with Triton(config=config, security_config=TritonSecurityConfig(restricted_endpoints=restricted)) as triton:
        triton.bind(model_name=name, infer_func=[instance(s) for s in sessions],  # a list: one model instance each
                    inputs=[Tensor(name=input_name, dtype=np.float32,
                                   shape=tuple(d if isinstance(d, int) else -1 for d in sample))],
                    outputs=[Tensor(name=n, dtype=np.float32, shape=(-1,) * (len(o.shape) - 1))
                             for n, o in zip(output_names, session.get_outputs())],
                    config=ModelConfig(max_batch_size=manifest["batch"]["max"]))
        print("ready", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
