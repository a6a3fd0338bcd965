"""Rendered text in several typefaces (issue 25's accuracy video: "several fonts and sizes")."""

import numpy as np
from PIL import ImageFont

from jetpipe.synth import SEVERAL_FONTS, render_text_image, several_fonts


def test_every_typeface_of_several_fonts_ships_with_a_dependency_and_draws_letters():
    fonts = several_fonts()
    assert len(fonts) == len(SEVERAL_FONTS) >= 6
    for path in fonts:
        font = ImageFont.load_default(size=32) if path is None else ImageFont.truetype(str(path), 32)
        x0, y0, x1, y1 = font.getbbox("Kalo42")
        assert x1 - x0 > 40 and y1 - y0 > 15, path


def test_the_words_of_a_video_in_several_fonts_are_drawn_in_each_of_them():
    from jetpipe.synth import pick_font

    rng = np.random.default_rng(50_000)
    drawn = {pick_font(rng, several_fonts(), 24).getname() for _ in range(64)}
    assert len(drawn) == len(SEVERAL_FONTS), drawn  # Aileron, DejaVu Sans / Serif / Mono, STIX: styles apart
    images = [render_text_image(50_000 + i, (720, 1280), 14, fonts=several_fonts()) for i in range(3)]
    assert all(len(image.words) == len(image.boxes) > 0 for image in images)
