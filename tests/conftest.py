import shutil

import pytest

from jetpipe.models import BUILTIN


def _gpu_reason() -> str | None:
    """None when a CUDA GPU is usable through PyCUDA, else why not (the runtime's own probe)."""
    from jetpipe.runtime.probe import probe_gpu

    return probe_gpu().reason


def pytest_collection_modifyitems(config, items):
    gpu_items = [i for i in items if "gpu" in i.keywords]
    if not gpu_items:
        return
    reason = _gpu_reason()
    if reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=f"GPU test: {reason}"))


@pytest.fixture(scope="module")
def device():
    """The GPU's CudaDevice (GPU tests only: created when a test asks for it)."""
    from jetpipe.runtime.cuda import CudaDevice

    dev = CudaDevice()
    yield dev
    dev.close()


@pytest.fixture(scope="session")
def det_model_path():
    return BUILTIN["ppocr-det"].path()


@pytest.fixture
def no_tmp_leftovers(tmp_path):
    """Asserts a test left no staging folders behind in tmp_path."""
    yield tmp_path
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    assert not leftovers, leftovers


@pytest.fixture(scope="session")
def has_nvcc():
    return shutil.which("nvcc") is not None
