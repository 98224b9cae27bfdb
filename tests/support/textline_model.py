"""A text-line orientation classifier as PaddleX exports one, for the tests of PaddleX's OCR pipeline with
``use_textline_orientation`` (issue 44).

PaddleOCR's own ``PP-LCNet_x0_25_textline_ori`` export is downloaded by PaddleX from its model hosts, which
this machine cannot reach, and no package of the index ships it. So this module trains one, once a
machine, under that model's name and with its input (an 80x160 RGB line), output (two classes' scores)
and ``inference.yml``: a small convolutional network (``network()``; PP-LCNet's own layout did not learn
the task in the minutes a test fixture can spend), on text lines drawn with the test pages' fonts,
colours and words (``loadtest/pages.py``), cut out around their ink with margins of random sizes, as the
detector cuts them, each upright or turned 180 degrees. It trains until it reads 95% of lines it has not
seen (600 steps of 64, then 100 at a time, at most 1,500): about 7 minutes on a 2-core VM (0.7 s a step;
it reads the line at half its size, which the task allows: at full size a step took 2.7 s, 22 minutes for
the same accuracy).

The export is PaddleX's layout: ``inference.json`` and ``inference.pdiparams`` (``paddle.jit.save``, a
softmax at the end as PaddleClas exports it), and ``inference.yml`` with PaddleX's model name, its
preprocessing (ResizeImage to 160x80, NormalizeImage, ToCHWImage) and ``Topk`` over the labels
``0_degree`` and ``180_degree``, so PaddleX's own ``create_pipeline`` runs it as it runs PaddleOCR's.

``export()`` builds it once into the per-user cache (``placeenv/textline-ori-<digest>``, the digest of
this file and Paddle's version), in a fresh interpreter on the CPU, under a file lock for concurrent test
workers; ``python -m support.textline_model`` (from tests/) does the same.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from .paddlex_reference import locked

MODEL_NAME = "PP-LCNet_x0_25_textline_ori"
LABELS = ("0_degree", "180_degree")
SIZE = (160, 80)  # width, height: PaddleX's ResizeImage size for the text-line classifiers
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CHANNELS = (3, 16, 32, 48, 64, 64)
STEPS, BATCH, SEED, LEARNING_RATE = 600, 64, 0, 2e-3
MORE, MAX_STEPS, TARGET, FLOOR = 100, 1500, 0.95, 0.92

INFERENCE_YML = f"""\
Global:
  model_name: {MODEL_NAME}
PreProcess:
  transform_ops:
  - ResizeImage:
      size: [{SIZE[0]}, {SIZE[1]}]
  - NormalizeImage:
      channel_num: 3
      mean: {list(MEAN)}
      order: ''
      scale: 0.00392156862745098
      std: {list(STD)}
  - ToCHWImage: null
PostProcess:
  Topk:
    topk: 1
    label_list:
    - {LABELS[0]}
    - {LABELS[1]}
"""


def network():
    """The classifier, for two classes: the line at half its size (a 2x2 average), five 3x3 convolution
    blocks (batch norm, ReLU), halving the image after each of the first four, averaged along the line but
    not across it (which way up a line is shows in what lies above and below its middle: ascenders,
    descenders), then one linear layer. Its forward pass ends in a softmax (the export's, as PaddleClas
    exports); ``logits(x)`` is the training's."""
    import paddle

    nn = paddle.nn

    def block(cin, cout):
        return [nn.Conv2D(cin, cout, 3, padding=1), nn.BatchNorm2D(cout), nn.ReLU()]

    class Classifier(nn.Layer):
        def __init__(self):
            super().__init__()
            layers = [nn.AvgPool2D(2)]
            for cin, cout in zip(CHANNELS, CHANNELS[1:-1]):
                layers += [*block(cin, cout), nn.MaxPool2D(2)]
            self.features = nn.Sequential(*layers, *block(CHANNELS[-2], CHANNELS[-1]))
            self.fc = nn.Linear(CHANNELS[-1] * (SIZE[1] // 32), len(LABELS))

        def logits(self, x):
            return self.fc(self.features(x).mean(axis=3).flatten(1))

        def forward(self, x):
            return nn.functional.softmax(self.logits(x), axis=-1)

    return Classifier()


def line(rng: random.Random) -> np.ndarray:
    """One text line (RGB), drawn with the test pages' fonts, colours and words, cut out around its ink
    with margins of random sizes on each side (as the detector's boxes cut lines out: the text's place in
    the crop tells nothing of its orientation), some with noise."""
    from PIL import Image, ImageDraw, ImageFont

    from loadtest import pages

    size = rng.choice((16, 20, 24, 30, 36, 44))
    font = ImageFont.truetype(str(rng.choice(pages.fonts())), size)
    fg, bg = rng.choice(pages.COLOURS)
    text = pages._line(rng)[: rng.randint(3, 16)].strip() or "total"
    image = Image.new("RGB", (int(font.getlength(text)) + 4 * size, 4 * size), bg)
    draw = ImageDraw.Draw(image)
    draw.text((2 * size, size), text, font=font, fill=fg)
    left, top, right, bottom = draw.textbbox((2 * size, size), text, font=font)
    tall = bottom - top
    box = (left - int(tall * rng.uniform(0.05, 0.6)), top - int(tall * rng.uniform(0.1, 0.6)),
           right + int(tall * rng.uniform(0.05, 0.6)), bottom + int(tall * rng.uniform(0.1, 0.6)))
    pixels = np.asarray(image.crop(box))
    if rng.random() < 0.5:
        noise = np.random.default_rng(rng.randrange(1 << 30)).normal(0, rng.choice((4, 8, 14)), pixels.shape)
        pixels = np.clip(pixels + noise, 0, 255).astype(np.uint8)
    return pixels


def prepared(rgb: np.ndarray) -> np.ndarray:
    """The export's preprocessing (as its inference.yml says PaddleX applies it), for training."""
    import cv2

    x = cv2.resize(rgb, SIZE, interpolation=cv2.INTER_LINEAR).astype(np.float32) / 255.0
    return ((x - np.asarray(MEAN, np.float32)) / np.asarray(STD, np.float32)).transpose(2, 0, 1)


def examples(rng: random.Random, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` lines, each upright (label 0) or turned 180 degrees (label 1)."""
    xs, ys = [], []
    for _ in range(count):
        pixels, label = line(rng), rng.randrange(2)
        if label:
            pixels = np.ascontiguousarray(pixels[::-1, ::-1])
        xs.append(prepared(pixels))
        ys.append(label)
    return np.stack(xs), np.asarray(ys, np.int64)


def train():
    """The trained network (eval mode) and its accuracy on 256 lines it never saw: ``STEPS`` steps, then
    ``MORE`` at a time until it reads ``TARGET`` of those lines or has had ``MAX_STEPS``. The same seed does
    not give the same network on every CPU (oneDNN's kernels differ by instruction set): 600 steps gave 95%
    on one VM and 91% on another, where the tests then read too few upside-down lines."""
    import paddle

    paddle.seed(SEED)
    rng = random.Random(SEED)
    net = network()
    optimiser = paddle.optimizer.Adam(learning_rate=LEARNING_RATE, parameters=net.parameters())
    held_x, held_y = examples(random.Random(SEED + 1), 256)
    steps, accuracy = 0, 0.0
    while steps < MAX_STEPS and (steps < STEPS or accuracy < TARGET):
        for _ in range(STEPS if steps == 0 else MORE):
            x, y = examples(rng, BATCH)
            loss = paddle.nn.functional.cross_entropy(net.logits(paddle.to_tensor(x)), paddle.to_tensor(y))
            loss.backward()
            optimiser.step()
            optimiser.clear_grad()
        steps += STEPS if steps == 0 else MORE
        net.eval()
        with paddle.no_grad():
            accuracy = float((net(paddle.to_tensor(held_x)).numpy().argmax(1) == held_y).mean())
        net.train()
    net.eval()
    return net, accuracy


def cache_dir() -> Path:
    import paddle

    digest = hashlib.sha256(Path(__file__).read_bytes() + paddle.__version__.encode()).hexdigest()[:16]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "placeenv" / f"textline-ori-{digest}"


def export() -> Path:
    """The export directory (``inference.json``, ``inference.pdiparams``, ``inference.yml``), trained into
    the cache on first use, in a fresh interpreter: a test process has placeenv installed and sim devices
    made, and the training is the CPU's."""
    target = cache_dir()
    if (target / "inference.json").is_file():
        return target
    with locked(target.with_name(target.name + ".lock")):
        if not (target / "inference.json").is_file():
            tests = Path(__file__).resolve().parents[1]
            environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), str(tests.parent)])}
            done = subprocess.run([sys.executable, "-m", "support.textline_model", "--build"], cwd=tests,
                                  env=environment, capture_output=True, text=True, timeout=3600)
            if done.returncode != 0 or not (target / "inference.json").is_file():
                raise RuntimeError(f"training the text-line orientation classifier failed ({done.returncode}): "
                                   f"{(done.stderr or done.stdout).strip()[-1500:]}")
    return target


def _build(target: Path) -> None:
    import paddle

    paddle.set_device("cpu")
    net, accuracy = train()
    if accuracy < FLOOR:
        raise RuntimeError(f"the text-line orientation classifier reached only {accuracy:.3f} on held-out lines")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        spec = paddle.static.InputSpec([None, 3, SIZE[1], SIZE[0]], "float32", name="x")
        paddle.jit.save(net, str(staging / "inference"), input_spec=[spec])
        (staging / "inference.yml").write_text(INFERENCE_YML)
        (staging / "accuracy").write_text(f"{accuracy}\n")
        staging.chmod(0o755)
        os.replace(staging, target)  # whole: a reader never sees a half-written export
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def copy_to(directory: Path) -> Path:
    """A copy of the export in ``directory`` (made), as a user would place it beside a pipeline file."""
    source = export()
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("inference.json", "inference.pdiparams", "inference.yml"):
        shutil.copyfile(source / name, directory / name)
    return directory


if __name__ == "__main__":  # --build: train and save (export() runs it); else the export, built if missing
    if sys.argv[1:] == ["--build"]:
        _build(cache_dir())
    print(export())
