import pytest

from jetpipe.convert import ConvertOptions, convert
from jetpipe.models import BUILTIN
from jetpipe.spec import preset


@pytest.fixture(scope="session")
def det_bundle(tmp_path_factory):
    """PP-OCRv4 det, FP32, 640x640, batch up to 4 (converted once per test session)."""
    model = BUILTIN["ppocr-det"]
    out = tmp_path_factory.mktemp("pipelines") / "det"
    convert(ConvertOptions(model=model.path(), output=out, input_size=model.input_size, max_batch=4,
                           spec=preset(model.preset), task=model.task, engine="never", progress=False))
    return out
