import numpy as np
import pytest

from jetpipe.cli_values import parse_channel_values, parse_size
from jetpipe.errors import JetpipeError
from jetpipe.geometry import fit
from jetpipe.preprocess import preprocess_bgr
from jetpipe.spec import PRESETS, PreprocessSpec


def test_letterbox_geometry_maps_back_to_source():
    (nh, nw), box = fit((1080, 1920), (640, 640), "letterbox")
    assert (nh, nw) == (360, 640) and (box.pad_x, box.pad_y) == (0, 140)
    corners = np.array([[0, 140], [640, 500]], float)
    np.testing.assert_allclose(box.to_source(corners), [[0, 0], [1920, 1080]])


def test_preprocess_matches_formula_on_a_real_rendered_image():
    from jetpipe.synth import render_text_image

    image = render_text_image(3, (64, 64)).bgr
    spec = PRESETS["ppocr-det"]
    x, box = preprocess_bgr(image, (64, 64), spec)
    assert box == fit((64, 64), (64, 64), "letterbox")[1]
    expected = (image.astype(np.float32) / 255.0 - np.array(spec.mean)) / np.array(spec.std)
    np.testing.assert_allclose(x, expected.transpose(2, 0, 1), atol=1e-5)  # bgr: channel 0 = blue


def test_rgb_order_and_pad_value():
    image = np.zeros((10, 20, 3), np.uint8)
    image[..., 0] = 200  # blue
    spec = PreprocessSpec(scale=1.0, pad_value=7.0)
    x, box = preprocess_bgr(image, (20, 20), spec)
    assert box.pad_y == 5
    assert x[2, 10, 10] == 200 and x[0, 10, 10] == 0  # rgb: blue lands in channel 2
    assert x[0, 0, 0] == 7 and x[2, 19, 19] == 7


@pytest.mark.parametrize("bad, match", [
    (dict(channel_order="gbr"), "channel order 'gbr'"),
    (dict(resize="crop"), "resize 'crop'"),
    (dict(std=(1.0, 0.0, 1.0)), "contains 0"),
])
def test_bad_spec_values_are_named(bad, match):
    with pytest.raises(JetpipeError, match=match):
        PreprocessSpec(**bad)


def test_parsers():
    assert parse_size("480x640") == (480, 640)
    assert parse_channel_values("1,2,3", "mean") == (1.0, 2.0, 3.0)
    with pytest.raises(JetpipeError, match="must look like HxW"):
        parse_size("640")
    with pytest.raises(JetpipeError, match="--mean '1,2' must be three"):
        parse_channel_values("1,2", "mean")


@pytest.mark.parametrize("fmt", ["nv12", "i420", "yuyv", "uyvy", "bgr", "rgb"])
def test_fast_cpu_path_stays_within_one_step_of_the_reference(fmt):
    from jetpipe.frames import from_bgr
    from jetpipe.geometry import affine
    from jetpipe.preprocess import preprocess_frame, preprocess_frame_fast
    from jetpipe.synth import render_text_image

    frame = from_bgr(render_text_image(7, (240, 320)).bgr, fmt)
    spec = PRESETS["ppocr-det"]
    fast, box_fast = preprocess_frame_fast(frame, fmt, (128, 128), spec)
    exact, box_exact = preprocess_frame(frame, fmt, (128, 128), spec)
    assert box_fast == box_exact
    one_step = float(np.max(affine(spec)[0]))
    diff = np.abs(fast - exact)
    assert diff.max() <= 1.5 * one_step  # OpenCV rounds to uint8 twice: decode, then resize
    assert diff.mean() <= 0.25 * one_step


@pytest.mark.parametrize("fmt", ["nv12", "i420", "yuyv", "uyvy"])
@pytest.mark.parametrize("standard, value_range", [("bt709", "limited"), ("bt601", "full")])
def test_fast_cpu_path_for_hd_video_standards_stays_close_to_the_reference(fmt, standard, value_range):
    """BT.709 / full range (which OpenCV's decoders lack): planes resized first, then converted."""
    from jetpipe.frames import ColourMatrix, from_bgr
    from jetpipe.geometry import affine
    from jetpipe.preprocess import preprocess_frame, preprocess_frame_fast
    from jetpipe.synth import render_text_image

    matrix = ColourMatrix.of(standard, value_range)
    frame = from_bgr(render_text_image(7, (720, 1280)).bgr, fmt, matrix)
    spec = PRESETS["ppocr-det"]
    fast, box_fast = preprocess_frame_fast(frame, fmt, (320, 320), spec, matrix)
    exact, box_exact = preprocess_frame(frame, fmt, (320, 320), spec, matrix)
    assert box_fast == box_exact
    steps = np.abs(fast - exact) / float(np.max(affine(spec)[0]))
    assert steps.mean() <= 0.5 and np.percentile(steps, 99) <= 3.0  # rounding and chroma siting at edges


def test_a_quads_homography_maps_the_contents_corners_onto_its_corners():
    """Tilted, perspective and upright quads (the closed form, and its parallelogram case): the content's
    corners (0, 0), (w, 0), (w, h), (0, h) land on the quad's corners, relative to the region's origin."""
    from jetpipe.geometry import quad_homography, quad_region

    rng = np.random.default_rng(3)
    quads = [((10.0, 20.0), (210.0, 20.0), (210.0, 70.0), (10.0, 70.0)),  # upright
             ((50.0, 80.0), (250.0, 120.0), (240.0, 170.0), (40.0, 130.0))]  # parallelogram
    for _ in range(50):
        corners = np.array([[0, 0], [300, 0], [300, 60], [0, 60]]) + rng.normal(0, 12, (4, 2)) + [400, 300]
        quads.append(tuple(map(tuple, corners.tolist())))
    for quad in quads:
        origin = quad_region(quad, 1080, 1920)[:2]
        h, w = 48, 240
        H = quad_homography(quad, (h, w), origin)
        for (u, v), (x, y) in zip([(0, 0), (w, 0), (w, h), (0, h)], quad):
            px, py, pw = H @ [u, v, 1.0]
            np.testing.assert_allclose([px / pw, py / pw], [x - origin[0], y - origin[1]], atol=1e-9)
