import numpy as np

from jetpipe.calibration.textdet_eval import boxes_of, detection_hmean, eval_set, run_batched
from jetpipe.tasks.agreement_metrics import iou_matrix as iou


def test_iou_and_one_to_one_matching():
    a = np.array([[0, 0, 10, 10], [20, 20, 30, 30]], float)
    b = np.array([[0, 0, 10, 5], [100, 100, 110, 110]], float)
    np.testing.assert_allclose(iou(a, b), [[0.5, 0], [0, 0]])
    # two predictions on one word: one match, one false positive; the second word is missed
    truth = [np.array([[0, 0, 10, 10], [50, 50, 60, 60]], float)]
    predicted = [np.array([[0, 0, 10, 10], [1, 0, 10, 10]], float)]
    score = detection_hmean(predicted, truth)
    assert (score.precision, score.recall, score.hmean) == (0.5, 0.5, 0.5)
    assert detection_hmean([np.zeros((0, 4))], truth).hmean == 0


def test_fp32_detector_finds_the_rendered_words():
    from jetpipe.models import BUILTIN
    from jetpipe.runtime.sessions import cpu_session
    from jetpipe.spec import preset

    det = BUILTIN["ppocr-det"]
    inputs, letterboxes, truths = eval_set(16, det.input_size, preset(det.preset))
    probabilities = run_batched(cpu_session(str(det.path())), inputs)
    score = detection_hmean(boxes_of(probabilities, letterboxes), truths)
    assert score.hmean > 0.7, score  # measured 0.82 on 128 images; an unpreprocessed input gives ~0
