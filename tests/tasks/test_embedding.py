"""The embedding task: a feature vector a crop (a ReID model for the tracker), only when asked for, refused
where the outputs are not one fixed-length vector a crop."""

import numpy as np
import onnx

from jetpipe import bundle as bundles
from jetpipe.cli import main
from jetpipe.pipelines.core.tracking.appearance import colour_cue_model
from jetpipe.tasks import ModelFacts, choose, for_bundle
from jetpipe.tasks.embedding import Embedding, EmbeddingTask, unit_rows
from tests.helpers import residual_cnn, save


def _facts(*shapes):
    return ModelFacts(tuple((f"out{i}", tuple(s)) for i, s in enumerate(shapes)), (64, 32), {})


def test_an_embedding_is_read_only_when_asked_for():
    assert choose(None, _facts(["N", 128])).name == "classification"  # the same shape as class scores
    assert choose("embedding", _facts(["N", 128])).name == "embedding"
    assert choose("embedding", _facts(["N", 512, 1, 1])).name == "embedding"
    task = EmbeddingTask()
    assert "8 to 8192" in task.mismatch(_facts(["N", 5]))
    assert "expects one output" in task.mismatch(_facts(["N", 128], ["N", 4]))
    assert "[N, D]" in task.mismatch(_facts(["N", 40, 128]))


def test_vectors_come_back_unit_long_and_the_metric_is_the_worst_crop():
    rows = unit_rows(np.array([[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]]), 2)
    assert np.allclose(rows, [[0.6, 0.8], [0.0, 0.0]])
    records = Embedding()({"y": np.array([[3.0, 4.0] + [0.0] * 6])}, [None], [(10, 10)])
    assert np.allclose(records[0]["embedding"][:2], [0.6, 0.8], atol=1e-3)
    reference = [np.array([[1.0, 0.0], [0.0, 1.0]])]
    candidate = [np.array([[1.0, 0.0], [1.0, 1.0]])]  # the second crop's vector turned 45 degrees
    assert abs(EmbeddingTask().metric(reference, candidate, None)["cosine_min"] - np.sqrt(0.5)) < 1e-6


def test_convert_makes_an_embedding_bundle_and_refuses_a_model_that_is_not_one(tmp_path, capsys):
    onnx.save(colour_cue_model(), str(tmp_path / "cue.onnx"))
    assert main(["convert", str(tmp_path / "cue.onnx"), "--task", "embedding", "--engine", "never", "--quiet",
                 "-o", str(tmp_path / "cue")]) == 0
    task, _ = for_bundle(bundles.load(tmp_path / "cue"))
    assert task.name == "embedding"
    capsys.readouterr()
    assert main(["convert", save(residual_cnn(size=32), tmp_path / "m.onnx"), "--task", "embedding", "--engine",
                 "never", "--quiet", "-o", str(tmp_path / "five")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "8 to 8192" in err and not (tmp_path / "five").exists()
