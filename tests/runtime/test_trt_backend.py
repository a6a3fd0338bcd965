"""The engine backends (TensorRT, TensorRT-RTX) as far as they run without a GPU that can load engines.

TensorRT proper cannot be installed on the project's machines, and TensorRT-RTX engines do not load on
the H100/H200; what runs everywhere: the choice of backend, the checks made before deserializing, and
TensorRTBackend itself up to deserialization (a real TensorRT-RTX build, then its real refusal here).
"""

import onnx
import pytest

from jetpipe.errors import EngineError
from jetpipe.runtime.trt_backend import TensorRTBackend, check_engine_compatibility, engine_backend
from jetpipe.runtime.trt_builder import BuildOptions, build_engine, import_family
from jetpipe.runtime.trt_selftest import tiny_model


def test_engine_mismatch_is_refused_before_deserializing():
    manifest = {"source": {"path": "det.onnx"},
                "engine": {"built": True, "tensorrt": "10.3.0", "compute_capability": "8.7"}}
    check_engine_compatibility(manifest, "10.3.0", "8.7", "b")
    with pytest.raises(EngineError, match=r"TensorRT 10.3.0 for sm 8.7 cannot load on TensorRT 11.4.0 / "
                                          r"sm 9.0: rebuild it with `jetpipe convert det.onnx -o b --force"):
        check_engine_compatibility(manifest, "11.4.0", "9.0", "b")
    with pytest.raises(EngineError, match="has no TensorRT engine"):
        check_engine_compatibility({"source": {"path": "m"}, "engine": {"built": False, "reason": "x"}},
                                   "10.3.0", "8.7", "b")


RTX_ENGINE = {"built": True, "file": "model.engine", "family": "tensorrt-rtx", "version": "1.7.1.116",
              "targets": ["sm86", "sm89"]}
TRT_ENGINE = {"built": True, "file": "model.engine", "tensorrt": "10.3.0", "compute_capability": "8.7"}


@pytest.mark.parametrize("engine, requested, installed, cc, expected", [
    (RTX_ENGINE, "auto", {"tensorrt-rtx"}, "8.9", ("tensorrt-rtx", "")),
    (RTX_ENGINE, "auto", {"tensorrt-rtx"}, "9.0", (None, "do not run on compute capability 9.0")),
    (RTX_ENGINE, "auto", {"tensorrt-rtx"}, "8.7", (None, "do not run on compute capability 8.7")),  # Orin
    (RTX_ENGINE, "auto", {"tensorrt-rtx"}, "12.0", (None, "built for sm86, sm89, not this GPU's sm120")),
    (RTX_ENGINE, "auto", set(), "8.6", (None, "tensorrt-rtx is not installed")),
    (RTX_ENGINE, "tensorrt", {"tensorrt", "tensorrt-rtx"}, "8.6", (None, "built by tensorrt-rtx, not tensorrt")),
    (TRT_ENGINE, "auto", {"tensorrt"}, "8.7", ("tensorrt", "")),  # a bundle from before families
    (TRT_ENGINE, "tensorrt-rtx", {"tensorrt", "tensorrt-rtx"}, "8.7", (None, "built by tensorrt, not")),
    ({"built": False, "reason": "--engine never"}, "auto", {"tensorrt"}, "8.7", (None, "no engine (--engine never)")),
])
def test_the_engine_backend_is_chosen_by_family_gpu_and_targets(engine, requested, installed, cc, expected):
    choice, why = engine_backend(engine, requested, lambda family: family in installed, cc)
    assert choice == expected[0] and expected[1] in why


def test_a_tensorrt_rtx_plan_is_checked_for_version_and_target_before_loading():
    manifest = {"source": {"path": "m.onnx"}, "engine": RTX_ENGINE}
    check_engine_compatibility(manifest, "1.7.1.116", "8.6", "b", "tensorrt-rtx")
    with pytest.raises(EngineError, match=r"TensorRT-RTX 1.7.1.116 for sm86, sm89 cannot load on TensorRT-RTX "
                                          r"1.8.0 / compute capability 8.6"):
        check_engine_compatibility(manifest, "1.8.0", "8.6", "b", "tensorrt-rtx")
    with pytest.raises(EngineError, match="compute capability 12.0"):
        check_engine_compatibility(manifest, "1.7.1.116", "12.0", "b", "tensorrt-rtx")
    with pytest.raises(EngineError, match="built by tensorrt-rtx, which the tensorrt runtime cannot load"):
        check_engine_compatibility(manifest, "10.3.0", "8.6", "b")


def test_a_missing_engine_family_is_an_engine_error_not_an_import_error():
    missing = next((f for f in ("tensorrt", "tensorrt-rtx") if import_family(f) is None), None)
    if missing is None:
        pytest.skip("both TensorRT families are installed here")
    with pytest.raises(EngineError, match=f"^{missing} is not installed$"):
        TensorRTBackend(b"plan", 1, family=missing)


@pytest.mark.skipif(import_family("tensorrt-rtx") is None, reason="TensorRT-RTX is not installed (the test extra "
                    "installs it on x86_64)")
def test_an_engine_that_cannot_load_here_fails_with_tensorrts_reason(tmp_path):
    """A real TensorRT-RTX engine: no GPU here (CI), or one it does not support (H100/H200: 9.0)."""
    onnx.save(tiny_model(), str(tmp_path / "tiny.onnx"))
    build_engine(tmp_path / "tiny.onnx", tmp_path / "tiny.engine",
                 BuildOptions("x", (3, 32, 32), max_batch=2, family="tensorrt-rtx", targets=("sm86",)))
    with pytest.raises(EngineError, match=r"tensorrt-rtx could not deserialize the engine: .*\S") as caught:
        TensorRTBackend((tmp_path / "tiny.engine").read_bytes(), 2, family="tensorrt-rtx")
    assert "no message" not in str(caught.value)  # the builder's own words say why
