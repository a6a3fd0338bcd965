"""Rendered-text images: the project's own real data, made offline.

Words in Pillow's built-in scalable font (or, asked, in several typefaces) over
textured backgrounds, with the word boxes returned, so detection can be checked
against known positions. Used as the default calibration set, by the synthetic
camera and by the tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from jetpipe.lazy import lazy_import

cv2 = lazy_import("cv2")

_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "ta", "vo", "shi", "ber", "don", "gen", "pla",
              "qu", "str", "ix", "on", "em", "ar", "ul", "zy")


# Typefaces that ship with a dependency, so that every machine renders the same text: Pillow's own (None) and
# matplotlib's DejaVu (sans, serif, mono) and STIX, in regular, bold and italic.
SEVERAL_FONTS = (None, "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSerif-Italic.ttf",
                 "DejaVuSansMono.ttf", "STIXGeneral.ttf", "STIXGeneralBolIta.ttf")


def several_fonts() -> tuple[Path | None, ...]:
    """SEVERAL_FONTS as paths (None: Pillow's built-in font). Found where matplotlib is installed, without
    importing it (slow, and older releases warn on import against a newer pyparsing)."""
    import importlib.util

    spec = importlib.util.find_spec("matplotlib")
    folder = Path(next(iter(spec.submodule_search_locations))) / "mpl-data" / "fonts" / "ttf"
    return tuple(None if name is None else folder / name for name in SEVERAL_FONTS)


def pick_font(rng: np.random.Generator, fonts, size: int):
    """Pillow's built-in font at `size`, or one of `fonts` drawn by rng (drawn only where fonts are given, so
    that the images rendered without them stay what they were). A font object a word, not shared: synthetic
    cameras render in threads of their own, and a FreeType face is not safe to share between them."""
    path = fonts[int(rng.integers(len(fonts)))] if fonts else None
    return ImageFont.load_default(size=size) if path is None else ImageFont.truetype(str(path), size)


@dataclass
class TextImage:
    bgr: np.ndarray                     # H x W x 3 uint8
    boxes: list[tuple[int, int, int, int]] = field(default_factory=list)  # x0, y0, x1, y1
    words: list[str] = field(default_factory=list)


def random_word(rng: np.random.Generator) -> str:
    word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.integers(1, 4)))
    if rng.random() < 0.3:
        word = word.upper()
    if rng.random() < 0.2:
        word += str(rng.integers(0, 1000))
    return word


def background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A smooth two-colour gradient with sensor-like noise."""
    c0, c1 = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    t = np.linspace(0.0, 1.0, w if rng.random() < 0.5 else h, dtype=np.float32)
    ramp = c0[None, :] * (1 - t[:, None]) + c1[None, :] * t[:, None]
    img = np.broadcast_to(ramp[None] if ramp.shape[0] == w else ramp[:, None], (h, w, 3)).copy()
    img += rng.normal(0, rng.uniform(1, 8), img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def _contrasting(rng: np.random.Generator, bg: np.ndarray) -> tuple[int, int, int]:
    luma = float(bg.mean())
    base = rng.integers(0, 70, 3) if luma > 128 else rng.integers(185, 256, 3)
    return tuple(int(v) for v in base)


def render_text_image(seed: int, size_hw: tuple[int, int] = (480, 640), max_words: int = 12,
                      fonts=None) -> TextImage:
    """Render one image: words that never overlap, each with its box in pixel units. fonts: typefaces a word
    is drawn in, one at random (several_fonts()); default Pillow's built-in."""
    rng = np.random.default_rng(seed)
    h, w = size_hw
    canvas = Image.fromarray(background(rng, h, w))
    draw = ImageDraw.Draw(canvas)
    result = TextImage(bgr=np.empty(0))
    taken = np.zeros((h, w), bool)
    for _ in range(int(rng.integers(max(1, max_words // 3), max_words + 1))):
        word = random_word(rng)
        font = pick_font(rng, fonts, int(rng.integers(max(12, h // 40), max(20, h // 9))))
        x0, y0, x1, y1 = draw.textbbox((0, 0), word, font=font)
        tw, th = x1 - x0, y1 - y0
        if tw >= w - 8 or th >= h - 8:
            continue
        x, y = int(rng.integers(4, w - tw - 4)), int(rng.integers(4, h - th - 4))
        box = (x, y, x + tw, y + th)
        if taken[max(0, y - 6):y + th + 6, max(0, x - 6):x + tw + 6].any():
            continue
        region = np.asarray(canvas)[y:y + th, x:x + tw]
        draw.text((x - x0, y - y0), word, font=font, fill=_contrasting(rng, region))
        taken[y:y + th, x:x + tw] = True
        result.boxes.append(box)
        result.words.append(word)
    result.bgr = np.ascontiguousarray(np.asarray(canvas)[:, :, ::-1])
    return result


def render_tilted_words(seed: int, size_hw: tuple[int, int] = (720, 1280), count: int = 8,
                        degrees: tuple[float, float] = (8.0, 25.0), words: tuple[int, int] = (1, 2),
                        fonts=None) -> TextImage:
    """Lines of words[0] to words[1] words, each turned by an angle between degrees[0] and degrees[1]
    (either way), never overlapping: boxes are the turned lines' bounding boxes. fonts: as render_text_image."""
    rng = np.random.default_rng(seed)
    h, w = size_hw
    canvas = Image.fromarray(background(rng, h, w))
    result = TextImage(bgr=np.empty(0))
    taken = np.zeros((h, w), bool)
    for _ in range(count * 4):
        if len(result.words) == count:
            break
        word = " ".join(random_word(rng) for _ in range(int(rng.integers(words[0], words[1] + 1))))
        font = pick_font(rng, fonts, int(rng.integers(max(16, h // 30), max(24, h // 14))))
        x0, y0, x1, y1 = ImageDraw.Draw(canvas).textbbox((0, 0), word, font=font)
        pad = 6
        glyphs = Image.new("L", (x1 - x0 + 2 * pad, y1 - y0 + 2 * pad), 0)
        ImageDraw.Draw(glyphs).text((pad - x0, pad - y0), word, font=font, fill=255)
        angle = float(rng.uniform(*degrees)) * (1 if rng.random() < 0.5 else -1)
        mask = glyphs.rotate(angle, resample=Image.BICUBIC, expand=True)
        mw, mh = mask.size
        if mw >= w - 8 or mh >= h - 8:
            continue
        x, y = int(rng.integers(4, w - mw - 4)), int(rng.integers(4, h - mh - 4))
        if taken[y:y + mh, x:x + mw].any():
            continue
        colour = _contrasting(rng, np.asarray(canvas)[y:y + mh, x:x + mw])
        canvas.paste(Image.new("RGB", mask.size, colour), (x, y), mask)
        taken[y:y + mh, x:x + mw] = True
        result.boxes.append((x, y, x + mw, y + mh))
        result.words.append(word)
    result.bgr = np.ascontiguousarray(np.asarray(canvas)[:, :, ::-1])
    return result


def render_text_line(seed: int, size_hw: tuple[int, int] = (48, 320), fonts=None) -> TextImage:
    """One text-line crop, as a recognizer sees it: a few words on one line filling the height, left-aligned
    with a small margin (the words past the right edge are dropped). fonts: the line's typeface is one of
    them at random (several_fonts()); default Pillow's built-in."""
    rng = np.random.default_rng(seed)
    h, w = size_hw
    canvas = Image.fromarray(background(rng, h, w))
    draw = ImageDraw.Draw(canvas)
    font = pick_font(rng, fonts, max(8, int(h * rng.uniform(0.55, 0.8))))
    words, x = [], int(rng.integers(1, max(2, w // 20)))
    while True:
        word = random_word(rng)
        x0, y0, x1, y1 = draw.textbbox((0, 0), word, font=font)
        if x + (x1 - x0) > w - 2:
            break
        words.append((word, x, x0, y0, x1, y1))
        x += (x1 - x0) + int(font.size * rng.uniform(0.3, 0.6))
    result = TextImage(bgr=np.empty(0))
    color = _contrasting(rng, np.asarray(canvas))
    for word, x, x0, y0, x1, y1 in words:
        y = (h - (y1 - y0)) // 2
        draw.text((x - x0, y - y0), word, font=font, fill=color)
        result.boxes.append((x, y, x + x1 - x0, y + y1 - y0))
        result.words.append(word)
    result.bgr = np.ascontiguousarray(np.asarray(canvas)[:, :, ::-1])
    return result


def is_line_shaped(size_hw: tuple[int, int]) -> bool:
    """A text-line recognizer's input: short (<= 64 px) and at least three times as wide as high."""
    return size_hw[0] <= 64 and size_hw[1] >= 3 * size_hw[0]


def write_text_images(folder, count: int, seed: int = 0, size_hw: tuple[int, int] = (480, 640)):
    """Write `count` PNG images to `folder` (a calibration set on disk)."""

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        cv2.imwrite(str(folder / f"text_{seed + i:05d}.png"), render_text_image(seed + i, size_hw).bgr)
    return folder
