"""semantic-segmentation: class maps from [N, C, h, w] logits, against a reference written here from the layout
(one class per pixel = argmax over C, shares over the letterboxed content only), regions and their outlines,
recognition, metric, drawing."""

import numpy as np
import pytest

from jetpipe.geometry import Letterbox, fit
from jetpipe.pipelines.outputs.annotate import draw
from jetpipe.tasks import ModelFacts, TaskOptions, detect, get
from jetpipe.tasks.segmentation_yolo import polygon_mask

IDENTITY = Letterbox(1.0, 1.0, 0, 0)


def _logits(class_map: np.ndarray, classes: int = 6) -> np.ndarray:
    """[1, C, h, w] logits whose argmax is `class_map` (noise below the margin)."""
    rng = np.random.default_rng(0)
    logits = rng.uniform(-1, 1, (classes, *class_map.shape)).astype(np.float32)
    np.put_along_axis(logits, class_map[None].astype(np.int64), 5.0, axis=0)
    return logits[None]


def _scene(height=64, width=64):
    scene = np.zeros((height, width), np.int64)
    scene[8:24, 8:40] = 3    # 16 x 32
    scene[40:60, 30:50] = 5  # 20 x 20
    scene[2:4, 60:62] = 2    # 4 pixels: counted, too small to outline
    return scene


def test_shares_and_regions_at_the_inputs_size():
    post = get("semantic-segmentation").postprocessor(TaskOptions((64, 64), ("bg", "a", "b", "c", "d", "e")))
    result = post({"out": _logits(_scene())}, [IDENTITY], [(64, 64)])[0]
    counts = {name: n for name, n in zip(("bg", "c", "e", "b"), (64 * 64 - 512 - 400 - 4, 512, 400, 4))}
    assert list(result["class_shares"]) == ["bg", "c", "e", "b"]  # largest first
    for name, count in counts.items():
        assert result["class_shares"][name] == pytest.approx(count / 4096, abs=1e-5)
    outlined = {r["label"]: r for r in result["regions"]}
    assert set(outlined) == {"bg", "c", "e"}  # b's 4 pixels are below the minimum share
    assert outlined["c"]["area"] == 512 and outlined["e"]["area"] == 400 and outlined["c"]["class"] == 3
    truth = _scene() == 3
    drawn = polygon_mask(outlined["c"]["polygon"], (64, 64))
    assert (drawn & truth).sum() / (drawn | truth).sum() > 0.95


def test_a_quarter_size_map_and_a_letterbox_map_back_to_the_source():
    """The map at 1/4 of a 256x256 input of a 512x256 (wide) frame: content rows 64..191 of the input."""
    scene = np.zeros((64, 64), np.int64)
    scene[16:48, 8:24] = 4  # in the content (map rows 16..47 hold it)
    letterbox = fit((256, 512), (256, 256), "letterbox")[1]
    post = get("semantic-segmentation").postprocessor(TaskOptions((256, 256), None))
    result = post({"out": _logits(scene)}, [letterbox], [(256, 512)])[0]
    # shares are of the content only: the map's rows 16..47 (32 x 64 map pixels), class 4 a quarter of them
    assert result["class_shares"]["4"] == pytest.approx(0.25, abs=1e-5)
    region = next(r for r in result["regions"] if r["class"] == 4)
    xs, ys = np.asarray(region["polygon"]).T
    # map pixel x 8..23 -> input 32..95 -> source 64..190; map rows 16..47 -> input 64..191 -> source 0..254
    assert xs.min() == pytest.approx(64 + 3, abs=4) and xs.max() == pytest.approx(190 - 3, abs=4)
    assert ys.min() == pytest.approx(3, abs=4) and ys.max() == pytest.approx(254 - 3, abs=4)
    assert region["area"] == pytest.approx(32 * 16 * 16 * 4, rel=1e-6)  # map px -> input px (x16) -> source (x4)


def test_recognized_by_the_maps_size_and_classes():
    def facts(*shape):
        return ModelFacts((("out", shape),), (320, 320), {})

    assert detect(facts("N", 21, 320, 320))[0].name == "semantic-segmentation"  # LRASPP / DeepLab: input size
    assert detect(facts("N", 19, 80, 80))[0].name == "semantic-segmentation"    # a 1/4 map
    assert detect(facts("N", 1, 320, 320))[0].name == "text-detection"          # one channel: a DB map
    assert detect(facts("N", 21, 100, 100))[0].name == "raw"                   # not a fraction of the input
    assert detect(facts("N", 21, "h", "w"))[0].name == "raw"                   # sizes unknown: not picked unasked


def test_the_metric_sees_pixels_change():
    scene = _scene()
    moved = scene.copy()
    moved[8:24, 8:40] = 0
    moved[8:24, 12:44] = 3  # the region shifted 4 px
    task, options = get("semantic-segmentation"), TaskOptions((64, 64))
    same = task.metric([_logits(scene)], [_logits(scene)], options)
    assert same == {"pixel_agreement": 1.0, "miou": 1.0}
    shifted = task.metric([_logits(scene)], [_logits(moved)], options)
    assert shifted["pixel_agreement"] == pytest.approx(1 - 128 / 4096)
    assert shifted["miou"] < 0.95


def test_regions_are_filled_in_their_class_colour():
    image = np.zeros((100, 100, 3), np.uint8)
    square = [[20, 20], [80, 20], [80, 80], [20, 80]]
    draw(image, {"class_shares": {"3": 0.36}, "regions": [{"class": 3, "label": "3", "polygon": square,
                                                          "area": 3600.0}]}, (100, 100))
    assert image[60, 50].any() and not image[95, 50].any()


def test_regions_of_a_large_map_are_traced_on_it_sampled():
    """A 512 x 512 map is traced every 4th pixel (at most 160 a side): the outlines still go around the
    regions within a sampled pixel, areas within a sampled row, shares counted on every pixel."""
    scene = np.zeros((512, 512), np.int64)
    scene[64:192, 32:320] = 3    # 128 x 288
    scene[300:500, 250:450] = 5  # 200 x 200
    scene[10:13, 500:503] = 2    # 9 pixels: counted, not outlined
    post = get("semantic-segmentation").postprocessor(TaskOptions((512, 512), None))
    result = post({"out": _logits(scene)}, [IDENTITY], [(512, 512)])[0]
    assert result["class_shares"]["2"] == pytest.approx(9 / 512**2, abs=1e-5)
    regions = {r["class"]: r for r in result["regions"]}
    assert set(regions) == {0, 3, 5}
    for cls, area in ((3, 128 * 288), (5, 200 * 200)):
        truth = scene == cls
        drawn = polygon_mask(regions[cls]["polygon"], (512, 512))
        assert (drawn & truth).sum() / (drawn | truth).sum() > 0.95
        assert regions[cls]["area"] == pytest.approx(area, rel=0.03)
    assert max(len(r["polygon"]) for r in result["regions"]) < 40  # rectangles stay a few points


def reduction_arrays(logits: np.ndarray, letterboxes, input_hw, side: int = 160) -> dict:
    """What the argmax reduction hands back, written here from its documented layout: each class's pixels
    inside a frame's letterboxed content, where the content is on the map (x0, y0, x1, y1, step) and the
    content's classes every step pixels from step // 2 in a side x side array (0 past them)."""
    best = logits.argmax(axis=1)
    counts = np.zeros((len(best), logits.shape[1]), np.int32)
    sampled = np.zeros((len(best), side, side), np.uint8 if logits.shape[1] <= 256 else np.uint16)
    content = np.zeros((len(best), 5), np.int32)
    for i, (frame, box) in enumerate(zip(best, letterboxes)):
        scale = frame.shape[1] / input_hw[1]
        x0, y0 = round(box.pad_x * scale), round(box.pad_y * scale)
        x1 = max(x0 + 1, round(box.pad_x * scale + (input_hw[1] - 2 * box.pad_x) * scale))
        y1 = max(y0 + 1, round(box.pad_y * scale + (input_hw[0] - 2 * box.pad_y) * scale))
        step = -(-max(y1 - y0, x1 - x0) // side)
        inside = frame[y0:y1, x0:x1]
        counts[i] = np.bincount(inside.ravel(), minlength=logits.shape[1])
        read = inside[step // 2::step, step // 2::step]
        sampled[i, :read.shape[0], :read.shape[1]] = read
        content[i] = x0, y0, x1, y1, step
    return {"counts": counts, "sampled": sampled, "content": content}


@pytest.mark.parametrize("map_scale, side", [(1, 160), (2, 160), (1, 20)])
def test_the_gpu_reduction_is_finished_as_the_cpu_path(map_scale, side, monkeypatch):
    """reduced() on what the argmax reduction hands back (class counts over the content, the content sampled)
    gives the CPU path's records: a map at the input's size and at half of it, and one read every few pixels."""
    from jetpipe.tasks import semantic_segmentation

    monkeypatch.setattr(semantic_segmentation, "OUTLINE_SIDE", side)
    scene = _scene()[::map_scale, ::map_scale]
    logits = _logits(scene)
    options = TaskOptions((64, 64), None, outputs=(("out", (None, 6, *scene.shape)),))
    post = get("semantic-segmentation").postprocessor(options)
    letterbox = fit((48, 64), (64, 64), "letterbox")[1]
    cpu = post({"out": logits}, [letterbox], [(48, 64)])
    gpu = post.reduced(reduction_arrays(logits, [letterbox], (64, 64), side), [letterbox], [(48, 64)])
    assert gpu == cpu and cpu[0]["regions"]
    assert post.reduction().options == {"input_hw": (64, 64), "side": side, "map_hw": scene.shape}




@pytest.mark.parametrize("dtype, classes", [(np.uint8, 21), (np.uint8, 256), (np.uint16, 300)])
def test_class_counts_of_a_view_of_the_map(dtype, classes):
    """Pixels of each class in the letterboxed part of a map (a strided view), one and two bytes a pixel."""
    from jetpipe.tasks.semantic_segmentation import class_counts

    best = np.random.default_rng(classes).integers(0, classes, (64, 80)).astype(dtype)
    inside = best[5:59, 3:77]
    counts = class_counts(inside)
    expected = np.bincount(inside.ravel().astype(np.int64), minlength=classes)
    np.testing.assert_array_equal(counts[:classes], expected)
    assert not counts[classes:].any() and counts.dtype == np.int64
