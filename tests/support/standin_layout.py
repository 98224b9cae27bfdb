"""The layout detectors of PaddleX's PP-StructureV3 pipeline as stand-ins, and the document pages they read.

PaddleOCR's ``PP-DocLayout_plus-L`` (its blocks: text, titles, tables, formulas, seals, ...) and
``PP-DocBlockLayout`` (the page's regions, which PP-StructureV3 orders blocks by) are downloaded by PaddleX
from its model hosts, which this machine cannot reach. These stand-ins are RT-DETR exports as PaddleX runs
them (inputs ``im_shape``, ``image``, ``scale_factor``: PaddleX's ToBatch of the DETR models; ``Resize`` to
800x800 without keeping the ratio, ``NormalizeImage`` to 0..1, ``Permute``; outputs the boxes ``[M, 6]``,
class, score, x1, y1, x2, y2 in the original image, and their count an image ``[N]``), with the real
models' names and labels; what they compute is fixed, not learnt:

- **the pages** (``document()``, loadtest/documents.py's, which the load test draws too): a white page of
  ``BANDS`` equal horizontal bands, each holding a block or two, each block inside a thin frame of its class's
  colour (``FRAMES``, light enough that the OCR reads the text inside as it would without it): a document
  title, paragraphs of text, a paragraph title, a table, a formula and a red seal.
- **layout** (``layout_network(FRAMES)``): for each band and class, the pixels of the class's frame colour
  (each channel within ``TOLERANCE``); the box their extent (the largest and smallest coordinate among them,
  exact to a pixel of the 800x800 input), its score ``0.95 (1 - exp(-pixels / 20))``: about 0.95 for a frame,
  0 where there is none. PaddleX's layout_parsing pipeline's ``RT-DETR-H_layout_17cls`` (``LAYOUT_17``) is
  the same network over that model's 17 classes.
- **regions** (``layout_network(None)``): the same over every pixel that is not white (ink and frames): one
  ``Region`` box a band that holds anything.
- **table orientation** (``upright_network``, folder ``TABLE_ORIENTATION``): PP-StructureV3 runs PaddleOCR's
  page-orientation classifier, ``PP-LCNet_x1_0_doc_ori``, on each table's crop too. The page stand-in
  (standin_models.py) reads a page's line layout, which the middle 224 px of a table's crop lacks, so this
  second stand-in of the same model answers every crop upright, ``0``: the tables of the pages are.
  PaddleX's turning of a table it finds on its side is not exercised.

``standin_models.export`` builds them with the other stand-ins.
"""

from __future__ import annotations

import numpy as np

# The drawings the stand-ins read (the load test draws them too).
from loadtest.documents import BANDS, FRAMES, TOLERANCE, document  # noqa: F401

from .standin_models import ORIENTATION_YML

LAYOUT = "PP-DocLayout_plus-L"
REGION = "PP-DocBlockLayout"
#: PP-DocLayout_plus-L's classes, in its order.
LAYOUT_LABELS = ("paragraph_title", "image", "text", "number", "abstract", "content", "figure_table_chart_title",
                 "formula", "table", "reference", "doc_title", "footnote", "header", "algorithm", "footer", "seal",
                 "chart", "formula_number", "aside_text", "reference_content")
REGION_LABELS = ("Region",)
#: PaddleX's layout_parsing pipeline's layout detector, and its 17 classes in its order: the same stand-in.
LAYOUT_17 = "RT-DETR-H_layout_17cls"
LAYOUT_17_LABELS = ("paragraph_title", "image", "text", "number", "abstract", "content", "figure_title", "formula",
                    "table", "table_title", "reference", "doc_title", "footnote", "header", "algorithm", "footer",
                    "seal")
SIDE = 800  # the detectors' input side

LAYOUT_YML = """\
mode: paddle
draw_threshold: 0.5
metric: COCO
use_dynamic_shape: false
Global:
  model_name: {name}
arch: DETR
min_subgraph_size: 3
Preprocess:
- interp: 2
  keep_ratio: false
  target_size: [{side}, {side}]
  type: Resize
- mean: [0.0, 0.0, 0.0]
  norm_type: none
  std: [1.0, 1.0, 1.0]
  type: NormalizeImage
- type: Permute
label_list:
{labels}"""


def yml(name: str, labels, side: int = SIDE) -> str:
    return LAYOUT_YML.format(name=name, side=side, labels="".join(f"- {label}\n" for label in labels))


def layout_network(frames: dict[str, tuple[int, int, int]] | None, labels=LAYOUT_LABELS):
    """The layout stand-in over ``frames`` (class -> BGR colour), or, for None, the region stand-in (one
    class: any pixel that is not white): ``(im_shape, image, scale_factor) -> (boxes [N * BANDS * classes, 6],
    counts [N])``."""
    import paddle

    nn = paddle.nn
    if frames is None:
        classes, colours = [0], None
    else:
        classes = [labels.index(name) for name in frames]
        colours = np.asarray([[c[2], c[1], c[0]] for c in frames.values()], np.float32) / 255  # RGB, 0..1
    band = SIDE // BANDS

    class Layout(nn.Layer):
        def __init__(self):
            super().__init__()
            # The export's parameters: the frame colours, the class ids, the pixel coordinates.
            self.colours = self.create_parameter([max(len(classes), 1), 3, 1, 1],
                                                 default_initializer=nn.initializer.Assign(
                (colours if colours is not None else np.ones((1, 3), np.float32)).reshape(-1, 3, 1, 1)))
            self.ids = self.create_parameter([len(classes)], default_initializer=nn.initializer.Assign(
                np.asarray(classes, np.float32)))
            coordinates = np.arange(SIDE, dtype=np.float32)
            self.xs = self.create_parameter([1, 1, 1, SIDE], default_initializer=nn.initializer.Assign(
                coordinates.reshape(1, 1, 1, SIDE)))
            self.ys = self.create_parameter([1, 1, SIDE, 1], default_initializer=nn.initializer.Assign(
                coordinates.reshape(1, 1, SIDE, 1)))

        def forward(self, im_shape, image, scale_factor):
            tolerance = TOLERANCE / 255
            if colours is None:  # a pixel is the region's where any channel is off white
                far = paddle.max(paddle.abs(image - 1.0), axis=1, keepdim=True)
                mask = (far > tolerance).astype("float32")  # [N, 1, S, S]
            else:  # [N, C, S, S]: a pixel is a class's where every channel is within the tolerance
                near = paddle.max(paddle.abs(image.unsqueeze(1) - self.colours.unsqueeze(0)), axis=2)
                mask = (near <= tolerance).astype("float32")
            count = mask.shape[1]
            # Per band: the mask's count, and its extent (max of x where masked; min as SIDE - max(SIDE - x)).
            banded = mask.reshape([-1, count, BANDS, band, SIDE])
            xs, ys = self.xs.reshape([1, 1, 1, 1, SIDE]), self.ys.reshape([1, 1, BANDS, band, 1])
            pixels = banded.sum(axis=[3, 4])  # [N, C, BANDS]
            x2 = (banded * (xs + 1)).max(axis=[3, 4])
            x1 = SIDE - (banded * (SIDE - xs)).max(axis=[3, 4])
            y2 = (banded * (ys + 1)).max(axis=[3, 4])
            y1 = SIDE - (banded * (SIDE - ys)).max(axis=[3, 4])
            # (im_shape is the export's input as RT-DETR's; the boxes need only the scales.)
            score = 0.95 * (1 - paddle.exp(-pixels / 20)) + 0 * im_shape[:, :1].reshape([-1, 1, 1])
            sy = scale_factor[:, 0].reshape([-1, 1, 1])  # (PaddleX's ToBatch gives [h, w] scales)
            sx = scale_factor[:, 1].reshape([-1, 1, 1])
            ids = paddle.zeros_like(score) + self.ids.reshape([1, -1, 1])
            boxes = paddle.stack([ids, score, x1 / sx, y1 / sy, x2 / sx, y2 / sy], axis=-1)  # [N, C, BANDS, 6]
            boxes = boxes.reshape([-1, 6])
            counts = (paddle.zeros_like(scale_factor[:, 0]) + count * BANDS).astype("int32")
            return boxes, counts

    return Layout()


#: The table-orientation stand-in's folder (its model is PP-LCNet_x1_0_doc_ori, as the file names it).
TABLE_ORIENTATION = "PP-LCNet_x1_0_doc_ori-tables"


def upright_network():
    """The table-orientation stand-in: ``x [N, 3, 224, 224] -> the scores of 0, 90, 180, 270``, 0 surely."""
    import paddle

    class Upright(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.logits = self.create_parameter([1, 4], default_initializer=paddle.nn.initializer.Assign(
                np.asarray([[8.0, 0.0, 0.0, 0.0]], np.float32)))

        def forward(self, x):
            return paddle.nn.functional.softmax(self.logits + 0 * x.mean(axis=[1, 2, 3]).unsqueeze(-1), axis=-1)

    return Upright()


#: The stand-ins, as standin_models builds them: folder -> (network, input specs, inference.yml).
MODELS = {
    LAYOUT: (lambda: layout_network(FRAMES), [([None, 2], "float32", "im_shape"),
                                             ([None, 3, SIDE, SIDE], "float32", "image"),
                                             ([None, 2], "float32", "scale_factor")], yml(LAYOUT, LAYOUT_LABELS)),
    REGION: (lambda: layout_network(None, REGION_LABELS), [([None, 2], "float32", "im_shape"),
                                                           ([None, 3, SIDE, SIDE], "float32", "image"),
                                                           ([None, 2], "float32", "scale_factor")],
             yml(REGION, REGION_LABELS)),
    LAYOUT_17: (lambda: layout_network(FRAMES, LAYOUT_17_LABELS), [([None, 2], "float32", "im_shape"),
                                                               ([None, 3, SIDE, SIDE], "float32", "image"),
                                                               ([None, 2], "float32", "scale_factor")],
                yml(LAYOUT_17, LAYOUT_17_LABELS)),
    TABLE_ORIENTATION: (upright_network, [([None, 3, 224, 224], "float32", "x")], ORIENTATION_YML),
}


