"""The bundled repository's examples, built reproducibly.

- ``digits``: an MLP trained on scikit-learn's 8x8 digits (``train_digits.py``),
  saved with ``paddle.jit.save`` and committed, with a ``model.py`` for
  its JSON-friendly pre- and post-processing.
- ``mobilenet``: MobileNetV2 (scale 0.5, 10 classes, 3x32x32) with seeded random
  weights, a plain ``jit.save`` directory.
- ``ocr_det`` and ``ocr_rec``: the OCR pipeline's detector (each row's ink, from a
  3x3 blur with seeded weights near a box filter) and recogniser (a small CNN with
  seeded random weights: its text means nothing), plain ``jit.save`` directories.
  ``ocr_page`` draws a page for them, ``text_lines``, ``line_crops`` and ``read_lines``
  are the steps between (``bundled/ocr_read``); ``top_labels`` is ``classify``'s last step.

The programs are not committed: they are built at first start into the per-user cache
(``home(name)``), since an installed package may be read-only;
``python -m placeenv.serve.models.examples [REPOSITORY]`` builds them there, or into
``REPOSITORY/<model>/1`` for a repository of your own.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import paddle
from PIL import Image

from placeenv import PlaceEnv
from placeenv.sim import user_cache

from .base import softmax

MOBILENET_SEED = 0
MOBILENET_INPUT = paddle.static.InputSpec([None, 3, 32, 32], "float32", name="image")
DIGITS_INPUT = paddle.static.InputSpec([None, 64], "float32", name="pixels")


def mobilenet_network() -> paddle.nn.Layer:
    """MobileNetV2, its weights drawn from a fixed seed (every build is the same model)."""
    network = paddle.vision.models.mobilenet_v2(num_classes=10, scale=0.5)
    # Our own numpy generator, not Paddle's: state_dict order is fixed, so the draws are too.
    rng = np.random.default_rng(MOBILENET_SEED)
    missing, unexpected = network.set_state_dict(
        {name: _seeded(rng, value.numpy()) for name, value in network.state_dict().items()}
    )
    assert not missing and not unexpected, (missing, unexpected)
    network.eval()
    return network


def _seeded(rng: np.random.Generator, value: np.ndarray) -> np.ndarray:
    if value.ndim == 4:  # conv [out, in/groups, kh, kw]: Kaiming normal on the fan-in
        std = math.sqrt(2.0 / math.prod(value.shape[1:]))
        return rng.normal(0.0, std, value.shape).astype(np.float32)
    if value.ndim == 2:  # classifier [in, out]: Xavier uniform
        limit = math.sqrt(6.0 / sum(value.shape))
        return rng.uniform(-limit, limit, value.shape).astype(np.float32)
    return value  # biases and BatchNorm scale/shift/statistics start as constants


# -- the OCR pipeline's programs and the steps between them -------------------------------------

OCR_SEED = 1
#: A page as the detector reads it (height, width), and a line as the recogniser reads it.
PAGE = (32, 128)
CROP = (16, 64)
#: What the recogniser reads a line as: at most ``OCR_STEPS`` characters of ``CHARSET``; index 0 is CTC's blank.
CHARSET = "-0123456789abcdefghijklmnopqrstuvwxyz"
OCR_STEPS = 8
#: A row (or column) of a line whose ink, 1 - brightness averaged along it, is above this is text.
INK = 0.1
DETECTOR_INPUT = paddle.static.InputSpec([None, 1, *PAGE], "float32", name="image")
RECOGNISER_INPUT = paddle.static.InputSpec([None, 1, *CROP], "float32", name="crop")


class Detector(paddle.nn.Layer):
    """Each row's ink: 1 - a 3x3 blur of the page (dark text on a light page), averaged along the row."""

    def __init__(self) -> None:
        super().__init__()
        self.blur = paddle.nn.Conv2D(1, 1, 3, padding=1, bias_attr=False)

    def forward(self, image):
        return (1 - self.blur(image)).mean(axis=[1, 3])


class Recogniser(paddle.nn.Layer):
    """A line crop -> ``OCR_STEPS`` positions of ``CHARSET`` logits: two convolutions, then a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = paddle.nn.Conv2D(1, 16, 3, stride=2, padding=1)
        self.conv2 = paddle.nn.Conv2D(16, 32, 3, stride=2, padding=1)
        self.classify = paddle.nn.Linear(32, len(CHARSET))

    def forward(self, crop):
        features = paddle.nn.functional.relu(self.conv2(paddle.nn.functional.relu(self.conv1(crop))))
        columns = features.mean(axis=2)  # [n, 32, width / 4]
        steps = columns.reshape([-1, 32, OCR_STEPS, CROP[1] // 4 // OCR_STEPS]).mean(axis=3)
        return self.classify(steps.transpose([0, 2, 1]))  # [n, OCR_STEPS, len(CHARSET)]


def detector_network() -> paddle.nn.Layer:
    network = Detector()
    rng = np.random.default_rng(OCR_SEED)
    network.blur.weight.set_value((1 / 9 + rng.normal(0, 0.005, (1, 1, 3, 3))).astype(np.float32))
    network.eval()
    return network


def recogniser_network() -> paddle.nn.Layer:
    network = Recogniser()
    rng = np.random.default_rng(OCR_SEED)
    network.set_state_dict({name: _seeded(rng, value.numpy()) for name, value in network.state_dict().items()})
    network.eval()
    return network


def ocr_page(lines: int, rng: np.random.Generator) -> np.ndarray:
    """A light page (uint8, ``PAGE``) with ``lines`` (1 to 3) lines of dark glyph-like blocks."""
    if not 1 <= lines <= 3:
        raise ValueError("a page holds 1 to 3 lines")
    page = np.full(PAGE, 235, np.uint8)
    for i in range(lines):
        top = 2 + i * 10
        left, width = int(rng.integers(2, 30)), int(rng.integers(50, 96))
        glyphs = rng.random((6, width)) < 0.6
        glyphs[:, ::5] = False  # gaps between glyphs
        page[top:top + 6, left:left + width][glyphs] = int(rng.integers(10, 60))
    return page


def text_lines(rows: np.ndarray) -> list[tuple[int, int]]:
    """The lines of a page from the detector's row ink: each run of rows above ``INK``, (top, bottom)."""
    lines, top = [], None
    for i, ink in enumerate([*rows, 0.0]):
        if ink > INK and top is None:
            top = i
        elif ink <= INK and top is not None:
            if i - top >= 2:
                lines.append((top, i))
            top = None
    return lines


def line_crops(page: np.ndarray, lines: list[tuple[int, int]]) -> np.ndarray:
    """Each line of ``page`` (``[1, h, w]`` in [0, 1]) cut to its inked columns and resized to ``CROP``:
    ``[len(lines), 1, *CROP]``."""
    crops = np.empty((len(lines), 1, *CROP), np.float32)
    for i, (top, bottom) in enumerate(lines):
        band = page[0, top:bottom]
        inked = np.flatnonzero(1 - band.mean(axis=0) > INK)
        left, right = (inked[0], inked[-1] + 1) if len(inked) else (0, band.shape[1])
        image = Image.fromarray(np.ascontiguousarray(band[:, left:right]), mode="F")
        crops[i, 0] = np.asarray(image.resize(CROP[::-1], Image.Resampling.BILINEAR))
    return crops


def top_labels(logits: np.ndarray, labels: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` likeliest of ``labels`` (an object array of bytes) for each row of ``logits``, and their
    probabilities: the classify pipeline's last step."""
    probabilities = softmax(logits)
    best = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
    return labels[best], np.take_along_axis(probabilities, best, axis=1)


def read_lines(logits: np.ndarray) -> list[str]:
    """The recogniser's logits ``[k, OCR_STEPS, len(CHARSET)]`` as k strings: greedy CTC (the best
    character at each position, repeats merged, blanks dropped)."""
    texts = []
    for best in np.asarray(logits).argmax(axis=2):
        merged = [c for j, c in enumerate(best) if c != 0 and (j == 0 or c != best[j - 1])]
        texts.append("".join(CHARSET[c] for c in merged))
    return texts


@PlaceEnv("cpu")
def save(network: paddle.nn.Layer, version_dir: Path, spec) -> None:
    """``paddle.jit.save`` into ``version_dir/model.*``, atomically: a half-written program is never seen."""
    version_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=version_dir.parent))
    try:
        paddle.jit.save(network, str(staging / "model"), input_spec=[spec])
        version_dir.mkdir(exist_ok=True)
        # The program last: a reader that sees model.json finds its parameters already there.
        for name in ("model.pdiparams", "model.json"):
            os.replace(staging / name, version_dir / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def cache_root() -> Path:
    """The per-user cache the built examples go to, beside the sim plugin's."""
    return user_cache() / "examples"


def home(name: str) -> Path:
    """Where a bundled model's version directories are built, keyed by this file and Paddle's
    version: a changed example, or another Paddle, builds anew instead of serving a stale program."""
    digest = hashlib.sha256(Path(__file__).read_bytes() + paddle.__version__.encode()).hexdigest()[:16]
    return cache_root() / f"{name}-{digest}"


def mobilenet_home() -> Path:
    return home("mobilenet")


#: Bundled models whose version 1 is built at start into the per-user cache (an installed package
#: may be read-only): the network of each, and its input.
BUILT_AT_START = {
    "mobilenet": (mobilenet_network, MOBILENET_INPUT),
    "ocr_det": (detector_network, DETECTOR_INPUT),
    "ocr_rec": (recogniser_network, RECOGNISER_INPUT),
}


def ensure(name: str, repository: Path | None = None) -> bool:
    """Build ``name``'s version 1 unless it is there (in ``home(name)``, or ``<repository>/<name>/1``
    when given); whether it built."""
    version_dir = home(name) / "1" if repository is None else repository / name / "1"
    if (version_dir / "model.json").is_file() and (version_dir / "model.pdiparams").is_file():
        return False
    network, spec = BUILT_AT_START[name]
    with PlaceEnv("cpu"):
        save(network(), version_dir, spec)
    return True


def ensure_mobilenet(repository: Path | None = None) -> bool:
    return ensure("mobilenet", repository)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    for name in BUILT_AT_START:
        built = ensure(name, target)
        where = home(name) / "1" if target is None else target / name / "1"
        print(f"{where}: {'built' if built else 'already there'}")
