"""`jetpipe export triton`: a bundle as a Triton Inference Server model: REPO/NAME/config.pbtxt and
REPO/NAME/1/model.onnx (or model.plan).

config.pbtxt comes from the manifest: `max_batch_size` (the batch axis stays implicit in the dims), each
input and output with its data type and dims (a dynamic size, like a recognizer's width, is -1),
`dynamic_batching` (preferred batch: the bundle's max; a queue delay), an `instance_group` (GPU by default;
`--gpus 0,1`: `--instances` on each of those GPUs, where Triton would otherwise put them on every GPU it has)
and, as `parameters` a client reads back, the task, labels, input size and preprocessing jetpipe applies
before the network. The file parses into Triton's own ModelConfig protobuf (the tests check it with
tritonclient's model_config_pb2).

`--platform tensorrt` ships the bundle's engine as model.plan only where it can run there: the server's
TensorRT version and its GPU's compute capability must be given and match what the engine was built with
(an engine runs only on the TensorRT and GPU it was built for); otherwise the export is refused with why.
REPO/NAME is written like a bundle: staged and swapped in, never over a folder jetpipe did not write
(`--force` replaces an earlier export), the repository's other models untouched.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_encoding

from jetpipe import bundle as bundles
from jetpipe import output_folders
from jetpipe.errors import JetpipeError
from jetpipe.limits import MAX_GPUS

PLATFORMS = {"onnxruntime": ("onnxruntime_onnx", "model.onnx"), "tensorrt": ("tensorrt_plan", "model.plan")}
INSTANCE_KINDS = {"gpu": "KIND_GPU", "cpu": "KIND_CPU"}
RECORD = "jetpipe-export.json"  # beside config.pbtxt: what wrote the model folder (and from which bundle)
VERSION = "1"
NAME = re.compile(r"[A-Za-z0-9_.-]+")
MAX_QUEUE_DELAY_US = 10_000_000
MAX_INSTANCES = 64
# numpy dtype names (as the manifest has them) -> Triton's data types
DATA_TYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "float64": "TYPE_FP64", "int8": "TYPE_INT8",
              "uint8": "TYPE_UINT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32", "int64": "TYPE_INT64",
              "bool": "TYPE_BOOL"}


@dataclass
class TritonExport:
    bundle: Path
    repository: Path
    name: str | None = None              # default: the bundle folder's name
    platform: str = "onnxruntime"        # onnxruntime | tensorrt
    instance_kind: str = "gpu"           # gpu | cpu
    instances: int = 1                   # per GPU where gpus are listed
    gpus: list[int] | None = None        # the GPUs the instances go on (None: every GPU the server has)
    max_queue_delay_us: int = 500        # how long Triton may hold a request to fill a batch
    server_tensorrt: str | None = None   # tensorrt: the server's TensorRT version, e.g. 10.3.0
    server_compute_capability: str | None = None  # tensorrt: the server GPU's, e.g. 9.0
    force: bool = False


def export(opts: TritonExport) -> Path:
    """Write REPO/NAME; returns that folder."""
    _check_options(opts)
    manifest = bundles.load(opts.bundle)
    name = opts.name or Path(opts.bundle).resolve().name
    if not NAME.fullmatch(name) or set(name) == {"."}:  # "." and "..": the repository itself, its parent
        raise JetpipeError(f"--name {name!r}: a Triton model name is letters, digits, '_', '.' and '-', not only dots")
    platform, model_file = PLATFORMS[opts.platform]
    source = Path(opts.bundle) / (bundles.MODEL_FILE if opts.platform == "onnxruntime" else bundles.ENGINE_FILE)
    if opts.platform == "tensorrt":
        _check_engine(manifest, opts)
    folder = Path(opts.repository) / name
    output_folders.check_destination(folder, opts.force, "-o", "Triton model folder", _owned,
                              protected=(Path(opts.bundle),))
    with output_folders.staging(folder) as tmp:
        (tmp / VERSION).mkdir()
        shutil.copyfile(source, tmp / VERSION / model_file)
        (tmp / "config.pbtxt").write_text(config_text(manifest, name, platform, opts))
        (tmp / RECORD).write_text(json.dumps({"bundle": str(Path(opts.bundle).resolve()),
                                              "bundle_created": manifest.get("created"),
                                              "platform": platform, "file": f"{VERSION}/{model_file}"}, indent=2))
    return folder


def _check_options(opts: TritonExport) -> None:
    if opts.platform not in PLATFORMS:
        raise JetpipeError(f"--platform {opts.platform!r}: choose one of {', '.join(PLATFORMS)}")
    if opts.instance_kind not in INSTANCE_KINDS:
        raise JetpipeError(f"--instance-kind {opts.instance_kind!r}: choose one of {', '.join(INSTANCE_KINDS)}")
    if not 1 <= opts.instances <= MAX_INSTANCES:
        raise JetpipeError(f"--instances {opts.instances}: from 1 to {MAX_INSTANCES}")
    if opts.gpus is not None:
        if opts.instance_kind != "gpu":
            raise JetpipeError("--gpus places GPU instances: drop it, or use --instance-kind gpu")
        if not opts.gpus or len(set(opts.gpus)) != len(opts.gpus) or not all(0 <= g < MAX_GPUS for g in opts.gpus):
            raise JetpipeError(f"--gpus {','.join(map(str, opts.gpus))}: GPU numbers from 0 to {MAX_GPUS - 1}, each "
                               "once (e.g. 0,1), or all")
    if not 0 <= opts.max_queue_delay_us <= MAX_QUEUE_DELAY_US:
        raise JetpipeError(f"--max-queue-delay-us {opts.max_queue_delay_us}: from 0 to {MAX_QUEUE_DELAY_US}")


def _check_engine(manifest: dict, opts: TritonExport) -> None:
    """A plan runs only on the TensorRT and the GPU it was built for: both must be given and match."""
    engine = manifest.get("engine") or {}
    if not engine.get("built"):
        raise JetpipeError(f"--platform tensorrt: {opts.bundle} has no engine ({engine.get('reason', 'not built')}): "
                           "export with --platform onnxruntime, or convert on a machine with TensorRT")
    if engine.get("family") != "tensorrt":
        raise JetpipeError(f"--platform tensorrt: the bundle's engine is {engine.get('family')}'s, which Triton's "
                           "TensorRT backend does not load: export with --platform onnxruntime")
    built = {"TensorRT": engine.get("tensorrt"), "compute capability": engine.get("compute_capability")}
    given = {"TensorRT": opts.server_tensorrt, "compute capability": opts.server_compute_capability}
    missing = [k for k, v in given.items() if not v]
    if missing:
        raise JetpipeError(f"--platform tensorrt: give the server's {' and '.join(missing)} (--server-tensorrt, "
                           f"--server-compute-capability): the engine was built for TensorRT {built['TensorRT']} on "
                           f"compute capability {built['compute capability']} and runs nowhere else")
    for what in built:
        if str(given[what]) != str(built[what]):
            raise JetpipeError(f"--platform tensorrt: the server has {what} {given[what]}, the engine was built for "
                               f"{built[what]}: convert on a machine like the server, or export with --platform "
                               "onnxruntime")


def _owned(folder: Path) -> set[str] | None:
    """What an export wrote into a model folder (None: it is not one of ours)."""
    if not (folder / RECORD).is_file():
        return None
    return {RECORD, "config.pbtxt", VERSION}


def _dims(shape: list) -> list[int]:
    """A manifest shape without its batch axis; names and "?" (dynamic) are -1."""
    return [d if isinstance(d, int) and d > 0 else -1 for d in shape[1:]]


def _tensor(io: dict) -> str:
    data_type = DATA_TYPES.get(io["dtype"])
    if data_type is None:
        raise JetpipeError(f"tensor {io['name']} is {io['dtype']}, which Triton has no type for")
    return (f"  {{\n    name: {_quoted(io['name'])}\n    data_type: {data_type}\n"
            f'    dims: [ {", ".join(str(d) for d in _dims(io["shape"]))} ]\n  }}')


def _quoted(text: str) -> str:
    """A protobuf text-format string literal (its own escapes; UTF-8 kept: an alphabet stays readable)."""
    return '"' + text_encoding.CEscape(text, as_utf8=True) + '"'


def _parameter(key: str, value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return f"parameters {{\n  key: {_quoted(key)}\n  value: {{ string_value: {_quoted(text)} }}\n}}"


def config_text(manifest: dict, name: str, platform: str, opts: TritonExport) -> str:
    """config.pbtxt (protobuf text format of Triton's ModelConfig) from a bundle's manifest."""
    io, batch = manifest["io"], manifest["batch"]["max"]
    lines = [f"name: {_quoted(name)}", f"platform: {_quoted(platform)}", f"max_batch_size: {batch}",
             "input [\n" + ",\n".join(_tensor(t) for t in io["inputs"]) + "\n]",
             "output [\n" + ",\n".join(_tensor(t) for t in io["outputs"]) + "\n]",
             f"dynamic_batching {{\n  preferred_batch_size: [ {batch} ]\n"
             f"  max_queue_delay_microseconds: {opts.max_queue_delay_us}\n}}",
             f"instance_group [\n  {{\n    count: {opts.instances}\n    kind: {INSTANCE_KINDS[opts.instance_kind]}\n"
             + (f"    gpus: [ {', '.join(map(str, opts.gpus))} ]\n" if opts.gpus is not None else "") + "  }\n]"]
    parameters = {"jetpipe_task": manifest.get("task") or "raw", "jetpipe_input_size": manifest["input_size"],
                  "jetpipe_preprocess": manifest["preprocess"], "jetpipe_precision": manifest["precision"]}
    if manifest.get("labels"):
        parameters["jetpipe_labels"] = manifest["labels"]
    if manifest.get("input_width_range"):
        parameters["jetpipe_input_width_range"] = manifest["input_width_range"]
    lines += [_parameter(k, v) for k, v in parameters.items()]
    return "\n".join(lines) + "\n"
