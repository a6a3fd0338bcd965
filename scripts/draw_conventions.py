#!/usr/bin/env python3
"""Draws docs/images/conventions.png: which way a line's "in" is, and what a heading is (docs/serve.md).

  python scripts/draw_conventions.py [OUT.png]

Left: a line drawn from its first point to its second (top to bottom here); walking along it, the right-hand
side is on the picture's left; an object crossing from the right-hand side to the left-hand side is "in" (the
events engine's rule, pipelines/core/events/engine.py). Right: the ground plane of a [[calibration]]: the x and
y axes are the ones the `world` points were measured in; heading_deg is the angle of the track's motion from x
towards y, speed_kmh its length.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import cv2
import numpy as np

INK, SOFT, BLUE, RED, GREEN = (40, 40, 40), (235, 235, 235), (200, 110, 30), (40, 40, 200), (40, 150, 40)


def text(image, words: str, at, colour=INK, scale=0.55) -> None:
    cv2.putText(image, words, at, cv2.FONT_HERSHEY_SIMPLEX, scale, colour, 1, cv2.LINE_AA)


def line_panel(image) -> None:
    x0, y0, x1, y1 = 20, 40, 440, 400
    cv2.rectangle(image, (x0, y0), ((x0 + x1) // 2, y1), (250, 232, 215), -1)   # the right-hand side
    cv2.rectangle(image, (x0, y0), (x1, y1), INK, 1)
    text(image, "a line: first point -> second point", (x0, 28))
    mid = (x0 + x1) // 2
    cv2.arrowedLine(image, (mid, y0 + 20), (mid, y1 - 20), BLUE, 3, cv2.LINE_AA, tipLength=0.05)
    text(image, "first", (mid + 8, y0 + 28), BLUE)
    text(image, "second", (mid + 8, y1 - 20), BLUE)
    text(image, "right-hand side", (x0 + 20, y0 + 70))
    text(image, "left-hand side", (mid + 50, y0 + 70))
    cv2.arrowedLine(image, (x0 + 60, 200), (x1 - 60, 200), GREEN, 2, cv2.LINE_AA, tipLength=0.04)
    text(image, "\"in\"", (mid + 70, 190), GREEN)
    cv2.arrowedLine(image, (x1 - 60, 300), (x0 + 60, 300), RED, 2, cv2.LINE_AA, tipLength=0.04)
    text(image, "\"out\"", (x0 + 70, 290), RED)
    text(image, "(walking from first to second point)", (x0 + 20, y1 - 45), INK, 0.45)


def ground_panel(image) -> None:
    x0, y0, x1, y1 = 480, 40, 900, 400
    cv2.rectangle(image, (x0, y0), (x1, y1), INK, 1)
    text(image, "the ground plane ([[calibration]] world)", (x0, 28))
    origin = (x0 + 70, y1 - 70)
    cv2.arrowedLine(image, origin, (x1 - 40, origin[1]), INK, 2, cv2.LINE_AA, tipLength=0.03)
    cv2.arrowedLine(image, origin, (origin[0], y0 + 40), INK, 2, cv2.LINE_AA, tipLength=0.03)
    text(image, "x (m)", (x1 - 80, origin[1] + 25))
    text(image, "y (m)", (origin[0] - 60, y0 + 50))
    angle = math.radians(35)
    tip = (int(origin[0] + 240 * math.cos(angle)), int(origin[1] - 240 * math.sin(angle)))
    cv2.arrowedLine(image, origin, tip, GREEN, 3, cv2.LINE_AA, tipLength=0.06)
    cv2.ellipse(image, origin, (90, 90), 0, -35, 0, BLUE, 2, cv2.LINE_AA)
    text(image, "heading_deg = 35", (origin[0] + 100, origin[1] - 20), BLUE)
    text(image, "speed_kmh = the arrow's length", (tip[0] - 200, tip[1] - 15), GREEN)
    text(image, "from x towards y, 0-360 (none below 1 km/h)", (x0 + 20, y1 - 20), INK, 0.45)


def main() -> None:
    default = Path(__file__).resolve().parents[1] / "docs/images/conventions.png"
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    image = np.full((420, 920, 3), 255, np.uint8)
    line_panel(image)
    ground_panel(image)
    out.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(out), image)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
