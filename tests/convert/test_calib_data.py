import cv2
import numpy as np
import pytest

from jetpipe.convert.calib_data import ImageFolder, SyntheticText, VideoFile, open_source
from jetpipe.errors import CalibrationError
from jetpipe.spec import PreprocessSpec
from jetpipe.synth import render_text_image, write_text_images


def _video(path, frames=12, size=(48, 64)):
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (size[1], size[0]))
    assert writer.isOpened()
    for i in range(frames):
        writer.write(render_text_image(i, size).bgr)
    writer.release()
    return path


def test_video_frames_spread_evenly(tmp_path):
    source = open_source(str(_video(tmp_path / "clip.avi")), (1, 3, 32, 32), (32, 32), PreprocessSpec(), 4)
    assert isinstance(source, VideoFile) and len(source) == 4
    batches = list(source.batches(3))
    assert [len(b) for b in batches] == [3, 1]
    assert batches[0].shape[1:] == (3, 32, 32) and batches[0].dtype == np.float32


def test_fingerprint_follows_content_selection_and_preprocessing(tmp_path):
    folder = write_text_images(tmp_path / "imgs", 3, size_hw=(32, 32))
    spec = PreprocessSpec()
    base = ImageFolder(folder, (16, 16), spec, 3).fingerprint()
    assert ImageFolder(folder, (16, 16), spec, 3).fingerprint() == base
    assert ImageFolder(folder, (16, 16), spec, 2).fingerprint() != base
    assert ImageFolder(folder, (16, 16), spec.replace(channel_order="bgr"), 3).fingerprint() != base
    first = sorted(folder.iterdir())[0]
    cv2.imwrite(str(first), render_text_image(99, (32, 32)).bgr)
    assert ImageFolder(folder, (16, 16), spec, 3).fingerprint() != base


def test_synthetic_source_and_bad_inputs(tmp_path):
    source = open_source("synthetic", (1, 3, 32, 32), (32, 32), PreprocessSpec(), 3)
    assert isinstance(source, SyntheticText) and sum(len(b) for b in source.batches(2)) == 3
    (tmp_path / "empty").mkdir()
    with pytest.raises(CalibrationError, match="holds no images"):
        open_source(str(tmp_path / "empty"), (1, 3, 8, 8), (8, 8), PreprocessSpec(), 3)
    with pytest.raises(CalibrationError, match="--calib-size 0 must be at least 1"):
        open_source("synthetic", (1, 3, 8, 8), (8, 8), PreprocessSpec(), 0)
    (tmp_path / "broken.mp4").write_bytes(b"nope")
    with pytest.raises(CalibrationError, match="cannot read video"):
        open_source(str(tmp_path / "broken.mp4"), (1, 3, 8, 8), (8, 8), PreprocessSpec(), 3)


@pytest.mark.parametrize("kind", ["images", "video", "synthetic"])
def test_every_sample_is_handed_out_once_and_kept(tmp_path, kind):
    """A consumer may keep every batch it was given (calibrate accuracy concatenates them): no batch may be
    overwritten by the next one. With a reused buffer every batch held the last images."""
    size = (32, 32)
    data = {"images": lambda: str(write_text_images(tmp_path / "imgs", 7, size_hw=size)),
            "video": lambda: str(_video(tmp_path / "clip.avi", frames=7, size=size)),
            "synthetic": lambda: "synthetic"}[kind]()
    source = open_source(data, (1, 3, *size), size, PreprocessSpec(), 7)
    kept = np.concatenate(list(source.batches(2)))
    assert len(kept) == 7
    distinct = {sample.tobytes() for sample in kept}
    assert len(distinct) == 7, f"{7 - len(distinct)} samples repeated"
    first_alone = next(source.batches(1))[0]
    np.testing.assert_array_equal(kept[0], first_alone)


def test_calibration_tensors_with_nan_are_refused_naming_the_sample(tmp_path, capsys):
    from jetpipe.cli import main
    from tests.helpers import residual_cnn, save

    model = save(residual_cnn(batch=1), tmp_path / "tiny.onnx")
    tensors = np.random.default_rng(0).random((4, 3, 16, 16), dtype=np.float32)
    tensors[2, 1, 5, 5] = np.nan
    np.save(tmp_path / "calib.npy", tensors)
    out = tmp_path / "b"
    assert main(["convert", model, "-o", str(out), "--precision", "int8", "--calib", str(tmp_path / "calib.npy"),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "calib.npy: sample 2 holds NaN or infinite values" in err and "Traceback" not in err
    assert not out.exists()


def test_a_recognizers_synthetic_lines_are_drawn_in_several_typefaces_and_scene_text_is_unchanged():
    """Calibrated on lines in Pillow's one font, PP-OCRv4 rec in INT8 read 7.5 points fewer words of tilted lines
    in other typefaces (docs/lab/benchmarks.md): its calibration lines now come in several."""
    from jetpipe.synth import render_text_line, several_fonts

    spec = PreprocessSpec()
    lines = SyntheticText((48, 320), spec, 16)
    default_font = [render_text_line(lines.seed + i, (48, 320)).bgr for i in range(16)]
    several = [render_text_line(lines.seed + i, (48, 320), fonts=several_fonts()).bgr for i in range(16)]
    drawn = list(lines.frames())
    assert all(np.array_equal(a, b) for a, b in zip(drawn, several))
    assert sum(not np.array_equal(a, b) for a, b in zip(drawn, default_font)) >= 8
    scenes = SyntheticText((64, 96), spec, 2)
    assert all(np.array_equal(a, render_text_image(scenes.seed + i, (64, 96)).bgr)
               for i, a in enumerate(scenes.frames()))
