"""A real Triton server (nvidia-pytriton's tritonserver + Python backend) hosting a bundle's ONNX model
through ONNX Runtime: what tests of the `triton://` backend talk to. Run with the Triton venv's Python:

    .venv-triton/bin/python tests/triton_server.py BUNDLE NAME GRPC_PORT HTTP_PORT METRICS_PORT

Prints "ready" once the model is served; serves until killed.
"""

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


def main() -> None:
    bundle, name, grpc_port, http_port, metrics_port = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    manifest = json.loads((Path(bundle) / "manifest.json").read_text())
    session = ort.InferenceSession(str(Path(bundle) / "model.onnx"), providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    output_names = [o.name for o in session.get_outputs()]

    @batch
    def infer(**inputs):
        return dict(zip(output_names, session.run(None, {input_name: inputs[input_name]})))

    sample = tuple(session.get_inputs()[0].shape[1:])
    config = TritonConfig(grpc_port=grpc_port, http_port=http_port, metrics_port=metrics_port)
    with Triton(config=config) as triton:
        triton.bind(model_name=name, infer_func=infer,
                    inputs=[Tensor(name=input_name, dtype=np.float32,
                                   shape=tuple(d if isinstance(d, int) else -1 for d in sample))],
                    outputs=[Tensor(name=n, dtype=np.float32, shape=(-1,) * (len(o.shape) - 1))
                             for n, o in zip(output_names, session.get_outputs())],
                    config=ModelConfig(max_batch_size=manifest["batch"]["max"]))
        print("ready", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
