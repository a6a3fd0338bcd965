"""`jetpipe export triton`: the model folder, its config.pbtxt parsed by Triton's own ModelConfig protobuf
(tritonclient's model_config_pb2, in the Triton venv .ci/run makes: nvidia-pytriton pins numpy < 2), and the
refusals."""

import json
import subprocess
from pathlib import Path

import pytest

from jetpipe.cli import main
from tests.helpers import residual_cnn, save
from tests.triton_server import TRITON_PYTHON

PARSE = """
import json, sys
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2
config = text_format.Parse(open(sys.argv[1], encoding="utf-8").read(), model_config_pb2.ModelConfig())
print(json_format.MessageToJson(config))
"""


def _triton_parse(path: Path) -> dict:
    usable = TRITON_PYTHON.exists() and subprocess.run(
        [str(TRITON_PYTHON), "-c", "import tritonclient.grpc.model_config_pb2"], capture_output=True).returncode == 0
    if not usable:
        pytest.skip(f"no Triton client (tritonclient) at {TRITON_PYTHON}: .ci/run makes it with /usr/bin/python3 "
                    "-m venv .venv-triton && .venv-triton/bin/pip install nvidia-pytriton")
    done = subprocess.run([str(TRITON_PYTHON), "-c", PARSE, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("export")
    out = folder / "cnn"
    assert main(["convert", save(residual_cnn(), folder / "m.onnx"), "-o", str(out), "--max-batch", "4",
                 "--labels", str(_labels(folder)), "--quiet"]) == 0
    return out


def _labels(folder: Path) -> Path:
    path = folder / "labels.txt"
    path.write_text("cat\ndog\n\u732b\nbird\nfish\n", encoding="utf-8")  # one name in Chinese: kept as UTF-8
    return path


def test_the_config_is_triton_s_own_model_config(bundle, tmp_path, capsys):
    repo = tmp_path / "repo"
    (repo / "other").mkdir(parents=True)  # another model of the repository: left alone
    assert main(["export", "triton", str(bundle), "-o", str(repo), "--name", "cnn_fp32"]) == 0
    assert "wrote" in capsys.readouterr().out
    folder = repo / "cnn_fp32"
    assert sorted(p.name for p in repo.iterdir()) == ["cnn_fp32", "other"]
    assert (folder / "1" / "model.onnx").read_bytes() == (bundle / "model.onnx").read_bytes()
    config = _triton_parse(folder / "config.pbtxt")
    assert (config["name"], config["platform"], config["maxBatchSize"]) == ("cnn_fp32", "onnxruntime_onnx", 4)
    assert config["input"] == [{"name": "x", "dataType": "TYPE_FP32", "dims": ["3", "16", "16"]}]
    assert config["output"] == [{"name": "y", "dataType": "TYPE_FP32", "dims": ["5"]}]
    assert config["dynamicBatching"] == {"preferredBatchSize": [4], "maxQueueDelayMicroseconds": "500"}
    assert config["instanceGroup"] == [{"count": 1, "kind": "KIND_GPU"}]
    parameters = {k: v["stringValue"] for k, v in config["parameters"].items()}
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert parameters["jetpipe_task"] == manifest["task"]
    assert json.loads(parameters["jetpipe_labels"]) == ["cat", "dog", "\u732b", "bird", "fish"]
    assert json.loads(parameters["jetpipe_preprocess"]) == manifest["preprocess"]
    assert json.loads(parameters["jetpipe_input_size"]) == [16, 16]


def test_an_export_is_replaced_only_with_force_and_never_a_folder_it_did_not_write(bundle, tmp_path, capsys):
    repo = tmp_path / "repo"
    assert main(["export", "triton", str(bundle), "-o", str(repo), "--instance-kind", "cpu"]) == 0
    assert main(["export", "triton", str(bundle), "-o", str(repo)]) == 2
    assert "already exists: pass --force" in capsys.readouterr().err
    assert main(["export", "triton", str(bundle), "-o", str(repo), "--force", "--instances", "2"]) == 0
    assert "count: 2" in (repo / "cnn" / "config.pbtxt").read_text()
    mine = repo / "mine"
    mine.mkdir()
    (mine / "config.pbtxt").write_text("name: 'mine'\n")
    assert main(["export", "triton", str(bundle), "-o", str(repo), "--name", "mine", "--force"]) == 2
    assert "is not a Triton model folder" in capsys.readouterr().err
    assert (mine / "config.pbtxt").read_text() == "name: 'mine'\n"


def test_gpus_place_the_instances_on_each_listed_gpu(bundle, tmp_path):
    """--gpus 0,1: Triton's instance group with its gpus list (--instances on each); all: Triton's default."""
    repo = tmp_path / "repo"
    assert main(["export", "triton", str(bundle), "-o", str(repo), "--gpus", "0,1", "--instances", "2"]) == 0
    config = _triton_parse(repo / "cnn" / "config.pbtxt")
    assert config["instanceGroup"] == [{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1]}]
    assert main(["export", "triton", str(bundle), "-o", str(repo), "--gpus", "all", "--force"]) == 0
    assert _triton_parse(repo / "cnn" / "config.pbtxt")["instanceGroup"] == [{"count": 1, "kind": "KIND_GPU"}]


@pytest.mark.parametrize("args, message", [
    (["--gpus", "0,0"], "--gpus 0,0: GPU numbers from 0 to 63, each once"),
    (["--gpus", "-1"], "--gpus -1: GPU numbers from 0 to 63"),
    (["--gpus", "1", "--instance-kind", "cpu"], "--gpus places GPU instances"),
    (["--platform", "tensorrt"], "has no engine"),
    (["--name", "a/b"], "a Triton model name is letters, digits"),
    (["--name", ".."], "not only dots"),
    (["--name", "."], "not only dots"),
    (["--instances", "0"], "--instances 0: from 1 to 64"),
    (["--max-queue-delay-us", "-1"], "--max-queue-delay-us -1: from 0 to"),
])
def test_refusals_are_one_line(bundle, tmp_path, capsys, args, message):
    assert main(["export", "triton", str(bundle), "-o", str(tmp_path / "repo"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["repo"])  # nothing beside it either (--name ..)


def test_a_tensorrt_engine_is_exported_only_for_the_server_it_runs_on(bundle, tmp_path, capsys):
    """An engine runs only on the TensorRT and GPU it was built for: both must be given and match (the
    manifest of a bundle built on an H100 with TensorRT 10.3, as convert writes it there)."""
    import shutil

    built = tmp_path / "built"
    shutil.copytree(bundle, built)
    manifest = json.loads((built / "manifest.json").read_text())
    (built / "model.engine").write_bytes(b"plan")
    from jetpipe import bundle as bundles

    manifest["engine"] = {"built": True, "file": "model.engine", "family": "tensorrt", "version": "10.3.0",
                          "tensorrt": "10.3.0", "compute_capability": "9.0"}
    (built / "manifest.json").write_text(json.dumps(manifest))
    bundles.finish_manifest(built, manifest)
    base = ["export", "triton", str(built), "-o", str(tmp_path / "repo"), "--platform", "tensorrt"]
    assert main(base) == 2
    assert "give the server's TensorRT and compute capability" in capsys.readouterr().err
    assert main([*base, "--server-tensorrt", "10.8.0", "--server-compute-capability", "9.0"]) == 2
    assert "the server has TensorRT 10.8.0, the engine was built for 10.3.0" in capsys.readouterr().err
    assert main([*base, "--server-tensorrt", "10.3.0", "--server-compute-capability", "9.0"]) == 0
    assert (tmp_path / "repo" / "built" / "1" / "model.plan").read_bytes() == b"plan"
    assert 'platform: "tensorrt_plan"' in (tmp_path / "repo" / "built" / "config.pbtxt").read_text()
