"""A1 / A2 on the real PP-OCRv4 detector (from rapidocr-onnxruntime), ONNX Runtime CPU.

Calibration uses rendered-text images with seeds >= 10000; evaluation uses
seeds 0..N-1, so the evaluation images were never seen during calibration.
"""

import json

import numpy as np
import pytest

from jetpipe.bundle import MODEL_FILE
from jetpipe.calibration.textdet_eval import eval_inputs, run_batched, score
from jetpipe.convert import ConvertOptions, convert
from jetpipe.models import BUILTIN
from jetpipe.runtime.sessions import cpu_session
from jetpipe.spec import preset

pytestmark = pytest.mark.slow
EVAL_IMAGES = 16
SIZE = BUILTIN["ppocr-det"].input_size


@pytest.fixture(scope="module")
def reference(det_model_path):
    from jetpipe.convert import graph

    model = graph.fix_input_size(graph.load(det_model_path), SIZE)
    inputs = eval_inputs(EVAL_IMAGES, SIZE, preset("ppocr-det"))
    return inputs, run_batched(cpu_session(model), inputs)


def _bundle(tmp_path_factory, det_model_path, precision, calib_size):
    out = tmp_path_factory.mktemp(precision) / "bundle"
    convert(ConvertOptions(model=det_model_path, output=out, precision=precision, calib="synthetic",
                           calib_size=calib_size, input_size=SIZE, spec=preset("ppocr-det"),
                           progress=False))
    return out


def test_a2_fp16_matches_fp32(tmp_path_factory, det_model_path, reference):
    out = _bundle(tmp_path_factory, det_model_path, "fp16", 8)
    inputs, ref = reference
    result = score(ref, run_batched(cpu_session(str(out / MODEL_FILE)), inputs))
    print("A2 fp16 vs fp32 (ORT CPU):", result.line())
    assert result.f1_mean >= 0.99 and result.f1_min >= 0.99
    assert result.mae <= 1e-3
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["io"]["inputs"][0]["dtype"] == "float32"
    # the reductions whose fp16 sums would overflow are kept in float32, with the reason
    assert any("overflows fp16" in why for why in manifest["excluded_nodes"].values())


def test_a1_int8_matches_fp32(tmp_path_factory, det_model_path, reference):
    out = _bundle(tmp_path_factory, det_model_path, "int8", 32)
    inputs, ref = reference
    result = score(ref, run_batched(cpu_session(str(out / MODEL_FILE)), inputs))
    print("A1 int8 vs fp32 (ORT CPU):", result.line())
    assert result.f1_mean >= 0.98 and result.f1_min >= 0.95
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["calibration"]["method"] == "percentile"
    assert any(why.startswith("sensitivity") for why in manifest["excluded_nodes"].values())
    assert np.isfinite(manifest["accuracy_check"]["relative_mae"])
