"""Stand-ins for the table models of PaddleX's ``table_recognition_v2`` pipeline (and PP-StructureV3's
table part), which this machine cannot download: the wired/wireless table classifier, the table
structure recogniser and the table cells detector, under the real models' names, with their inputs,
outputs and ``inference.yml``, so that PaddleX's own ``create_model`` / ``create_pipeline`` run them as
they run the real ones. What they compute is fixed, not learnt; it is right for the tables ``table()``
draws (a grid of cells, each with one short word or number, with or without grid lines).

All of them look at the table the same way (``_grid``): the table's content as darkness (1 - grey),
resampled to ``2 * VIEW`` pixels square and max-pooled to ``VIEW`` (so it does not depend on the
image's size or aspect). A **line** is a run of dark pixels (the darkest of 3 neighbouring rows or
columns above 0.3) along ``LINE_RUN`` (half the view) without a break: grid lines span the table, while
no stroke of the text, nor a word with its letter gaps, is half as long. A table with at least two
horizontal and two vertical lines is wired: its rows are between the horizontal lines (boundaries at
the lines' centres), its columns between the vertical ones. Otherwise it is wireless: its rows are the
bands of rows holding ink (dilated by 6 view pixels), its columns the bands of columns holding ink,
the boundaries the middles of the gaps between bands, the outer ones the content's edges. At most
``MAX_GRID`` rows and columns.

- **PP-LCNet_x1_0_table_cls** (``table_classification``; PaddleClas export, input ``x`` [N, 3, 224, 224],
  ``ResizeImage resize_short 256``, ``CropImage 224``, ImageNet ``NormalizeImage``) -> softmax over
  ``wired_table``, ``wireless_table``: logits +-16 * (s - 0.25), s the strength of the longest run (the
  eroded darkness, about 1 on a line, 0 without).
- **SLANeXt_wired**, **SLANeXt_wireless** (input ``x`` [N, 3, 512, 512]) and **SLANet_plus** (``x`` [N, 3,
  H, W]; PaddleX pads it to 488 x 488) (``table_structure_recognition``; ``ResizeTableImage``, ImageNet
  ``NormalizeImage``, ``PaddingTableImage`` with 0 at the right and bottom): outputs, in the order
  PaddleX's ``TableLabelDecode`` reads them, the cells' locations [N, ``TOKENS``, 8] and the structure
  probabilities [N, ``TOKENS``, 50]. The content is the part of the input that is not padding (the
  padding is exactly 0 after normalising, which no pixel value is). The token sequence for R rows and C
  columns: ``<tbody>``, R times (``<tr>``, C times ``<td></td>``, ``</tr>``), ``</tbody>``, then ``eos``
  (probability 0.9997 each, the rest spread); each ``<td></td>`` has its cell's polygon (x1, y1, x2,
  y1, x2, y2, x1, y2) as shares of the padded input, which the decoder turns into the original image's
  pixels.
- **RT-DETR-L_wired_table_cell_det**, **RT-DETR-L_wireless_table_cell_det** (``table_cells_detection``;
  RT-DETR export, inputs ``im_shape``, ``image`` [N, 3, 640, 640] (``Resize`` 640 x 640 without keeping
  the ratio, ``NormalizeImage`` to 0..1, ``Permute``), ``scale_factor``) -> boxes [N * MAX_GRID^2, 6]
  (class, score, x1, y1, x2, y2 in the original image's pixels, ``im_shape / scale_factor``) and their
  count per image [N] (int32), as PaddleDetection answers: a box per cell of the grid, class 0 (``cell``)
  and score 0.95; the other slots class -1, score 0 (PaddleX drops them).

``MODELS`` maps each name to (the function making the network, its input specs as (shape, dtype, name),
its ``inference.yml``), for ``paddle.jit.save(net, dir / "inference", input_spec=[InputSpec(...)])``.
``table(seed, width, height, wired)`` draws a table and returns it with its cells' texts;
``layout()`` is its geometry, ``cells()`` the cell boxes the models should find.

In ``table_recognition_v2`` these need ``use_layout_detection: False`` (or a layout model) and
``use_table_orientation_classify=False`` (a predict argument, True by default; its model,
``PP-LCNet_x1_0_doc_ori``, is not among these). They give the same answers with oneDNN on or off (PaddleX
itself runs the SLANet/SLANeXt ones without, its MKLDNN_BLOCKLIST), and in every mode of the pipeline:
cells detection with the structure (the default), ``use_e2e_*_table_rec_model`` (the structure's cell
boxes) and ``use_*_table_cells_trans_to_html`` (the detected cells alone).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

# The drawings the stand-ins read (the load test draws them too).
from loadtest.documents import cells, table, table_layout  # noqa: F401

from .standin_layout import yml as detr_yml
from .standin_models import MEAN, STD, classifier_yml  # (ImageNet's, as the other stand-ins')

if TYPE_CHECKING:
    import paddle

TABLE_CLS = "PP-LCNet_x1_0_table_cls"
WIRED_STRUCTURE = "SLANeXt_wired"
WIRELESS_STRUCTURE = "SLANet_plus"  # PP-StructureV3's; table_recognition_v2's default is SLANeXt_wireless
SLANEXT_WIRELESS = "SLANeXt_wireless"
WIRED_CELLS = "RT-DETR-L_wired_table_cell_det"
WIRELESS_CELLS = "RT-DETR-L_wireless_table_cell_det"
LABELS = ("wired_table", "wireless_table")

#: The most rows and columns the models find; the side of their view of the table; a line's least run.
MAX_GRID = 6
VIEW = 256
LINE_RUN = VIEW // 2  # a power of two (the erosion doubles its window)
#: The structure models' output length: <tbody>, MAX_GRID rows of <tr>, MAX_GRID cells, </tr>, </tbody>,
#: then eos to the end.
TOKENS = 64
#: The detector's input side and its box score.
DET_SIDE = 640
CELL_SCORE = 0.95

#: PaddleOCR's table structure dictionary (ppocr/utils/dict/table_structure_dict_ch.txt), the
#: ``character_dict`` of the real exports' inference.yml.
STRUCTURE_DICT = (["<thead>", "</thead>", "<tbody>", "</tbody>", "<tr>", "</tr>", "<td>", "<td", ">", "</td>"]
                  + [f' colspan="{n}"' for n in range(2, 21)] + [f' rowspan="{n}"' for n in range(2, 21)])
#: The tokens as PaddleX's TableLabelDecode (merge_no_span_structure) numbers them: sos, the dictionary
#: without <td> and with <td></td> at its end, eos.
DECODED = ["sos"] + [token for token in STRUCTURE_DICT if token != "<td>"] + ["<td></td>", "eos"]


def _yaml_list(items, indent):
    return "".join(f"{' ' * indent}- '{item}'\n" for item in items)


TABLE_CLS_YML = classifier_yml(TABLE_CLS, LABELS, topk=5)


def _structure_yml(name: str, side: int) -> str:
    resize = f"max_len: {side}" + ("\n      resize_bboxes: true" if side == 512 else "")
    return f"""\
Global:
  model_name: {name}
PreProcess:
  transform_ops:
  - DecodeImage:
      channel_first: false
      img_mode: BGR
  - TableLabelEncode:
      learn_empty_box: false
      loc_reg_num: 8
      max_text_length: 500
      merge_no_span_structure: true
      replace_empty_cell_token: false
  - TableBoxEncode:
      in_box_format: xyxyxyxy
      out_box_format: xyxyxyxy
  - ResizeTableImage:
      {resize}
  - NormalizeImage:
      mean: {list(MEAN)}
      order: hwc
      scale: 1./255.
      std: {list(STD)}
  - PaddingTableImage:
      size: [{side}, {side}]
  - ToCHWImage: null
  - KeepKeys:
      keep_keys: [image, structure, bboxes, bbox_masks, length, shape]
PostProcess:
  name: TableLabelDecode
  merge_no_span_structure: true
  character_dict:
{_yaml_list(STRUCTURE_DICT, 2)}"""


def _cells_yml(name: str) -> str:
    """An RT-DETR export's ``inference.yml`` (the layout stand-ins'), at ``DET_SIDE``, its one class ``cell``."""
    return detr_yml(name, ("cell",), DET_SIDE)


def _sequence(rows: int, cols: int) -> list[tuple[str, tuple[int, int] | None]]:
    """The structure tokens of a rows x cols table, each with its cell (row, column) or None, to TOKENS."""
    seq: list[tuple[str, tuple[int, int] | None]] = [("<tbody>", None)]
    for row in range(rows):
        seq.append(("<tr>", None))
        seq.extend(("<td></td>", (row, col)) for col in range(cols))
        seq.append(("</tr>", None))
    seq.append(("</tbody>", None))
    return seq + [("eos", None)] * (TOKENS - len(seq))


def _grid(fine):
    """The grid of a table's content: ``fine`` is its darkness [N, 1, 2 * VIEW, 2 * VIEW] (0 white, 1
    black). Returns (line strength [N], wired 0/1 [N], rows [N], columns [N] (1..MAX_GRID, float), the
    row boundaries [N, MAX_GRID + 1] and the column boundaries [N, MAX_GRID + 1] as shares of the
    content's height and width)."""
    import paddle

    F = paddle.nn.functional
    view = F.max_pool2d(fine, 2, 2)  # [N, 1, VIEW, VIEW]

    def eroded(value, axis):  # the least over LINE_RUN neighbours along axis (no padding)
        step = 1
        while step < LINE_RUN:
            if axis == 3:
                value = paddle.minimum(value[:, :, :, :-step], value[:, :, :, step:])
            else:
                value = paddle.minimum(value[:, :, :-step, :], value[:, :, step:, :])
            step *= 2
        return value

    across = eroded(F.max_pool2d(view, (3, 1), stride=1, padding=(1, 0)), 3).max(axis=3)[:, 0]  # [N, VIEW]
    down = eroded(F.max_pool2d(view, (1, 3), stride=1, padding=(0, 1)), 2).max(axis=2)[:, 0]
    strength = paddle.maximum(across.max(axis=1), down.max(axis=1))
    ink = (view > 0.35).astype("float32")

    def dilated(profile):  # [N, VIEW] -> the same, each 1 spread 6 either way
        return F.max_pool1d(profile.unsqueeze(1), 13, stride=1, padding=6).squeeze(1)

    ink_rows, ink_cols = dilated(ink.max(axis=3)[:, 0]), dilated(ink.max(axis=2)[:, 0])
    positions = paddle.arange(VIEW).astype("float32") + 0.5
    ks = (paddle.arange(MAX_GRID + 1) + 1).astype("float32")

    def bands(on):
        """``on`` [N, VIEW] 0/1 -> (the number of runs of 1s, the centres of runs 1..MAX_GRID+1, the
        middles of the gaps after them), in view pixels."""
        before = paddle.concat([paddle.zeros_like(on[:, :1]), on[:, :-1]], axis=1)
        starts = on * (1 - before)
        # The run a position is in or after. (Nothing reads ``starts`` after this: Paddle Inference with
        # oneDNN runs this cumsum in place, over ``starts``.)
        ident = paddle.cumsum(starts, axis=1)  # [N, VIEW]
        member = (ident.unsqueeze(1) == ks.reshape([1, -1, 1])).astype("float32")  # [N, K, VIEW]
        inside, gap = member * on.unsqueeze(1), member * (1 - on.unsqueeze(1))
        centres = (inside * positions).sum(axis=2) / paddle.clip(inside.sum(axis=2), min=1.0)
        middles = (gap * positions).sum(axis=2) / paddle.clip(gap.sum(axis=2), min=1.0)
        return ident[:, -1], centres, middles

    n_across, centres_y, _ = bands((across > 0.3).astype("float32"))
    n_down, centres_x, _ = bands((down > 0.3).astype("float32"))
    n_rows, _, middles_y = bands(ink_rows)
    n_cols, _, middles_x = bands(ink_cols)
    wired = (n_across >= 2).astype("float32") * (n_down >= 2).astype("float32")
    index = paddle.arange(MAX_GRID + 1).astype("float32").unsqueeze(0)  # [1, MAX_GRID + 1]

    def wireless_bounds(count, middles):  # 0, the gaps between the count bands, VIEW
        shifted = paddle.concat([paddle.zeros_like(middles[:, :1]), middles[:, :MAX_GRID]], axis=1)
        inner = (index >= 1).astype("float32") * (index < count.unsqueeze(1)).astype("float32")
        return inner * shifted + (1 - inner) * (index >= 1).astype("float32") * VIEW

    def chosen(lines, bounds_lines, ink_count, ink_middles):
        count = wired * (lines - 1) + (1 - wired) * ink_count
        bounds = (wired.unsqueeze(1) * bounds_lines[:, :MAX_GRID + 1]
                  + (1 - wired.unsqueeze(1)) * wireless_bounds(ink_count, ink_middles))
        return paddle.clip(count, min=1.0, max=float(MAX_GRID)), bounds / VIEW

    rows, bounds_y = chosen(n_across, centres_y, n_rows, middles_y)
    cols, bounds_x = chosen(n_down, centres_x, n_cols, middles_x)
    return strength, wired, rows, cols, bounds_y, bounds_x


def _darkness(rgb):
    """[N, 3, H, W] in 0..1 -> [N, 1, H, W] darkness."""
    import paddle

    return paddle.clip(1 - rgb.mean(axis=1, keepdim=True), 0.0, 1.0)


def _resampled(dark, content_w, content_h, width, height):
    """The top-left ``content_w`` x ``content_h`` ([N, 1] each) of ``dark`` [N, 1, height, width], resampled
    (bilinear) to 2 VIEW x 2 VIEW: grid_sample, whose -1..1 spans the input (align_corners=False)."""
    import paddle

    steps = (paddle.arange(2 * VIEW).astype("float32") + 0.5) / (2 * VIEW)  # [2 VIEW]
    gx = (steps.unsqueeze(0) * content_w * 2 / width - 1).unsqueeze(1).expand([-1, 2 * VIEW, -1])
    gy = (steps.unsqueeze(0) * content_h * 2 / height - 1).unsqueeze(2).expand([-1, -1, 2 * VIEW])
    return paddle.nn.functional.grid_sample(dark, paddle.stack([gx, gy], axis=-1), mode="bilinear",
                                            padding_mode="border", align_corners=False)


def _constant(layer, value):
    """A parameter of the export holding ``value`` (float32: integers are cast where used)."""
    import paddle

    value = np.asarray(value, np.float32)
    parameter = layer.create_parameter(list(value.shape), dtype="float32",
                                       default_initializer=paddle.nn.initializer.Assign(value))
    parameter.stop_gradient = True
    return parameter


def table_cls_network():
    """The table classifier stand-in: ``x`` [N, 3, 224, 224] -> softmax [N, 2] (wired, wireless)."""
    import paddle

    F = paddle.nn.functional

    class TableClassifier(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.mean = _constant(self, np.reshape(MEAN, (1, 3, 1, 1)))
            self.std = _constant(self, np.reshape(STD, (1, 3, 1, 1)))

        def forward(self, x):
            dark = _darkness(x * self.std + self.mean)
            side = paddle.zeros_like(dark[:, 0, 0, :1]) + 224  # [N, 1]: all of the crop is content
            strength = _grid(_resampled(dark, side, side, side, side))[0]
            logit = 16 * (strength - 0.25)
            return F.softmax(paddle.stack([logit, -logit], axis=1), axis=-1)

    return TableClassifier()


def _lookup():
    """The token ids, cells and cell flags of every rows x cols table: [MAX_GRID^2, TOKENS] each, the
    row (rows - 1) * MAX_GRID + cols - 1."""
    tokens, cell_rows, cell_cols, is_cell = [], [], [], []
    for rows in range(1, MAX_GRID + 1):
        for cols in range(1, MAX_GRID + 1):
            seq = _sequence(rows, cols)
            tokens.append([DECODED.index(token) for token, _ in seq])
            cell_rows.append([cell[0] if cell else 0 for _, cell in seq])
            cell_cols.append([cell[1] if cell else 0 for _, cell in seq])
            is_cell.append([1.0 if cell else 0.0 for _, cell in seq])
    return tokens, cell_rows, cell_cols, is_cell


def structure_network():
    """The table structure stand-in: ``x`` [N, 3, H, W] (normalised, padded with 0) -> (locations
    [N, TOKENS, 8] as shares of the padded input, structure probabilities [N, TOKENS, 50])."""
    import paddle

    F = paddle.nn.functional

    class Structure(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.mean = _constant(self, np.reshape(MEAN, (1, 3, 1, 1)))
            self.std = _constant(self, np.reshape(STD, (1, 3, 1, 1)))
            tokens, cell_rows, cell_cols, is_cell = _lookup()
            self.tokens, self.is_cell = _constant(self, tokens), _constant(self, is_cell)
            self.cell_rows, self.cell_cols = _constant(self, cell_rows), _constant(self, cell_cols)

        def forward(self, x):
            shape = paddle.shape(x)
            height, width = shape[2].astype("float32"), shape[3].astype("float32")
            content = (paddle.abs(x).max(axis=1, keepdim=True) > 1e-4).astype("float32")  # not padding
            content_w = content.max(axis=2).sum(axis=-1)  # [N, 1]
            content_h = content.max(axis=3).sum(axis=-1)
            dark = _darkness(x * self.std + self.mean) * content
            fine = _resampled(dark, content_w, content_h, width, height)
            _, _, rows, cols, bounds_y, bounds_x = _grid(fine)
            which = ((rows - 1) * MAX_GRID + cols - 1).astype("int64")  # [N]
            tokens = paddle.gather(self.tokens, which).astype("int64")  # [N, TOKENS]
            cell_rows = paddle.gather(self.cell_rows, which).astype("int64")
            cell_cols = paddle.gather(self.cell_cols, which).astype("int64")
            is_cell = paddle.gather(self.is_cell, which)
            xs, ys = bounds_x * content_w / width, bounds_y * content_h / height  # shares of the padded input
            x1, x2 = paddle.take_along_axis(xs, cell_cols, 1), paddle.take_along_axis(xs, cell_cols + 1, 1)
            y1, y2 = paddle.take_along_axis(ys, cell_rows, 1), paddle.take_along_axis(ys, cell_rows + 1, 1)
            locations = paddle.stack([x1, y1, x2, y1, x2, y2, x1, y2], axis=-1) * is_cell.unsqueeze(-1)
            probabilities = F.softmax(12 * F.one_hot(tokens, len(DECODED)), axis=-1)
            return locations, probabilities

    return Structure()


def cells_network():
    """The table cells detector stand-in: ``(im_shape, image, scale_factor) -> (boxes [N * MAX_GRID^2, 6],
    counts [N])``."""
    import paddle

    F = paddle.nn.functional
    slots = MAX_GRID * MAX_GRID

    class Cells(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.slot_rows = _constant(self, [[k // MAX_GRID for k in range(slots)]])
            self.slot_cols = _constant(self, [[k % MAX_GRID for k in range(slots)]])

        def forward(self, im_shape, image, scale_factor):
            fine = F.adaptive_avg_pool2d(_darkness(image), 2 * VIEW)
            _, _, rows, cols, bounds_y, bounds_x = _grid(fine)
            # The original image's size: the input's (im_shape, [h, w]) undone by scale_factor ([h, w]).
            height = (im_shape[:, 0] / scale_factor[:, 0]).unsqueeze(1)
            width = (im_shape[:, 1] / scale_factor[:, 1]).unsqueeze(1)
            slot_rows = (self.slot_rows + paddle.zeros_like(rows).unsqueeze(1))  # [N, slots]
            slot_cols = (self.slot_cols + paddle.zeros_like(cols).unsqueeze(1))
            valid = ((slot_rows < rows.unsqueeze(1)).astype("float32")
                     * (slot_cols < cols.unsqueeze(1)).astype("float32"))  # [N, slots]
            slot_rows, slot_cols = slot_rows.astype("int64"), slot_cols.astype("int64")
            x1 = paddle.take_along_axis(bounds_x, slot_cols, 1) * width
            x2 = paddle.take_along_axis(bounds_x, slot_cols + 1, 1) * width
            y1 = paddle.take_along_axis(bounds_y, slot_rows, 1) * height
            y2 = paddle.take_along_axis(bounds_y, slot_rows + 1, 1) * height
            boxes = paddle.stack([valid - 1, valid * CELL_SCORE, x1 * valid, y1 * valid, x2 * valid,
                                  y2 * valid], axis=-1)  # [N, slots, 6]
            counts = (paddle.zeros_like(scale_factor[:, 0]) + slots).astype("int32")
            return boxes.reshape([-1, 6]), counts

    return Cells()


_STRUCTURE_SPEC_512 = [([None, 3, 512, 512], "float32", "x")]
_CELLS_SPEC = [([None, 2], "float32", "im_shape"), ([None, 3, DET_SIDE, DET_SIDE], "float32", "image"),
               ([None, 2], "float32", "scale_factor")]

MODELS: dict[str, tuple[Callable[[], paddle.nn.Layer], list[tuple[list, str, str]], str]] = {
    TABLE_CLS: (table_cls_network, [([None, 3, 224, 224], "float32", "x")], TABLE_CLS_YML),
    WIRED_STRUCTURE: (structure_network, _STRUCTURE_SPEC_512, _structure_yml(WIRED_STRUCTURE, 512)),
    SLANEXT_WIRELESS: (structure_network, _STRUCTURE_SPEC_512, _structure_yml(SLANEXT_WIRELESS, 512)),
    WIRELESS_STRUCTURE: (structure_network, [([None, 3, None, None], "float32", "x")],
                         _structure_yml(WIRELESS_STRUCTURE, 488)),
    WIRED_CELLS: (cells_network, _CELLS_SPEC, _cells_yml(WIRED_CELLS)),
    WIRELESS_CELLS: (cells_network, _CELLS_SPEC, _cells_yml(WIRELESS_CELLS)),
}

