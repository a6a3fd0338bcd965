"""`import jetpipe` must work without PyCUDA, TensorRT or a GPU, and create no CUDA context."""

import subprocess
import sys

BLOCK_GPU_MODULES = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('pycuda', 'tensorrt', 'cupy', 'torch'):
            raise ImportError(f'{name} blocked by test')
sys.meta_path.insert(0, Block())
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_GPU_MODULES + code],
                          capture_output=True, text=True, timeout=120)


def test_import_without_gpu_packages():
    result = _run(
        "import jetpipe, jetpipe.cli, jetpipe.convert, jetpipe.runtime, jetpipe.pipelines, "
        "jetpipe.calibration, jetpipe.runtime.trt_builder\n"
        "assert not any(m.split('.')[0] in ('pycuda', 'tensorrt') for m in sys.modules)\n"
        "print(jetpipe.__version__)"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == __import__("jetpipe").__version__


def test_doctor_reports_missing_gpu_packages():
    result = _run("from jetpipe.cli import main; sys.exit(main(['doctor']))")
    assert result.returncode == 0, result.stderr
    assert "pycuda       not installed (pip install 'jetpipe[gpu]')" in result.stdout
    assert "tensorrt     not installed" in result.stdout
    assert f"video        files in-process: PyAV {__import__('av').__version__} (hwaccel: " in result.stdout


def test_engine_require_without_tensorrt_fails_clearly(tmp_path):
    result = _run(
        "from jetpipe.cli import main\n"
        f"sys.exit(main(['convert', 'missing.onnx', '-o', r'{tmp_path / 'b'}', '--engine', 'require']))"
    )
    assert result.returncode == 2
    assert "error: --engine require but TensorRT is not installed" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "b").exists()


def test_one_gpu_probe_answers_without_a_context():
    """doctor, the engine builder, CudaDevice and the test suite ask the same probe."""
    import importlib.util

    from jetpipe.runtime.probe import probe_gpu

    facts = probe_gpu()
    if importlib.util.find_spec("pycuda") is None:
        assert facts.pycuda is None and not facts.usable and "pip install 'jetpipe[gpu]'" in facts.reason
    else:
        assert facts.pycuda and (facts.usable == (facts.reason is None))
    assert probe_gpu(ordinal=99).reason is not None  # no machine has a 100th GPU
