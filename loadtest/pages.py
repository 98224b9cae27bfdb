"""Generated pages of known English text and numbers, for the OCR tests and the load test.

``pages(count)`` returns ``count`` pages, the same bytes on every call with the same Pillow
(a seeded ``random.Random`` per page, no clock): each a ``Page`` with the encoded image (PNG or
JPEG), its format, its size, and the text lines drawn on it, top to bottom. Across the pages:
six DejaVu faces (sans, serif, mono, each regular and bold) at 18 to 44 px, dark text on
light backgrounds and light text on dark ones, a small rotation of the whole page (up to 3
degrees either way, on every third page), Gaussian pixel noise (on every other page), JPEG at
quality 35 to 95 or PNG, and page sizes from 640x480 to 1600x1200.

The fonts are Debian's DejaVu TrueType files in /usr/share/fonts/truetype/dejavu/, from Debian's
``fonts-dejavu-core`` (a fresh CI machine needs it); ``fonts()`` fails naming the package when
one is missing. The bytes also depend on Pillow's drawing and encoders (and FreeType's
rendering), so a reference answer is kept only by the pages' bytes (tests/support/paddlex_reference.py),
never by their numbers.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
#: The six faces of Debian's fonts-dejavu-core (the oblique, italic and condensed ones are in
#: fonts-dejavu-extra, which a CI machine may lack: left out, so every machine draws the same pages).
FACES = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSans-Bold.ttf",
         "DejaVuSerif-Bold.ttf", "DejaVuSansMono-Bold.ttf")

SIZES = ((640, 480), (800, 600), (1024, 768), (1280, 960), (1600, 1200), (1200, 800), (900, 1200))

WORDS = ("invoice", "total", "amount", "paid", "order", "number", "date", "customer", "account",
         "balance", "delivery", "address", "street", "north", "river", "garden", "station", "market",
         "price", "quantity", "weight", "model", "serial", "report", "summary", "review", "office",
         "Monday", "Friday", "March", "October", "London", "Berlin", "Paris", "Tokyo", "Oslo",
         "The", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Alpha", "Beta", "Gamma")

#: (text colour, background colour) pairs: dark on light, coloured, and light on dark.
COLOURS = (((0, 0, 0), (255, 255, 255)), ((20, 20, 120), (250, 248, 235)), ((120, 10, 10), (235, 240, 250)),
           ((10, 90, 30), (255, 255, 240)), ((255, 255, 255), (30, 30, 40)), ((250, 230, 120), (20, 60, 110)),
           ((60, 60, 60), (210, 210, 210)))


@dataclass(frozen=True)
class Page:
    data: bytes              # the encoded image
    format: str              # "PNG" or "JPEG"
    size: tuple[int, int]    # width, height
    lines: tuple[str, ...]   # the text drawn, top to bottom
    font: str                # the font file's name
    font_size: int
    angle: float             # degrees, counter-clockwise
    noise: float             # the Gaussian noise's standard deviation, in 0..255 levels
    quality: int | None      # JPEG quality, None for PNG
    turned: tuple[int, ...] = ()  # the lines (indices into lines) drawn turned 180 degrees


class FontsMissing(RuntimeError):
    pass


def fonts() -> list[Path]:
    missing = [f for f in FACES if not (FONT_DIR / f).is_file()]
    if missing:
        raise FontsMissing(f"the test pages need Debian's DejaVu fonts ({', '.join(missing)} in {FONT_DIR}): "
                           "apt-get install fonts-dejavu-core")
    return [FONT_DIR / f for f in FACES]


def _line(rng: random.Random) -> str:
    kind = rng.randrange(4)
    words = [rng.choice(WORDS) for _ in range(rng.randint(2, 5))]
    if kind == 0:
        words.append(str(rng.randint(10, 99999)))
    elif kind == 1:
        words.insert(rng.randrange(len(words) + 1), f"{rng.randint(1, 9999)}.{rng.randint(0, 99):02d}")
    elif kind == 2:
        words = [f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/{rng.randint(1990, 2030)}"] + words[:3]
    return " ".join(words)


def page(index: int, upside_down: int = 0) -> Page:
    """Page ``index``, the same bytes on every call. With ``upside_down`` n, every n-th line (the
    first among them) is drawn turned 180 degrees in its place, as on a page put in the scanner
    with a slip the wrong way round: the text-line orientation tests' pages."""
    rng = random.Random(4400 + index)
    faces = fonts()
    face = faces[index % len(faces)]
    width, height = SIZES[index % len(SIZES)]
    font_size = rng.choice((18, 22, 26, 30, 36, 44))
    font_size = max(font_size, height // 40)  # a large page at 18 px is mostly blank
    fg, bg = COLOURS[(3 * index) % len(COLOURS)]
    font = ImageFont.truetype(str(face), font_size)

    image = Image.new("RGB", (width, height), bg)
    draw = ImageDraw.Draw(image)
    margin = width // 12
    gap = int(font_size * rng.uniform(1.6, 2.4))
    y = height // 10
    lines = []
    while y + font_size < height - height // 10 and len(lines) < 12:
        text = _line(rng)
        while draw.textlength(text, font=font) > width - 2 * margin and " " in text:
            text = text.rsplit(" ", 1)[0]
        x = margin + rng.randint(0, width // 10)
        if x + draw.textlength(text, font=font) > width - margin // 2:
            x = margin
        if upside_down and len(lines) % upside_down == 0:
            box = draw.textbbox((0, 0), text, font=font)
            slip = Image.new("RGB", (box[2] + 4, box[3] + 4), bg)
            ImageDraw.Draw(slip).text((2, 2), text, font=font, fill=fg)
            image.paste(slip.rotate(180), (x - 2, y - 2))
        else:
            draw.text((x, y), text, font=font, fill=fg)
        lines.append(text)
        y += gap

    angle = rng.choice((-3.0, -2.0, -1.0, 1.0, 2.0, 3.0)) if index % 3 == 1 else 0.0
    if angle:
        image = image.rotate(angle, resample=Image.BICUBIC, expand=False, fillcolor=bg)
    noise = rng.choice((6.0, 10.0, 16.0)) if index % 2 == 1 else 0.0
    if noise:
        pixels = np.asarray(image, dtype=np.float32)
        pixels += np.random.default_rng(4400 + index).normal(0.0, noise, pixels.shape).astype(np.float32)
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))

    quality = None if index % 4 == 0 else rng.choice((35, 50, 70, 85, 95))
    out = io.BytesIO()
    if quality is None:
        image.save(out, format="PNG")
    else:
        image.save(out, format="JPEG", quality=quality)
    return Page(out.getvalue(), "PNG" if quality is None else "JPEG", (width, height), tuple(lines),
                face.name, font_size, angle, noise, quality,
                tuple(range(0, len(lines), upside_down)) if upside_down else ())


def pages(count: int = 24, upside_down: int = 0) -> list[Page]:
    return [page(i, upside_down) for i in range(count)]


if __name__ == "__main__":  # writes the pages into a folder, to look at them
    import sys

    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "pages")
    folder.mkdir(parents=True, exist_ok=True)
    for i, p in enumerate(pages(int(sys.argv[2]) if len(sys.argv) > 2 else 24)):
        (folder / f"{i:02d}.{'png' if p.format == 'PNG' else 'jpg'}").write_bytes(p.data)
        print(i, p.size, p.format, p.quality, p.font, p.font_size, p.angle, p.noise, len(p.lines))
