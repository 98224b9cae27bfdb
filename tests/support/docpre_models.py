"""The document preprocessor's two models as PaddleX exports them, for the tests of PaddleX's OCR pipeline
with ``use_doc_preprocessor``: a page-orientation classifier under PaddleOCR's
``PP-LCNet_x1_0_doc_ori`` name and an unwarping model under ``UVDoc``'s.

PaddleOCR's own exports are downloaded by PaddleX from its model hosts, which this machine cannot reach,
and no package of the index ships them. These stand-ins have the real ones' names, inputs, outputs and
``inference.yml``, so PaddleX's own ``create_pipeline`` runs them as it runs PaddleOCR's; what they compute
is fixed, not learnt, and built in seconds:

- **orientation** (``orientation_network``): a 224x224 crop (the real model's ``ResizeImage resize_short
  256``, ``CropImage 224``, ImageNet ``NormalizeImage``) -> the scores of ``0``, ``90``, ``180``, ``270``.
  It reads two layout features of the test pages (loadtest/pages.py): which way the lines run (the ink's
  edges across a line, smoothed along it, against those along it) and which side they start on (the
  pages' lines are short and start near the left margin, so the ink leans to where the page's left edge
  is). Class ``90`` is a page whose left edge is at the top: PaddleX's ``rotate_image(page, 90)`` (90
  degrees counter-clockwise) sets it upright.
- **unwarping** (``unwarping_network``): a page (BGR, 0..1, any size) -> the same page with each column
  moved up by ``BOW`` of the page's height times ``sin(pi x / width)``, by ``grid_sample``: it flattens
  exactly the bowed pages ``bowed()`` makes, as UVDoc flattens a photographed page.

``export(kind)`` builds one into the per-user cache (``placeenv/doc-preprocessor-<digest>/<name>``, the
digest of this file and Paddle's version), in a fresh interpreter on the CPU, under a file lock;
``python -m support.docpre_models`` (from tests/) does the same.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from .paddlex_reference import locked

ORIENTATION = "PP-LCNet_x1_0_doc_ori"
UNWARPING = "UVDoc"
LABELS = ("0", "90", "180", "270")
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
#: The bow ``bowed()`` gives a page and the unwarping model takes out: the middle column moved down by
#: this share of the page's height.
BOW = 0.04

ORIENTATION_YML = f"""\
Global:
  model_name: {ORIENTATION}
PreProcess:
  transform_ops:
  - ResizeImage:
      resize_short: 256
  - CropImage:
      size: 224
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
{''.join(f"    - '{label}'{chr(10)}" for label in LABELS)}"""

UNWARPING_YML = f"""\
Global:
  model_name: {UNWARPING}
PreProcess:
  transform_ops:
  - NormalizeImage:
      mean: [0.0, 0.0, 0.0]
      scale: 0.00392156862745098
      std: [1.0, 1.0, 1.0]
  - ToCHWImage: null
PostProcess:
  DocTrPostProcess:
    scale: 255.0
"""


def orientation_network():
    """The page-orientation stand-in (its forward pass ends in a softmax, as PaddleClas exports)."""
    import paddle

    nn, F = paddle.nn, paddle.nn.functional

    class Orientation(nn.Layer):
        def __init__(self):
            super().__init__()
            # The export's parameters: grey from RGB, and the normalisation the network undoes.
            self.grey = self.create_parameter([1, 3, 1, 1], default_initializer=nn.initializer.Assign(
                np.asarray([0.299, 0.587, 0.114], np.float32).reshape(1, 3, 1, 1)))
            self.mean = self.create_parameter([1, 3, 1, 1], default_initializer=nn.initializer.Assign(
                np.asarray(MEAN, np.float32).reshape(1, 3, 1, 1)))
            self.std = self.create_parameter([1, 3, 1, 1], default_initializer=nn.initializer.Assign(
                np.asarray(STD, np.float32).reshape(1, 3, 1, 1)))

        def forward(self, x):
            grey = F.conv2d(x * self.std + self.mean, self.grey)
            ink = paddle.abs(grey - grey.mean(axis=[2, 3], keepdim=True))  # dark on light or light on dark
            along = F.avg_pool2d(ink, (1, 49), stride=1, padding=(0, 24))  # smoothed along a horizontal line
            down = F.avg_pool2d(ink, (49, 1), stride=1, padding=(24, 0))
            across = ((along[:, :, 1:, :] - along[:, :, :-1, :]) ** 2).mean(axis=[1, 2, 3])
            sideways = ((down[:, :, :, 1:] - down[:, :, :, :-1]) ** 2).mean(axis=[1, 2, 3])
            lines = paddle.log(across + 1e-8) - paddle.log(sideways + 1e-8)  # > 0: the lines run left-right
            half = ink.shape[3] // 2
            left, right = ink[:, :, :, :half].mean(axis=[1, 2, 3]), ink[:, :, :, half:].mean(axis=[1, 2, 3])
            top, bottom = ink[:, :, :half, :].mean(axis=[1, 2, 3]), ink[:, :, half:, :].mean(axis=[1, 2, 3])
            leans = (left - right) / (left + right + 1e-8)
            rises = (top - bottom) / (top + bottom + 1e-8)
            logits = paddle.stack([2 * lines + 10 * leans, -2 * lines + 10 * rises,
                                   2 * lines - 10 * leans, -2 * lines - 10 * rises], axis=1)
            return F.softmax(logits, axis=-1)

    return Orientation()


def unwarping_network():
    """The unwarping stand-in: ``bowed()`` undone by ``grid_sample``, the output the input's size."""
    import paddle

    nn, F = paddle.nn, paddle.nn.functional

    class Unwarping(nn.Layer):
        def __init__(self):
            super().__init__()
            self.bow = self.create_parameter([1], default_initializer=nn.initializer.Constant(BOW))

        def forward(self, x):
            # The pixel centres in -1..1 (grid_sample's align_corners=False), broadcast over (N, H, W).
            zero = paddle.zeros_like(x[:, 0])
            height, width = paddle.shape(x)[2], paddle.shape(x)[3]
            gx = zero + (paddle.arange(width).astype("float32") + 0.5) / width.astype("float32") * 2 - 1
            gy = zero + ((paddle.arange(height).astype("float32") + 0.5) / height.astype("float32") * 2 - 1
                         ).unsqueeze(-1)
            # A pixel's source lies BOW * height * sin(pi x / width) lower; -1..1 spans the height.
            gy = gy + 2 * self.bow * paddle.sin(np.pi * (gx + 1) / 2)
            return F.grid_sample(x, paddle.stack([gx, gy], axis=-1), mode="bilinear", padding_mode="border",
                                 align_corners=False)

    return Unwarping()


def bowed(bgr: np.ndarray) -> np.ndarray:
    """A page bowed as a photographed book page is: each column moved down by ``BOW`` of the height times
    ``sin(pi x / width)`` (the unwarping stand-in's inverse)."""
    import cv2

    height, width = bgr.shape[:2]
    xs, ys = np.meshgrid(np.arange(width, dtype=np.float32), np.arange(height, dtype=np.float32))
    shift = (BOW * height * np.sin(np.pi * (xs + 0.5) / width)).astype(np.float32)
    return cv2.remap(bgr, xs, ys - shift, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


#: The angles a page is turned by: each the angle PaddleX's ``rotate_image(page, angle)`` turns it back by
#: (counter-clockwise), so 90 is a page turned clockwise, its left edge at the top.
TURNS = (0, 90, 180, 270)


def turned(data: bytes, angle: int, bow: bool = False) -> bytes:
    """An encoded page (with ``bow``, bowed first: ``bowed()``) turned so that PaddleX's
    ``rotate_image(page, angle)`` sets it upright; PNG."""
    import cv2

    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    image = bowed(image) if bow else image
    turn = {90: cv2.ROTATE_90_CLOCKWISE, 180: cv2.ROTATE_180, 270: cv2.ROTATE_90_COUNTERCLOCKWISE}.get(angle)
    if turn is not None:
        image = cv2.rotate(image, turn)
    return cv2.imencode(".png", image)[1].tobytes()


def cache_dir() -> Path:
    import paddle

    digest = hashlib.sha256(Path(__file__).read_bytes() + paddle.__version__.encode()).hexdigest()[:16]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "placeenv" / f"doc-preprocessor-{digest}"


def export(name: str) -> Path:
    """The export directory of ``name`` (``ORIENTATION`` or ``UNWARPING``): ``inference.json``,
    ``inference.pdiparams``, ``inference.yml``; both built into the cache on first use, in a fresh
    interpreter (a test process has placeenv installed and sim devices made)."""
    root = cache_dir()
    if not (root / name / "inference.json").is_file():
        with locked(root.with_name(root.name + ".lock")):
            if not (root / name / "inference.json").is_file():
                tests = Path(__file__).resolve().parents[1]
                environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), str(tests.parent)])}
                done = subprocess.run([sys.executable, "-m", "support.docpre_models", "--build"], cwd=tests,
                                      env=environment, capture_output=True, text=True, timeout=600)
                if done.returncode != 0 or not (root / name / "inference.json").is_file():
                    raise RuntimeError(f"building the document preprocessor's stand-ins failed "
                                       f"({done.returncode}): {(done.stderr or done.stdout).strip()[-1500:]}")
    return root / name


def _build(root: Path) -> None:
    import paddle

    paddle.set_device("cpu")
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=root.parent))
    try:
        for name, net, spec, yml in (
                (ORIENTATION, orientation_network(), [None, 3, 224, 224], ORIENTATION_YML),
                (UNWARPING, unwarping_network(), [None, 3, None, None], UNWARPING_YML)):
            net.eval()
            paddle.jit.save(net, str(staging / name / "inference"),
                            input_spec=[paddle.static.InputSpec(spec, "float32", name="x")])
            (staging / name / "inference.yml").write_text(yml)
        staging.chmod(0o755)
        os.replace(staging, root)  # whole: a reader never sees a half-written export
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def copy_to(name: str, directory: Path) -> Path:
    """A copy of ``name``'s export in ``directory`` (made), as a user would place it beside a pipeline file."""
    source = export(name)
    directory.mkdir(parents=True, exist_ok=True)
    for file in ("inference.json", "inference.pdiparams", "inference.yml"):
        shutil.copyfile(source / file, directory / file)
    return directory


if __name__ == "__main__":  # --build: build and save (export() runs it); else the exports, built if missing
    if sys.argv[1:] == ["--build"]:
        _build(cache_dir())
    print(export(ORIENTATION), export(UNWARPING))
