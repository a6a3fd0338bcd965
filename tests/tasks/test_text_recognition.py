"""text-recognition: greedy CTC decoding by hand, against RapidOCR's own decoder on the real PP-OCRv4
recognizer, and the built-in ppocr-rec bundle reading rendered text through jetpipe's preprocessing."""

import json

import numpy as np
import onnx
import pytest

from jetpipe.cli import main
from jetpipe.models import BUILTIN
from jetpipe.preprocess import preprocess_bgr
from jetpipe.runtime.sessions import cpu_session
from jetpipe.spec import PreprocessSpec
from jetpipe.synth import render_text_line
from jetpipe.tasks import for_bundle
from jetpipe.tasks.text_recognition import CTCRecognition, alphabet


def test_greedy_ctc_by_hand():
    labels = ("blank", "a", "b", " ")
    steps = [1, 1, 0, 1, 2, 2, 0, 0, 3, 2]  # a a _ a b b _ _ ' ' b -> "aab b"
    probs = np.full((1, len(steps), 4), 0.1, np.float32)
    probs[0, np.arange(len(steps)), steps] = 0.7
    result = CTCRecognition(labels)({"y": probs}, [None], None)[0]
    assert result == {"text": "aab b", "score": pytest.approx(0.7)}
    blank = np.zeros((1, 5, 4), np.float32)
    blank[..., 0] = 1
    assert CTCRecognition(labels)({"y": blank}, [None], None)[0] == {"text": "", "score": 0.0}


def test_logits_are_scored_as_probabilities():
    labels = ("blank", "a")
    logits = np.array([[[0.0, 2.0], [3.0, 0.0]]], np.float32)
    result = CTCRecognition(labels)({"y": logits}, [None], None)[0]
    assert result["text"] == "a"
    assert result["score"] == pytest.approx(np.exp(2) / (1 + np.exp(2)), abs=1e-4)


def test_alphabet_completed_as_paddleocr_does():
    assert alphabet(["a", "b"], 4) == ("blank", "a", "b", " ")
    assert alphabet(["a", "b"], 3) == ("blank", "a", "b")
    assert alphabet(["-", "a", "b"], 3) == ("-", "a", "b")
    assert alphabet(["a", "b"], 7) is None


@pytest.fixture(scope="module")
def rec_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("rec") / "b"
    assert main(["convert", "ppocr-rec", "-o", str(out), "--max-batch", "4", "--quiet"]) == 0
    return out


def _lines(count, first_seed=0):
    spec = PreprocessSpec(mean=(0.5,) * 3, std=(0.5,) * 3, channel_order="bgr", resize="topleft", pad_value=127.5)
    lines = [render_text_line(first_seed + i, (48, 320)) for i in range(count)]
    return np.stack([preprocess_bgr(line.bgr, (48, 320), spec)[0] for line in lines]), lines


def test_the_builtin_recognizer_reads_rendered_words_as_rapidocr_decodes_them(rec_bundle):
    from rapidocr_onnxruntime.ch_ppocr_rec.utils import CTCLabelDecode

    manifest = json.loads((rec_bundle / "manifest.json").read_text())
    assert manifest["task"] == "text-recognition" and len(manifest["labels"]) == 6625
    assert manifest["input_width_range"] == [80, 960] and manifest["preprocess"]["resize"] == "topleft"
    task, options = for_bundle(manifest)
    inputs, lines = _lines(8)
    scores = cpu_session(onnx.load(str(rec_bundle / "model.onnx"))).run(None, {"x": inputs})[0]
    ours = task.postprocessor(options)({"y": scores}, [None] * len(inputs), None)
    source = onnx.load(str(BUILTIN["ppocr-rec"].path()), load_external_data=False)
    character = {p.key: p.value for p in source.metadata_props}["character"].splitlines()
    theirs = CTCLabelDecode(character=character)(scores)
    assert [r["text"] for r in ours] == [t for t, _ in theirs]
    np.testing.assert_allclose([r["score"] for r in ours], [s for _, s in theirs], atol=1e-4)
    read = sum(r["text"].split() == line.words for r, line in zip(ours, lines))
    assert read >= 6, [(r["text"], line.words) for r, line in zip(ours, lines)]


def test_text_metric_against_fp32(rec_bundle):
    manifest = json.loads((rec_bundle / "manifest.json").read_text())
    task, options = for_bundle(manifest)
    inputs, _ = _lines(4, first_seed=20)
    reference = cpu_session(onnx.load(str(rec_bundle / "model.onnx"))).run(None, {"x": inputs})
    assert task.metric(reference, reference, options) == {"exact": 1.0, "cer": 0.0}
    shuffled = [reference[0][::-1].copy()]
    assert task.metric(reference, shuffled, options)["exact"] < 1.0
