"""Postprocessing reductions on the GPU (kernels in postprocess.cu).

A reducer reads the engine's first output where the engine wrote it and
writes compact per-frame arrays; the runtime copies only those to the host.
Scratch memory is shared by the buffer sets (everything runs in order on the
compute stream); the compact arrays are per set, like the outputs.

  components  DB text detection: 8-connected components of (prob > threshold)
              with bounding box, area, probability sum, pixel moments and the extents along
              and across the region's orientation; `limit` per frame
  topk        classification: the k largest values and row statistics
  yolo-nms    YOLO decode + score filter + class-aware NMS; `limit` per frame
  best-per-step  CTC text recognition: the best class of each time step and its row statistics
"""

from __future__ import annotations

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.runtime.api import Reduction

SOURCE_NAME = "postprocess.cu"

COMPONENT = np.dtype([("x0", np.int32), ("y0", np.int32), ("x1", np.int32), ("y1", np.int32),
                      ("area", np.int32), ("angle", np.float32), ("sum", np.uint64),
                      *((name, np.uint64) for name in ("sx", "sy", "sxx", "syy", "sxy")),
                      *((name, np.int32) for name in ("along_min", "along_max", "across_min", "across_max"))])
assert COMPONENT.itemsize == 88
EXTENT_SCALE = 16.0  # component extents are in 1/16 pixel
SUM_SCALE = float(2**32)  # component sums are 32.32 fixed point

YOLO_PARAMS = np.dtype([("layout", np.int32), ("anchors", np.int32), ("classes", np.int32), ("limit", np.int32),
                        ("score_threshold", np.float32), ("iou_threshold", np.float32), ("input_h", np.int32),
                        ("input_w", np.int32), ("strides", np.int32, 4), ("levels", np.int32),
                        ("keys_per_frame", np.int32)])
YOLO_LAYOUTS = {"yolov8": 0, "yolov5": 1, "yolox": 2}
NMS_THREADS = 1024  # the NMS kernel keeps up to one detection per thread


class ReductionUnsupported(JetpipeError):
    """This reduction does not fit the model's output (the reason says why)."""


class _Reducer:
    """Per-set compact outputs (device + pinned host) and their download."""

    def __init__(self, device, max_batch: int, sets: int, layout: dict[str, tuple[tuple[int, ...], np.dtype]]):
        self.device, self.max_batch = device, max_batch
        self.device_out = [{name: device.alloc(max_batch * int(np.prod(shape)) * np.dtype(dtype).itemsize)
                            for name, (shape, dtype) in layout.items()} for _ in range(sets)]
        self.host_out = [{name: device.pinned((max_batch, *shape), dtype) for name, (shape, dtype) in layout.items()}
                         for _ in range(sets)]

    def download(self, set_index: int, batch: int, stream, sample_shape=None) -> int:
        """Queue the copies of this batch's compact arrays; returns the bytes copied."""
        copied = 0
        for name, host in self.host(set_index, batch, sample_shape).items():
            self.device.cuda.memcpy_dtoh_async(host, self.device_out[set_index][name], stream)
            copied += host.nbytes
        return copied

    def host(self, set_index: int, batch: int, sample_shape=None) -> dict[str, np.ndarray]:
        """This batch's compact arrays (sample_shape: the model output's at the batch's input width)."""
        return {name: host[:batch] for name, host in self.host_out[set_index].items()}


class ComponentsReducer(_Reducer):
    kind = "components"

    def __init__(self, device, module, max_batch: int, sets: int, output, threshold: float, limit: int = 1000):
        shape = output.sample_shape
        if len(shape) not in (2, 3) or (len(shape) == 3 and shape[0] != 1):
            raise ReductionUnsupported(f"text detection on the GPU reads a [N, 1, H, W] probability map; "
                                       f"output {output.name} is {[None, *shape]}")
        self.height, self.width = shape[-2:]
        self.threshold, self.limit = np.float32(threshold), int(limit)
        pixels = max_batch * self.height * self.width
        self.labels, self.slots = device.alloc(4 * pixels), device.alloc(4 * pixels)
        super().__init__(device, max_batch, sets, {"counts": ((), np.int32), "components": ((limit,), COMPONENT)})
        self.init, self.merge = module.get_function("db_init"), module.get_function("db_merge")
        self.roots, self.stats = module.get_function("db_roots"), module.get_function("db_stats")
        self.extents = module.get_function("db_extents")
        self.extents.prepare("PPPiii")
        self.init.prepare("PPPiif")
        self.merge.prepare("Pii")
        self.roots.prepare("PPPPiii")
        self.stats.prepare("PPPPiii")

    def launch(self, set_index: int, batch: int, output_address: int, stream, sample_shape=None) -> None:
        h, w = self.height, self.width
        total, out = batch * h * w, self.device_out[set_index]
        flat, tiles = ((total + 255) // 256, 1), ((w + 31) // 32, (h + 7) // 8, batch)
        self.init.prepared_async_call(flat, (256, 1, 1), stream, output_address, self.labels, out["counts"],
                                      np.int32(total), np.int32(batch), self.threshold)
        self.merge.prepared_async_call(tiles, (32, 8, 1), stream, self.labels, np.int32(h), np.int32(w))
        self.roots.prepared_async_call(flat, (256, 1, 1), stream, self.labels, self.slots, out["counts"],
                                       out["components"], np.int32(total), np.int32(h * w), np.int32(self.limit))
        self.stats.prepared_async_call(tiles, (32, 8, 1), stream, output_address, self.labels, self.slots,
                                       out["components"], np.int32(h), np.int32(w), np.int32(self.limit))
        self.extents.prepared_async_call(tiles, (32, 8, 1), stream, self.labels, self.slots, out["components"],
                                         np.int32(h), np.int32(w), np.int32(self.limit))


class TopKReducer(_Reducer):
    kind = "topk"

    def __init__(self, device, module, max_batch: int, sets: int, output, k: int = 5):
        self.classes = int(np.prod(output.sample_shape))
        self.k = min(int(k), self.classes)
        if not 1 <= self.k <= 64:
            raise ReductionUnsupported(f"top-k on the GPU takes k from 1 to 64, not {k}")
        super().__init__(device, max_batch, sets, {"top_index": ((self.k,), np.int32),
                                                   "top_value": ((self.k,), np.float32),
                                                   "stats": ((4,), np.float32)})
        self.function = module.get_function("topk")
        self.function.prepare("PiiPPP")

    def launch(self, set_index: int, batch: int, output_address: int, stream, sample_shape=None) -> None:
        out = self.device_out[set_index]
        self.function.prepared_async_call((batch, 1), (256, 1, 1), stream, output_address, np.int32(self.classes),
                                          np.int32(self.k), out["top_index"], out["top_value"], out["stats"])


class BestPerStepReducer(_Reducer):
    """CTC text recognition: the best class of every time step ([N, T, C] -> [N, T]) and its row statistics,
    by the top-k kernel with k = 1 run on each step's row (one block a step). T * 24 bytes a line come back
    instead of T * C * 4 (PP-OCRv4 rec at width 320: 960 bytes instead of 1 MB)."""

    kind = "best-per-step"

    def __init__(self, device, module, max_batch: int, sets: int, output):
        shape = output.sample_shape
        if len(shape) != 2 or not all(isinstance(d, int) and d > 0 for d in shape):
            raise ReductionUnsupported(f"CTC decoding on the GPU reads a [N, T, C] output of fixed T and C; "
                                       f"{output.name} is {[None, *shape]}")
        self.steps, self.classes = shape
        super().__init__(device, max_batch, sets, {"best": ((self.steps,), np.int32),
                                                   "best_value": ((self.steps,), np.float32),
                                                   "stats": ((self.steps, 4), np.float32)})
        self.function = module.get_function("topk")
        self.function.prepare("PiiPPP")

    def launch(self, set_index: int, batch: int, output_address: int, stream, sample_shape=None) -> None:
        """Rows of the batch's steps (fewer than `steps` at a narrower input width) written one after another."""
        steps = sample_shape[0] if sample_shape else self.steps
        out = self.device_out[set_index]
        self.function.prepared_async_call((batch * steps, 1), (256, 1, 1), stream, output_address,
                                          np.int32(self.classes), np.int32(1), out["best"], out["best_value"],
                                          out["stats"])

    def host(self, set_index: int, batch: int, sample_shape=None) -> dict[str, np.ndarray]:
        steps = sample_shape[0] if sample_shape else self.steps
        return {name: host.reshape(-1)[:batch * steps * int(np.prod(host.shape[2:]))]
                .reshape(batch, steps, *host.shape[2:]) for name, host in self.host_out[set_index].items()}


def yolo_layout(sample_shape, requested: str) -> str:
    """The postprocessor's rule: [4 + C, N] (channels first) is YOLOv8, [N, 5 + C] YOLOv5."""
    if requested != "auto":
        return requested
    return "yolov8" if sample_shape[0] < sample_shape[1] else "yolov5"


class YoloReducer(_Reducer):
    kind = "yolo-nms"

    def __init__(self, device, module, max_batch: int, sets: int, output, layout: str = "auto",
                 score_threshold: float = 0.25, iou_threshold: float = 0.45, limit: int = 300,
                 input_hw=(640, 640), strides=(8, 16, 32)):
        shape = output.sample_shape
        if len(shape) != 2:
            raise ReductionUnsupported(f"YOLO on the GPU reads a [N, anchors, 5 + C] or [N, 4 + C, anchors] "
                                       f"output; {output.name} is {[None, *shape]}")
        layout = yolo_layout(shape, layout)
        if layout not in YOLO_LAYOUTS:
            raise ReductionUnsupported(f"YOLO layout {layout!r}: choose one of {', '.join(YOLO_LAYOUTS)}")
        anchors, channels = (shape[1], shape[0]) if layout == "yolov8" else shape
        classes = channels - (4 if layout == "yolov8" else 5)
        if classes < 1 or not 1 <= limit <= NMS_THREADS or len(strides) > 4:
            raise ReductionUnsupported(f"YOLO on the GPU: {classes} classes, limit {limit} (1..{NMS_THREADS}), "
                                       f"{len(strides)} strides (at most 4)")
        keys_per_frame = 1 << max(0, (anchors - 1).bit_length())  # the sort pads to a power of two
        params = np.zeros((), YOLO_PARAMS)
        params["layout"], params["anchors"], params["classes"], params["limit"] = (
            YOLO_LAYOUTS[layout], anchors, classes, limit)
        params["score_threshold"], params["iou_threshold"] = score_threshold, iou_threshold
        params["input_h"], params["input_w"] = input_hw
        params["strides"][:len(strides)], params["levels"] = strides, len(strides)
        params["keys_per_frame"] = keys_per_frame
        self.anchors, self.limit = anchors, limit
        self.params = device.alloc(YOLO_PARAMS.itemsize)
        device.cuda.memcpy_htod(self.params, params)
        self.counts = device.alloc(4 * max_batch)
        self.keys = device.alloc(8 * max_batch * keys_per_frame)
        self.classes, self.scores = device.alloc(4 * max_batch * anchors), device.alloc(4 * max_batch * anchors)
        super().__init__(device, max_batch, sets, {"counts": ((), np.int32), "detections": ((limit, 6), np.float32)})
        self.candidates, self.nms = module.get_function("yolo_candidates"), module.get_function("yolo_nms")
        self.candidates.prepare("PPPPPP")
        self.nms.prepare("PPPPPPPP")

    def launch(self, set_index: int, batch: int, output_address: int, stream, sample_shape=None) -> None:
        out = self.device_out[set_index]
        self.device.cuda.memset_d32_async(self.counts, 0, batch, stream)
        self.candidates.prepared_async_call(((self.anchors + 255) // 256, batch), (256, 1, 1), stream,
                                            output_address, self.params, self.counts, self.keys, self.classes,
                                            self.scores)
        self.nms.prepared_async_call((batch, 1), (NMS_THREADS, 1, 1), stream, output_address, self.params,
                                     self.counts, self.keys, self.classes, self.scores, out["counts"],
                                     out["detections"])


REDUCERS = {"components": ComponentsReducer, "topk": TopKReducer, "yolo-nms": YoloReducer,
            "best-per-step": BestPerStepReducer}


def make_reducer(reduction: Reduction, device, module, max_batch: int, sets: int, output):
    """The reducer for `reduction` on the model's first output; ReductionUnsupported if it does not fit."""
    if reduction.kind not in REDUCERS:
        raise ReductionUnsupported(f"no GPU postprocessing named {reduction.kind!r} "
                                   f"(there are {', '.join(REDUCERS)})")
    if np.dtype(output.dtype) != np.float32:
        raise ReductionUnsupported(f"GPU postprocessing reads float32 outputs; {output.name} is "
                                   f"{np.dtype(output.dtype).name}")
    return REDUCERS[reduction.kind](device, module, max_batch, sets, output, **reduction.options)
