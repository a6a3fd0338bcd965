import numpy as np
from onnx import numpy_helper

from jetpipe.calibration.layers import localise
from jetpipe.convert.graph import clone, simplify
from tests.helpers import residual_cnn


def test_localisation_finds_the_perturbed_layer():
    reference = simplify(residual_cnn(size=16))
    processed = clone(reference)
    for t in processed.graph.initializer:
        if t.name == "w2":  # conv2's weights, perturbed by 5 %
            w = numpy_helper.to_array(t)
            noise = 0.05 * np.abs(w).mean() * np.random.default_rng(0).standard_normal(w.shape)
            t.CopyFrom(numpy_helper.from_array((w + noise).astype(np.float32), "w2"))
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    ranked = localise(reference, processed, x, "x")
    assert ranked[0]["node"] == "conv2" and ranked[0]["added_error"] > 1e-3
    assert all(r["added_error"] < ranked[0]["added_error"] * 0.5 for r in ranked[1:])


def test_localisation_skips_tensors_whose_shapes_changed():
    """A pruned graph keeps tensor names but not channel counts: those are skipped, not a crash."""
    from jetpipe.convert.prune import prune
    from tests.convert.test_prune import residual_block

    reference = residual_block()
    pruned, _ = prune(reference, 0.25)
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    ranked = localise(reference, pruned, x, "x")
    assert all(r["node"] not in ("conv1", "conv2") for r in ranked)  # their outputs changed shape
