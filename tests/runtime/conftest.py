import pytest


@pytest.fixture(scope="module")
def device():
    """The GPU's CudaDevice (GPU tests only: created when a test asks for it)."""
    from jetpipe.runtime.cuda import CudaDevice

    dev = CudaDevice()
    yield dev
    dev.close()
