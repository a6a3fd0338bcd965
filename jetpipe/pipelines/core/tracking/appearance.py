"""What an object looks like, for the tracker: a unit vector a box, from a model run on the box's crop.

Two sources, one path (the secondaries' crop path: on the GPU runtime the fused kernel reads each crop from the
frame where it is in device memory, and the model runs there; on the CPU runtime from the host frame):
- `--reid BUNDLE`: any embedding model the user brings (an OSNet-like person ReID network; `jetpipe convert
  MODEL --task embedding`);
- `--reid colour`: the built-in cue, a colour histogram of the crop in horizontal stripes (top to bottom: a
  person's head, clothes, legs), 8 levels a channel, square-rooted so that the vectors' cosine is the
  histograms' Bhattacharyya coefficient. It is a tiny ONNX graph (colour_cue_model) converted at start into a
  temporary bundle, so it runs where the frames are, like any model.

The tracker (botsort.py, looks.py) asks only for the boxes that need it: new and re-appearing objects, boxes
more than one track could take, tracks whose last look is old.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from jetpipe import bundle as bundles
from jetpipe.convert.chain import ConvertOptions, convert
from jetpipe.errors import JetpipeError
from jetpipe.geometry import box_region
from jetpipe.runtime.open import open_runtime
from jetpipe.spec import PreprocessSpec
from jetpipe.tasks import for_bundle
from jetpipe.tasks.embedding import unit_rows

log = logging.getLogger(__name__)

COLOUR = "colour"              # --reid's value for the built-in cue
CUE_SIZE_HW = (64, 32)         # the crop as the cue reads it: a standing person's shape
CUE_STRIPES, CUE_LEVELS = 4, 8  # horizontal stripes, levels a channel: 4 x 3 x 8 = 96 values
CUE_BATCH = 64                 # crops a run


def colour_cue_model():
    """The colour cue as an ONNX graph: [N, 3, 64, 32] RGB in 0-1 -> [N, 96]: per stripe and channel, the
    square roots of the share of its pixels at each of 8 levels."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    height, width = CUE_SIZE_HW
    constants = {"levels": np.float32(CUE_LEVELS), "top": np.float32(CUE_LEVELS - 0.5), "zero": np.float32(0.0),
                 "stripes": np.array([0, 3, CUE_STRIPES, 1, -1], np.int64),
                 "level_ids": np.arange(CUE_LEVELS, dtype=np.float32).reshape(1, 1, 1, CUE_LEVELS, 1),
                 "flat": np.array([0, -1], np.int64)}
    nodes = [helper.make_node("Mul", ["crop", "levels"], ["scaled"]),
             helper.make_node("Clip", ["scaled", "zero", "top"], ["clipped"]),
             helper.make_node("Floor", ["clipped"], ["level"]),
             helper.make_node("Reshape", ["level", "stripes"], ["by_stripe"]),
             helper.make_node("Equal", ["by_stripe", "level_ids"], ["is_level"]),
             helper.make_node("Cast", ["is_level"], ["counted"], to=TensorProto.FLOAT),
             helper.make_node("ReduceMean", ["counted"], ["share"], axes=[4], keepdims=0),
             helper.make_node("Sqrt", ["share"], ["root"]),
             helper.make_node("Reshape", ["root", "flat"], ["look"])]
    graph = helper.make_graph(
        nodes, "colour_cue",
        [helper.make_tensor_value_info("crop", TensorProto.FLOAT, ["N", 3, height, width])],
        [helper.make_tensor_value_info("look", TensorProto.FLOAT, ["N", 3 * CUE_STRIPES * CUE_LEVELS])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="jetpipe")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def colour_cue_bundle(folder: Path) -> Path:
    """The colour cue converted into a new bundle in `folder` (the ONNX model only: ONNX Runtime runs it on
    either runtime; an engine build would cost more than the graph does)."""
    import onnx

    source = folder / "colour_cue.onnx"
    onnx.save(colour_cue_model(), str(source))
    out = folder / "bundle"
    convert(ConvertOptions(model=source, output=out, max_batch=CUE_BATCH, engine="never", progress=False,
                           spec=PreprocessSpec(resize="stretch"), task="embedding", output_flag="--reid"))
    return out


def check_reid_bundle(value: str, where: str = "--reid") -> None:
    """Start-up check: `colour`, or a bundle whose task is an embedding (one line otherwise)."""
    if value == COLOUR:
        return
    manifest = bundles.load(value)
    task, _ = for_bundle(manifest)
    if task.name != "embedding":
        raise JetpipeError(f"{where} {value}: a {task.name} bundle; it needs an embedding model (one feature "
                           f"vector a crop): convert it with --task embedding, or use --reid {COLOUR}")


class Appearance:
    """A unit vector for each asked box of each frame; the runtime is allocated here, released by close()."""

    def __init__(self, reid: str, backend: str = "auto", memory: str = "auto", max_frame_hw=(1080, 1920),
                 cpu_threads: int = 0):
        self.name = COLOUR if reid == COLOUR else Path(reid).name
        self._temp = None
        if reid == COLOUR:
            self._temp = Path(tempfile.mkdtemp(prefix="jetpipe-colour-cue-"))
            backend = backend if backend in ("auto", "onnxruntime-cpu", "onnxruntime-cuda") else "auto"
        else:
            check_reid_bundle(reid)
        try:  # a failed start leaves no temporary folder behind
            bundle = colour_cue_bundle(self._temp) if reid == COLOUR else Path(reid)
            self.runtime = open_runtime(bundle, None, backend, memory, max_frame_hw=max_frame_hw, buffer_sets=2,
                                        cpu_threads=cpu_threads)
        except BaseException:
            self._remove_temp()
            raise
        self.crops = 0
        log.info("appearance for the tracker: %s (%s), batches of up to %d", self.name, self.runtime.backend_name,
                 self.runtime.max_batch)

    def embed(self, jobs: list) -> np.ndarray:
        """jobs: (frame, boxes (m, 4) in its pixels) -> (sum of m, D) unit float32 rows in that order; a box
        with no pixels in the frame gets a zero row (it matches nothing by its look)."""
        crops, where = [], []
        total = 0
        for frame, boxes in jobs:
            height, width = frame.size()
            for i, box in enumerate(np.asarray(boxes, np.float64).reshape(-1, 4)):
                crop = box_region(box, height, width, min_side=2)
                if crop is not None:
                    crops.append(replace(frame, crop=crop))
                    where.append(total + i)
            total += len(boxes)
        out = None
        step = self.runtime.max_batch
        for start in range(0, len(crops), step):
            found = self.runtime.collect(self.runtime.submit(crops[start:start + step]))
            rows = unit_rows(next(iter(found.outputs.values())), len(found.frame_indices))
            if out is None:
                out = np.zeros((total, rows.shape[1]), np.float32)
            out[[where[start + k] for k in found.frame_indices]] = rows
        self.crops += len(crops)
        return out if out is not None else np.zeros((total, 0), np.float32)

    def stats(self) -> dict:
        """Crops run, where, and the frame bytes uploaded for them (0 where they were cut in device memory)."""
        return {"model": self.name, "crops": self.crops, "backend": self.runtime.backend_name,
                "frame_bytes_uploaded": self.runtime.frame_bytes_uploaded}

    def close(self) -> None:
        self.runtime.close()
        self._remove_temp()

    def _remove_temp(self) -> None:
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)  # our own temporary folder, made in the constructor
            self._temp = None
