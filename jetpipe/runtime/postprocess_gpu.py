"""Postprocessing reductions on the GPU (kernels in postprocess.cu).

A reducer reads the engine's first output where the engine wrote it and
writes compact per-frame arrays; the runtime copies only those to the host.
Scratch memory is shared by the buffer sets (the reductions run in order on one
stream: the runtime's post stream); the compact arrays are per set, like the outputs.

  components  DB text detection: 8-connected components of (prob > threshold)
              with bounding box, area, probability sum, pixel moments and the extents along
              and across the region's orientation; `limit` per frame
  topk        classification: the k largest values and row statistics
  yolo-nms    YOLO decode + score filter + class-aware NMS; `limit` per frame; with `carry`, each kept
              box's rows after the classes (pose keypoints) written to mapped host memory
  yolo-seg    yolo-nms on a segmentation head, then each kept box's mask from the prototypes, bit-packed
              over its box region, and its outline traced and simplified as OpenCV does it (outline.cuh):
              only the outlines' points cross, into mapped host memory
  argmax      semantic segmentation: each class's pixels in the letterboxed content, and the content's
              classes sampled at most `side` a side (where it is: place(), from the batch's letterboxes)
  best-per-step  CTC text recognition: the best class of each time step and its row statistics

A reducer's launch() reads the addresses of all the model's outputs (in the backend's order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.geometry import map_content, sampling_step
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
                        ("keys_per_frame", np.int32), ("channels", np.int32)])
SEG_PARAMS = np.dtype([("coefficients", np.int32), ("proto_h", np.int32), ("proto_w", np.int32), ("first", np.int32),
                       ("cap_words", np.int32), ("scale_x", np.float32), ("scale_y", np.float32)])
SEG_THREADS = 256
SEG_PARTS = 16        # blocks sharing one box's mask tiles
SEG_MAX_COEFFICIENTS = 64
MASK_AREAS = 8        # mask words a frame holds: its input area 8 times over (boxes past it get no mask)
CHAIN_POINTS = 131072  # room for outline points a frame on the device (past it: the mask goes to the host)
OUTLINE_POINTS = 16384  # simplified outline points a frame hands back (64 KB; past them: the mask goes to the host)
OUTLINE_SHARED_BYTES = 3 * 4 * 4096  # a box's padded mask and flags (OUTLINE_SHARED_WORDS in the kernel): 48 KB
YOLO_LAYOUTS = {"yolov8": 0, "yolov5": 1, "yolox": 2}
NMS_THREADS = 1024  # the NMS kernel keeps up to one detection per thread


class ReductionUnsupported(JetpipeError):
    """This reduction does not fit the model's output (the reason says why)."""


Layout = dict[str, tuple[tuple[int, ...], np.dtype]]


@dataclass(frozen=True)
class ReductionSite:
    """Where a reducer runs: the device and compiled kernels, the batches it takes and the buffer sets it keeps
    arrays for, and the model's outputs (specs, in the backend's order) it reads."""

    device: object
    module: object
    max_batch: int
    sets: int
    outputs: list


class _Reducer:
    """Per-set compact outputs: device arrays copied to pinned host arrays (`layout`), and mapped host arrays
    the kernels write into themselves (`mapped`: variable-size results, only what is written crosses)."""

    reads = "first"  # the outputs it reads: the model's first, or all of them

    def __init__(self, site: ReductionSite, layout: Layout, mapped: Layout | None = None):
        device, max_batch, sets = site.device, site.max_batch, site.sets
        self.device, self.max_batch = device, max_batch
        self.device_out = [{name: device.alloc(max_batch * int(np.prod(shape)) * np.dtype(dtype).itemsize)
                            for name, (shape, dtype) in layout.items()} for _ in range(sets)]
        self.host_out = [{name: device.pinned((max_batch, *shape), dtype) for name, (shape, dtype) in layout.items()}
                         for _ in range(sets)]
        self.mapped_out = [{name: device.pinned((max_batch, *shape), dtype, mapped=True)
                            for name, (shape, dtype) in (mapped or {}).items()} for _ in range(sets)]
        self.mapped_address = [{name: device.device_pointer(array) for name, array in arrays.items()}
                               for arrays in self.mapped_out]

    def place(self, set_index: int, letterboxes) -> None:
        """Where the next batch's frames are in the network input, for reductions that need it (before launch)."""

    def download(self, set_index: int, batch: int, stream, sample_shape=None) -> int:
        """Queue the copies of this batch's compact arrays; returns the bytes copied."""
        copied, views = 0, self.host(set_index, batch, sample_shape)
        for name in self.host_out[set_index]:  # not the mapped arrays: the kernels wrote them where the host reads
            host = views[name]
            self.device.cuda.memcpy_dtoh_async(host, self.device_out[set_index][name], stream)
            copied += host.nbytes
        return copied

    def host(self, set_index: int, batch: int, sample_shape=None) -> dict[str, np.ndarray]:
        """This batch's compact arrays (sample_shape: the model output's at the batch's input width)."""
        return {name: host[:batch] for name, host in {**self.host_out[set_index], **self.mapped_out[set_index]}.items()}

    def written(self, set_index: int, batch: int) -> int:
        """Bytes the kernels wrote into mapped host memory for the batch (read once it is done)."""
        return 0


class ComponentsReducer(_Reducer):
    kind = "components"

    def __init__(self, site: ReductionSite, threshold: float, limit: int = 1000):
        device, module, output = site.device, site.module, site.outputs[0]
        shape = output.sample_shape
        if len(shape) not in (2, 3) or (len(shape) == 3 and shape[0] != 1):
            raise ReductionUnsupported(f"text detection on the GPU reads a [N, 1, H, W] probability map; "
                                       f"output {output.name} is {[None, *shape]}")
        self.height, self.width = shape[-2:]
        self.threshold, self.limit = np.float32(threshold), int(limit)
        pixels = site.max_batch * self.height * self.width
        self.labels, self.slots = device.alloc(4 * pixels), device.alloc(4 * pixels)
        super().__init__(site, {"counts": ((), np.int32), "components": ((limit,), COMPONENT)})
        self.init, self.merge = module.get_function("db_init"), module.get_function("db_merge")
        self.roots, self.stats = module.get_function("db_roots"), module.get_function("db_stats")
        self.extents = module.get_function("db_extents")
        self.extents.prepare("PPPiii")
        self.init.prepare("PPPiif")
        self.merge.prepare("Pii")
        self.roots.prepare("PPPPiii")
        self.stats.prepare("PPPPiii")

    def launch(self, set_index: int, batch: int, addresses: list[int], stream, sample_shape=None) -> None:
        output_address, (h, w) = addresses[0], (self.height, self.width)
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

    def __init__(self, site: ReductionSite, k: int = 5):
        self.classes = int(np.prod(site.outputs[0].sample_shape))
        self.k = min(int(k), self.classes)
        if not 1 <= self.k <= 64:
            raise ReductionUnsupported(f"top-k on the GPU takes k from 1 to 64, not {k}")
        super().__init__(site, {"top_index": ((self.k,), np.int32),
                                "top_value": ((self.k,), np.float32),
                                "stats": ((4,), np.float32)})
        self.function = site.module.get_function("topk")
        self.function.prepare("PiiPPP")

    def launch(self, set_index: int, batch: int, addresses: list[int], stream, sample_shape=None) -> None:
        out = self.device_out[set_index]
        self.function.prepared_async_call((batch, 1), (256, 1, 1), stream, addresses[0], np.int32(self.classes),
                                          np.int32(self.k), out["top_index"], out["top_value"], out["stats"])


class BestPerStepReducer(_Reducer):
    """CTC text recognition: the best class of every time step ([N, T, C] -> [N, T]) and its row statistics,
    by the top-k kernel with k = 1 run on each step's row (one block a step). T * 24 bytes a line come back
    instead of T * C * 4 (PP-OCRv4 rec at width 320: 960 bytes instead of 1 MB)."""

    kind = "best-per-step"

    def __init__(self, site: ReductionSite):
        output = site.outputs[0]
        shape = output.sample_shape
        if len(shape) != 2 or not all(isinstance(d, int) and d > 0 for d in shape):
            raise ReductionUnsupported(f"CTC decoding on the GPU reads a [N, T, C] output of fixed T and C; "
                                       f"{output.name} is {[None, *shape]}")
        self.steps, self.classes = shape
        super().__init__(site, {"best": ((self.steps,), np.int32),
                                "best_value": ((self.steps,), np.float32),
                                "stats": ((self.steps, 4), np.float32)})
        self.function = site.module.get_function("topk")
        self.function.prepare("PiiPPP")

    def launch(self, set_index: int, batch: int, addresses: list[int], stream, sample_shape=None) -> None:
        """Rows of the batch's steps (fewer than `steps` at a narrower input width) written one after another."""
        steps = sample_shape[0] if sample_shape else self.steps
        out = self.device_out[set_index]
        self.function.prepared_async_call((batch * steps, 1), (256, 1, 1), stream, addresses[0],
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


@dataclass(frozen=True)
class YoloNms:
    """A YOLO head's decoding and NMS, as the task asks for it (its Reduction's options). `extra_rows`: rows of a
    YOLOv8 head after the classes (pose keypoints: K x D, mask coefficients); `carry`: each kept box takes them
    along, back as "carried" [limit, extra_rows], written by a kernel into mapped host memory (only the kept
    boxes' rows cross the bus)."""

    layout: str = "auto"
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    limit: int = 300
    input_hw: tuple = (640, 640)
    strides: tuple = (8, 16, 32)
    extra_rows: int = 0
    carry: bool = False


class YoloReducer(_Reducer):
    """A YOLO head decoded and NMS'd on the GPU (YoloNms: the options)."""

    kind = "yolo-nms"

    def __init__(self, site: ReductionSite, head: int = 0, copied: Layout | None = None,
                 mapped: Layout | None = None, **options):
        """head: which output is the head; copied / mapped: a subclass's own compact arrays beside the
        detections; options: YoloNms' fields."""
        nms = YoloNms(**options)
        layout, limit, strides, extra_rows = nms.layout, nms.limit, nms.strides, nms.extra_rows
        device, module, max_batch = site.device, site.module, site.max_batch
        output = site.outputs[head]
        shape = output.sample_shape
        if len(shape) != 2:
            raise ReductionUnsupported(f"YOLO on the GPU reads a [N, anchors, 5 + C] or [N, 4 + C, anchors] "
                                       f"output; {output.name} is {[None, *shape]}")
        layout = yolo_layout(shape, layout)
        if layout not in YOLO_LAYOUTS:
            raise ReductionUnsupported(f"YOLO layout {layout!r}: choose one of {', '.join(YOLO_LAYOUTS)}")
        if extra_rows and layout != "yolov8":
            raise ReductionUnsupported(f"rows after the classes are read from a YOLOv8 layout, not {layout}")
        anchors, channels = (shape[1], shape[0]) if layout == "yolov8" else shape
        classes = channels - (4 if layout == "yolov8" else 5) - extra_rows
        if classes < 1 or not 1 <= limit <= NMS_THREADS or len(strides) > 4:
            raise ReductionUnsupported(f"YOLO on the GPU: {classes} classes, limit {limit} (1..{NMS_THREADS}), "
                                       f"{len(strides)} strides (at most 4)")
        keys_per_frame = 1 << max(0, (anchors - 1).bit_length())  # the sort pads to a power of two
        params = np.zeros((), YOLO_PARAMS)
        params["layout"], params["anchors"], params["classes"], params["limit"] = (
            YOLO_LAYOUTS[layout], anchors, classes, limit)
        params["score_threshold"], params["iou_threshold"] = nms.score_threshold, nms.iou_threshold
        params["input_h"], params["input_w"] = nms.input_hw
        params["strides"][:len(strides)], params["levels"] = strides, len(strides)
        params["keys_per_frame"], params["channels"] = keys_per_frame, channels
        self.anchors, self.limit, self.head = anchors, limit, head
        self.carry = extra_rows if nms.carry else 0
        self.first_carried = 4 + classes
        self.params = device.alloc(YOLO_PARAMS.itemsize)
        device.cuda.memcpy_htod(self.params, params)
        self.counts = device.alloc(4 * max_batch)
        self.keys = device.alloc(8 * max_batch * keys_per_frame)
        self.classes, self.scores = device.alloc(4 * max_batch * anchors), device.alloc(4 * max_batch * anchors)
        self.kept_anchors = device.alloc(4 * max_batch * limit)
        mapped = dict(mapped or {})
        if self.carry:
            mapped["carried"] = ((limit, self.carry), np.float32)
        super().__init__(site, {"counts": ((), np.int32), "detections": ((limit, 6), np.float32), **(copied or {})},
                         mapped)
        self.candidates, self.nms = module.get_function("yolo_candidates"), module.get_function("yolo_nms")
        self.candidates.prepare("PPPPPP")
        self.nms.prepare("PPPPPPPPP")
        self.gather = module.get_function("yolo_carry")
        self.gather.prepare("PPPPiiP")

    def launch(self, set_index: int, batch: int, addresses: list[int], stream, sample_shape=None) -> None:
        out, head = self.device_out[set_index], addresses[self.head]
        self.device.cuda.memset_d32_async(self.counts, 0, batch, stream)
        self.candidates.prepared_async_call(((self.anchors + 255) // 256, batch), (256, 1, 1), stream,
                                            head, self.params, self.counts, self.keys, self.classes, self.scores)
        self.nms.prepared_async_call((batch, 1), (NMS_THREADS, 1, 1), stream, head, self.params,
                                     self.counts, self.keys, self.classes, self.scores, out["counts"],
                                     out["detections"], self.kept_anchors)
        if self.carry:
            self.gather.prepared_async_call((self.limit, batch), (64, 1, 1), stream, head, self.params, out["counts"],
                                            self.kept_anchors, np.int32(self.first_carried), np.int32(self.carry),
                                            self.mapped_address[set_index]["carried"])

    def written(self, set_index: int, batch: int) -> int:
        return 4 * self.carry * int(self.host_out[set_index]["counts"][:batch].sum())


class SegmentationReducer(YoloReducer):
    """yolo-nms on a YOLOv8/11-seg head (the [N, 4 + C + M, A] output), then each kept box's mask from the
    prototypes ([N, M, H/4, W/4]) over its box region in network pixels, one bit a pixel, rows padded to
    32-bit words, box after box in NMS order (cap_words a frame, in device memory; boxes past them get none; the
    layout rule is segmentation_yolo.mask_regions'), and each mask's outline as the CPU path traces and
    simplifies it ("outlines" [limit, 3]: first point, points, pixels; "points" [point_cap, 2] int16 network
    pixels, mapped). An outline past the room of the chains or the points comes back as its mask's words
    ("masks", mapped, at the box's place) for the host to trace."""

    kind = "yolo-seg"
    reads = "all"

    def __init__(self, site: ReductionSite, coefficients: int = 32, input_hw=(640, 640),
                 outline_tolerance: float = 0.5, segment_distance: bool = True, **options):
        """options: YoloNms' fields (but the layout, the extra rows and where the head is: a seg head's)."""
        device, module, max_batch = site.device, site.module, site.max_batch
        shapes = [tuple(o.sample_shape) for o in site.outputs]
        ranks = sorted(len(shape) for shape in shapes)
        if ranks != [2, 3]:
            raise ReductionUnsupported(f"masks on the GPU read a [N, 4 + C + M, A] head and [N, M, h, w] "
                                       f"prototypes; the outputs are {[[None, *s] for s in shapes]}")
        head = [len(shape) for shape in shapes].index(2)
        proto_m, proto_h, proto_w = shapes[1 - head]
        height, width = input_hw
        if proto_m != coefficients or not 1 <= coefficients <= SEG_MAX_COEFFICIENTS or \
                (proto_h * 4, proto_w * 4) != (height, width):
            raise ReductionUnsupported(f"masks on the GPU: {coefficients} coefficients (1..{SEG_MAX_COEFFICIENTS}) "
                                       f"and prototypes of a quarter of the input's {height}x{width}; "
                                       f"found {[None, *shapes[1 - head]]}")
        self.cap_words = MASK_AREAS * height * ((width + 31) // 32)
        self.tolerance, self.segment_distance = np.float64(outline_tolerance), np.int32(bool(segment_distance))
        # the coefficients stay on the device: the mask kernel reads them from the head
        super().__init__(site, layout="yolov8", input_hw=input_hw, head=head,
                         extra_rows=coefficients,
                         copied={"mask_words": ((), np.int32), "outlines": ((options.get("limit", 300), 3), np.int32),
                                 "point_used": ((), np.int32), "spilled": ((), np.int32)},
                         mapped={"masks": ((self.cap_words,), np.uint32), "points": ((OUTLINE_POINTS, 2), np.int16)},
                         **options)
        seg = np.zeros((), SEG_PARAMS)
        seg["coefficients"], seg["proto_h"], seg["proto_w"] = coefficients, proto_h, proto_w
        seg["first"], seg["cap_words"] = self.first_carried, self.cap_words
        seg["scale_x"], seg["scale_y"] = proto_w / width, proto_h / height
        self.seg_params = device.alloc(SEG_PARAMS.itemsize)
        device.cuda.memcpy_htod(self.seg_params, seg)
        self.words = device.alloc(4 * max_batch * self.cap_words)
        self.chain_cap = 6 * CHAIN_POINTS + 2 * self.limit
        self.chains = device.alloc(4 * max_batch * self.chain_cap)
        self.chain_used = device.alloc(4 * max_batch)
        self.masks = module.get_function("seg_masks")
        self.masks.prepare("PPPPPPPPP")
        self.outline = module.get_function("seg_outlines")
        self.outline.prepare("PPPPPPiPPiPPPPdi")

    def launch(self, set_index: int, batch: int, addresses: list[int], stream, sample_shape=None) -> None:
        super().launch(set_index, batch, addresses, stream, sample_shape)
        cuda, out, mapped = self.device.cuda, self.device_out[set_index], self.mapped_address[set_index]
        for counter in (out["mask_words"], out["point_used"], out["spilled"], self.chain_used):
            cuda.memset_d32_async(counter, 0, batch, stream)
        self.masks.prepared_async_call((self.limit, batch, SEG_PARTS), (SEG_THREADS, 1, 1), stream,
                                       addresses[self.head], addresses[1 - self.head], self.params, self.seg_params,
                                       out["counts"], self.kept_anchors, out["detections"], self.words,
                                       out["mask_words"])
        self.outline.prepared_async_call((self.limit, batch), (32, 1, 1), stream, self.params, self.seg_params,
                                         out["counts"], out["detections"], self.words, self.chains,
                                         np.int32(self.chain_cap), self.chain_used, mapped["points"],
                                         np.int32(OUTLINE_POINTS), out["point_used"], out["outlines"],
                                         mapped["masks"], out["spilled"], self.tolerance, self.segment_distance,
                                         shared_size=OUTLINE_SHARED_BYTES)

    def written(self, set_index: int, batch: int) -> int:
        """The outlines' points and the words of the masks handed back to be traced."""
        host = self.host_out[set_index]
        return 4 * int(np.minimum(host["point_used"][:batch], OUTLINE_POINTS).sum() + host["spilled"][:batch].sum())


class ArgmaxReducer(_Reducer):
    """Semantic segmentation: [N, C, h, w] logits -> each class's pixels inside the frame's letterboxed
    content ("counts" [N, C] int32) and the content's best class every `step` pixels ("sampled" [N, side,
    side], uint8 up to 256 classes, else uint16; the step the smallest leaving at most `side` a side), with
    where the content is on the map ("content" [N, 5]: x0, y0, x1, y1, step). About side x side bytes a frame
    instead of the map (262 KB at 512 x 512) and its host-side histogram. Until place() says otherwise, a
    frame's content is the whole map."""

    kind = "argmax"

    def __init__(self, site: ReductionSite, input_hw=None, side: int = 160, map_hw=None):
        """map_hw: the map size the task finishes by (its records' scale); an output of another size is refused."""
        outputs, module = site.outputs, site.module
        shape = outputs[0].sample_shape
        if len(shape) != 3 or not all(isinstance(d, int) and d > 0 for d in shape):
            raise ReductionUnsupported(f"argmax on the GPU reads a [N, C, h, w] output of fixed sizes; "
                                       f"{outputs[0].name} is {[None, *shape]}")
        if map_hw is not None and tuple(map_hw) != tuple(shape[1:]):
            raise ReductionUnsupported(f"argmax on the GPU: the task expects a {map_hw[0]}x{map_hw[1]} map, "
                                       f"{outputs[0].name} is {[None, *shape]}")
        self.classes, self.height, self.width = shape
        self.input_hw, self.side = tuple(input_hw or (self.height, self.width)), int(side)
        wide = self.classes > 256
        super().__init__(site, {"counts": ((self.classes,), np.int32),
                                "sampled": ((side, side), np.uint16 if wide else np.uint8),
                                "content": ((5,), np.int32)})
        whole = self._content(0, 0, self.width, self.height)
        for host in self.host_out:
            host["content"][:] = whole
        self.count = module.get_function("class_counts")
        self.count.prepare("PiiiPP")
        self.sample = module.get_function("sampled_u16" if wide else "sampled_u8")
        self.sample.prepare("PiiiPiP")

    def _content(self, x0: int, y0: int, x1: int, y1: int) -> tuple[int, ...]:
        return x0, y0, x1, y1, sampling_step(y1 - y0, x1 - x0, self.side)

    def place(self, set_index: int, letterboxes) -> None:
        """Where each frame of the next batch in this set is on the map, from its letterbox (the task's rule,
        geometry.map_content)."""
        content = self.host_out[set_index]["content"]
        for row, letterbox in enumerate(letterboxes):
            content[row] = self._content(*map_content(letterbox, self.input_hw, (self.height, self.width)))

    def launch(self, set_index: int, batch: int, addresses: list[int], stream, sample_shape=None) -> None:
        cuda, out = self.device.cuda, self.device_out[set_index]
        content = out["content"]
        cuda.memcpy_htod_async(content, self.host_out[set_index]["content"][:batch], stream)
        cuda.memset_d32_async(out["counts"], 0, batch * self.classes, stream)
        pixels, area = self.height * self.width, self.side * self.side
        self.count.prepared_async_call(((pixels + 255) // 256, batch), (256, 1, 1), stream, addresses[0],
                                       np.int32(self.classes), np.int32(self.height), np.int32(self.width), content,
                                       out["counts"], shared_size=4 * self.classes)
        self.sample.prepared_async_call(((area + 255) // 256, batch), (256, 1, 1), stream, addresses[0],
                                        np.int32(self.classes), np.int32(self.height), np.int32(self.width), content,
                                        np.int32(self.side), out["sampled"])

    def download(self, set_index: int, batch: int, stream, sample_shape=None) -> int:
        """The counts and sampled classes; "content" is the host's own (uploaded by launch)."""
        copied, views = 0, self.host(set_index, batch, sample_shape)
        for name in ("counts", "sampled"):
            self.device.cuda.memcpy_dtoh_async(views[name], self.device_out[set_index][name], stream)
            copied += views[name].nbytes
        return copied


REDUCERS = {"components": ComponentsReducer, "topk": TopKReducer, "yolo-nms": YoloReducer,
            "yolo-seg": SegmentationReducer, "argmax": ArgmaxReducer, "best-per-step": BestPerStepReducer}


def make_reducer(reduction: Reduction, device, module, max_batch: int, sets: int, outputs):
    """The reducer for `reduction` on the model's outputs (specs, in the backend's order); ReductionUnsupported
    if it does not fit."""
    if reduction.kind not in REDUCERS:
        raise ReductionUnsupported(f"no GPU postprocessing named {reduction.kind!r} "
                                   f"(there are {', '.join(REDUCERS)})")
    for output in outputs if REDUCERS[reduction.kind].reads == "all" else outputs[:1]:
        if np.dtype(output.dtype) != np.float32:
            raise ReductionUnsupported(f"GPU postprocessing reads float32 outputs; {output.name} is "
                                       f"{np.dtype(output.dtype).name}")
    return REDUCERS[reduction.kind](ReductionSite(device, module, max_batch, sets, list(outputs)),
                                    **reduction.options)
