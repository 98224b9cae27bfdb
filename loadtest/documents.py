"""Document pages of known content, for PaddleX's document pipelines (PP-StructureV3, tables, seals, formulas):
the pages the tests compare the service with PaddleX on and the load test posts as PDFs, and what the
stand-in models of tests/support read of them (standin_layout.py, standin_tables.py, standin_formula.py).

- ``document(seed)``: a white page of ``BANDS`` equal horizontal bands, each holding a block or two, each block
  inside a thin frame of its class's colour (``FRAMES``, light enough that the OCR reads the text inside as it
  would without it): a document title, paragraphs of text (DejaVu, as pages.py draws), a paragraph title, a
  table, a formula and a red seal; and its blocks, each its class, frame and content.
- ``table(seed, width, height, wired)``: a table of 2 to 4 rows and columns of short words and numbers
  (OpenCV's Hershey simplex), with black rules around every cell (wired) or none.
- ``formula(seed)``: one of ``FORMULAS`` drawn black on white; ``seal(seed)``: a red seal with one or two
  words written straight across it.

Only numpy, OpenCV and Pillow: the load test draws them where tests/ is not.
"""

from __future__ import annotations

import random

import numpy as np

from loadtest.pages import WORDS, fonts

#: The frame colour (BGR) of each class the pages draw.
#: Each is off every other's blend with white, off grey (black ink's anti-aliased edges) and off the red
#: seal's edges (x, x, 255), by more than ``TOLERANCE``.
FRAMES = {"doc_title": (255, 170, 170), "paragraph_title": (110, 200, 255), "text": (170, 255, 170),
          "table": (170, 255, 255), "formula": (255, 170, 255), "seal": (255, 255, 170)}
#: How far (0..255) a pixel's channel may be from its class's frame colour, and from white for a region.
TOLERANCE = 16
BANDS = 8  # horizontal bands of a page (SIDE / BANDS whole)
FRAME = 4  # the frames' width, px


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def document(seed: int, width: int = 960, height: int = 1200) -> tuple[np.ndarray, list[tuple[str, list[int], object]]]:
    """A page (BGR) and its blocks, each its class, its frame's box [x1, y1, x2, y2] and what it holds (the
    lines of text, a table's cells, a formula's LaTeX, a seal's words): a title, paragraphs, a paragraph
    title, a table (wired or not, by ``seed``), a formula and a seal, in bands (the middle ones in an order
    of ``seed``'s)."""
    from PIL import Image, ImageDraw, ImageFont

    rng = random.Random(seed)
    page = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(page)
    face = str(fonts()[0])
    band = height // BANDS
    blocks: list[tuple[str, list[int], object]] = []

    def frame(label: str, box: list[int]) -> None:
        b, g, r = FRAMES[label]
        draw.rectangle(box, outline=(r, g, b), width=FRAME)

    def lines(label: str, at: int, texts: list[str], size: int, left: int = 24, right: int | None = None) -> None:
        font = ImageFont.truetype(face, size)
        step = int(size * 1.5)
        top = at * band + (band - step * len(texts)) // 2
        box = [left, top - 8, right or width - 24, top + step * len(texts) + 4]
        for i, text in enumerate(texts):
            draw.text((box[0] + 12, top + i * step), text, fill=(0, 0, 0), font=font)
        frame(label, box)
        blocks.append((label, box, texts))

    def pasted(label: str, at: int, image: np.ndarray, held, left: int) -> None:
        h, w = image.shape[:2]
        top = at * band + (band - h) // 2
        page.paste(Image.fromarray(image[:, :, ::-1]), (left, top))
        box = [left - 6, top - 6, left + w + 5, top + h + 5]
        frame(label, box)
        blocks.append((label, box, held))

    lines("doc_title", 0, [_words(rng, 3).title()], 34, left=width // 5, right=width - width // 5)
    middle = ["text", "paragraph_title", "table", "text", "formula"]
    rng.shuffle(middle)
    for at, kind in enumerate(middle, start=1):
        if kind == "text":
            lines("text", at, [_words(rng, rng.randint(5, 7)) for _ in range(3)], 22)
        elif kind == "paragraph_title":
            lines("paragraph_title", at, [f"{at}. {_words(rng, 2).title()}"], 28)
        elif kind == "table":
            image, cells = table(seed, width - 120, band - 24, wired=seed % 2 == 0)
            pasted("table", at, image, cells, 60)
        else:
            image, latex = formula(seed)
            pasted("formula", at, image, latex, (width - image.shape[1]) // 2)
    lines("text", 6, [_words(rng, rng.randint(5, 7)) for _ in range(3)], 22)
    image, words = seal(seed)
    side = band - 16
    scaled = np.asarray(Image.fromarray(image).resize((side, side)))
    pasted("seal", 7, scaled, words, width - side - 60)
    lines("text", 7, [_words(rng, 4) for _ in range(2)], 22, right=width - side - 90)
    return np.asarray(page)[:, :, ::-1].copy(), blocks


#: The words and numbers of the cells: short, without the dotted i and j (whose dot stands apart).
TABLE_WORDS = ("cat", "dog", "sun", "tea", "red", "blue", "gold", "rose", "moon", "bear", "cake", "door", "fox",
         "map", "key", "box", "cup", "hat", "pen", "sky", "owl", "bus", "car", "egg")
TABLE_THICKNESS = 2


def table_layout(seed: int, width: int, height: int) -> dict:
    """The geometry of ``table(seed, width, height, ...)``: ``rows``, ``cols``, the grid lines' positions
    ``xs`` (cols + 1) and ``ys`` (rows + 1) in pixels, the line ``thickness``, the font ``scale`` and the
    ``texts`` (rows of strings). 2..4 rows and columns as the seed has it, fewer where the image is too
    small for a cell of about 140 x 64 pixels; the columns' widths vary by +-15 %."""
    import cv2

    rng = np.random.default_rng(seed)
    rows = int(rng.integers(2, max(2, min(4, height // 64)) + 1))
    cols = int(rng.integers(2, max(2, min(4, width // 140)) + 1))
    margin = int(rng.integers(2, 9))

    def lines(count, size, spread):
        weights = np.concatenate([[0.0], rng.uniform(1 - spread, 1 + spread, count)])
        shares = np.cumsum(weights) / weights.sum()
        return [int(np.rint(margin + share * (size - 1 - 2 * margin))) for share in shares]

    xs, ys = lines(cols, width, 0.15), lines(rows, height, 0.05)
    pool = list(TABLE_WORDS) + [str(value) for value in rng.choice(np.arange(10, 1000), 24, replace=False)]
    texts = [str(text) for text in rng.choice(pool, rows * cols, replace=False)]
    font = cv2.FONT_HERSHEY_SIMPLEX
    unit_h = cv2.getTextSize("0", font, 1.0, TABLE_THICKNESS)[0][1]
    unit_w = max(cv2.getTextSize(text, font, 1.0, TABLE_THICKNESS)[0][0] for text in texts)
    cell_w, cell_h = min(np.diff(xs)), min(np.diff(ys))
    scale = min(min(30.0, 0.42 * cell_h) / unit_h, 0.55 * cell_w / unit_w)
    return {"rows": rows, "cols": cols, "xs": xs, "ys": ys, "thickness": int(rng.integers(2, 4)),
            "scale": float(scale), "texts": [texts[row * cols:(row + 1) * cols] for row in range(rows)]}


def cells(seed: int, width: int, height: int) -> list[list[float]]:
    """The cells of ``table(seed, width, height, ...)``, row by row, each [x1, y1, x2, y2] between its
    grid lines' centres (the boxes the structure and cells stand-ins answer, to a few pixels)."""
    grid = table_layout(seed, width, height)
    xs, ys = grid["xs"], grid["ys"]
    return [[float(xs[c]), float(ys[r]), float(xs[c + 1]), float(ys[r + 1])]
            for r in range(grid["rows"]) for c in range(grid["cols"])]


def table(seed: int, width: int, height: int, wired: bool) -> tuple[np.ndarray, list[list[str]]]:
    """A white image (BGR, height x width) of a table filling it up to a margin of 2..8 pixels: ``layout``'s
    rows x columns of cells, each with a short word or number in black at its centre (OpenCV's Hershey
    simplex, about 25-30 pixels high where the cells allow); ``wired``: black lines of 2-3 pixels around
    every cell, else no lines. Returns the image and the texts, row by row."""
    import cv2

    grid = table_layout(seed, width, height)
    image = np.full((height, width, 3), 255, np.uint8)
    xs, ys, thickness = grid["xs"], grid["ys"], grid["thickness"]
    if wired:
        low, high = thickness // 2, thickness - thickness // 2
        for x in xs:
            image[ys[0] - low:ys[-1] + high, x - low:x + high] = 0
        for y in ys:
            image[y - low:y + high, xs[0] - low:xs[-1] + high] = 0
    font, scale = cv2.FONT_HERSHEY_SIMPLEX, grid["scale"]
    for r, line in enumerate(grid["texts"]):
        for c, text in enumerate(line):
            (w, h), _ = cv2.getTextSize(text, font, scale, TABLE_THICKNESS)
            cx, cy = (xs[c] + xs[c + 1]) / 2, (ys[r] + ys[r + 1]) / 2
            cv2.putText(image, text, (round(cx - w / 2), round(cy + h / 2)), font, scale, (0, 0, 0),
                        TABLE_THICKNESS, cv2.LINE_AA)
    return image, grid["texts"]


#: The formulas the stand-in answers, by their ink's aspect ratio (width / height) rising: each the parts
#: ``formula()`` draws (text, superscript or not), the LaTeX as the real model's tokens (space-separated),
#: and the LaTeX PaddleX's ``UniMERNetDecode`` makes of them.
FORMULAS = (
    ((("x", False), ("2", True)), "x ^ { 2 }", "x^{2}"),
    ((("y = x", False), ("2", True)), "y = x ^ { 2 }", "y=x^{2}"),
    ((("E = mc", False), ("2", True)), "E = m c ^ { 2 }", "E=m c^{2}"),
    ((("a", False), ("2", True), (" + b", False), ("2", True), (" = c", False), ("2", True)),
     "a ^ { 2 } + b ^ { 2 } = c ^ { 2 }", "a^{2}+b^{2}=c^{2}"),
)


def _text(image: np.ndarray, parts, origin: tuple[int, int], scale: float, colour, thickness: int) -> None:
    import cv2

    font = cv2.FONT_HERSHEY_SIMPLEX
    cap = cv2.getTextSize("X", font, scale, thickness)[0][1]
    x, y = origin
    for text, raised in parts:
        size = scale * 0.6 if raised else scale
        cv2.putText(image, text, (x, y - (int(round(0.55 * cap)) if raised else 0)), font, size, colour,
                    thickness, cv2.LINE_AA)
        x += cv2.getTextSize(text, font, size, thickness)[0][0] + int(round(2 * scale))


def _extent(parts, scale: float, thickness: int) -> tuple[int, int, int]:
    """The drawn parts' width, height above the baseline and below it (pixels)."""
    import cv2

    font = cv2.FONT_HERSHEY_SIMPLEX
    cap = cv2.getTextSize("X", font, scale, thickness)[0][1]
    width, above, below = 0, 0, 0
    for text, raised in parts:
        size = scale * 0.6 if raised else scale
        (w, h), base = cv2.getTextSize(text, font, size, thickness)
        lift = int(round(0.55 * cap)) if raised else 0
        width += w + int(round(2 * scale))
        above, below = max(above, h + lift), max(below, base - lift)
    return width, above, below


def formula(seed: int) -> tuple[np.ndarray, str]:
    """A formula image (BGR, black on white, its ink 30-40 px high, about 300x80) and the LaTeX the stand-in
    answers for it: the formulas of ``FORMULAS`` in turn (``seed % 4``), at a size and place ``seed`` draws."""
    rng = np.random.default_rng(seed)
    parts, _, latex = FORMULAS[seed % len(FORMULAS)]
    thickness = 2
    width, above, below = _extent(parts, 1.0, thickness)
    sample = np.full((above + below + 20, width + 20, 3), 255, np.uint8)
    _text(sample, parts, (10, 10 + above), 1.0, (0, 0, 0), thickness)
    rows = np.nonzero((sample[..., 0] < 200).any(axis=1))[0]
    scale = float(rng.uniform(30, 40)) / (rows[-1] - rows[0] + 1)  # the ink's height, about
    width, above, below = _extent(parts, scale, thickness)
    left, top = int(rng.integers(15, 50)), int(rng.integers(15, 30))
    image = np.full((max(80, top + above + below + 15), left + width + int(rng.integers(15, 50)), 3), 255,
                    np.uint8)
    _text(image, parts, (left, top + above), scale, (0, 0, 0), thickness)
    return image, latex


#: The words ``seal()`` writes.
SEAL_WORDS = ("OFFICIAL", "SEAL", "PAID", "APPROVED", "RECEIVED", "CERTIFIED", "COPY", "BANK", "LIMITED", "VALID")


def seal(seed: int) -> tuple[np.ndarray, list[str]]:
    """A red seal on white (BGR): a ring 200-300 px across, a thinner ring inside it, and one or two words
    written straight across its middle, a line each; and the words, top to bottom."""
    import cv2

    rng = np.random.default_rng(seed)
    radius = int(rng.integers(100, 150))
    margin = int(rng.integers(20, 60))
    side = 2 * (radius + margin)
    image = np.full((side, side, 3), 255, np.uint8)
    red = (int(rng.integers(0, 40)), int(rng.integers(0, 40)), int(rng.integers(200, 245)))
    centre = (side // 2, side // 2)
    cv2.circle(image, centre, radius, red, int(rng.integers(5, 9)), cv2.LINE_AA)
    cv2.circle(image, centre, radius - 14, red, 2, cv2.LINE_AA)
    count = 1 + int(rng.integers(0, 2))
    words = [str(word) for word in rng.choice(SEAL_WORDS, size=count, replace=False)]
    font, thickness = cv2.FONT_HERSHEY_DUPLEX, 2
    for line, word in enumerate(words):
        # As large as fits across the ring's inside at that line, at most 44 px high.
        scale = 1.4
        while cv2.getTextSize(word, font, scale, thickness)[0][0] > 1.35 * radius and scale > 0.5:
            scale -= 0.05
        (w, h), _ = cv2.getTextSize(word, font, scale, thickness)
        offset = 0 if count == 1 else (-1 if line == 0 else 1) * int(0.32 * radius)
        cv2.putText(image, word, (centre[0] - w // 2, centre[1] + h // 2 + offset), font, scale, red, thickness,
                    cv2.LINE_AA)
    return image, words


def pdf_of(images: list[bytes]) -> bytes:
    """A PDF of encoded ``images``, a page each, at 144 dpi (a page's points half its pixels: PaddleX serving's
    reader renders a page at twice its points, so the pages come back at the images' own sizes), each image
    stored as its pixels (pypdfium2, PaddleX's own PDF library), so the pages rendered back are the images
    pixel for pixel (Pillow's writer stores them as JPEG)."""
    import io

    import pypdfium2
    from PIL import Image

    pdf = pypdfium2.PdfDocument.new()
    for data in images:
        picture = Image.open(io.BytesIO(data)).convert("RGB")
        width, height = picture.size
        page = pdf.new_page(width / 2, height / 2)
        image = pypdfium2.PdfImage.new(pdf)
        image.set_bitmap(pypdfium2.PdfBitmap.from_pil(picture))
        image.set_matrix(pypdfium2.PdfMatrix().scale(width / 2, height / 2))
        page.insert_obj(image)
        page.gen_content()
    out = io.BytesIO()
    pdf.save(out)
    return out.getvalue()
