"""A real Triton server (nvidia-pytriton's tritonserver + Python backend) hosting a bundle's ONNX model
through ONNX Runtime: what the tests and scripts/bench_triton.py run the `triton://` backend against.

`TritonServer` (imported in the project's venv) starts this file as a script in the Triton venv, which
prints "ready" once the model is served and serves until killed:

    .venv-triton/bin/python tests/triton_server.py BUNDLE NAME GRPC_PORT HTTP_PORT METRICS_PORT
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]
TRITON_PYTHON = Path(os.environ.get("JETPIPE_TRITON_PYTHON", ROOT / ".venv-triton" / "bin" / "python"))
START_S = 180  # a loaded 2-core machine starts tritonserver in seconds; this only bounds a broken start


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
                 gpu: bool = False, instances: int = 1):
        """restrict_shm: shared-memory registration needs an access-token header (`--grpc-restricted-protocol`,
        pytriton's default); otherwise open, as a plain tritonserver. gpu: the model runs on ONNX Runtime's
        CUDA provider where the Triton venv has it (else on the CPU: bit-equal to the local onnxruntime-cpu)."""
        self.bundle, self.name, self.log, self.python = bundle, name, log, python
        self.restrict_shm, self.gpu, self.instances = restrict_shm, gpu, instances  # instances: of the model
        self.ports = free_ports(3)
        self.process = None

    @property
    def uri(self) -> str:
        return f"triton://127.0.0.1:{self.ports[0]}/{self.name}"

    def start(self) -> None:
        seen = self.log.stat().st_size if self.log.exists() else 0  # a restart: only what it says now counts
        out = self.log.open("a")
        self.process = subprocess.Popen([str(self.python), __file__, str(self.bundle), self.name,
                                         *map(str, self.ports), str(int(self.restrict_shm)), str(int(self.gpu)),
                                         str(self.instances)],
                                        stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_S
        while "ready" not in self.log.read_text()[seen:].split():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Triton server did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, 9)  # the server and the tritonserver it started
            self.process.wait(60)


def main() -> None:
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
