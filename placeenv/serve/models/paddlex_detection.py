"""The CPU steps of a PaddleX object detection pipeline (``models/paddlex.py``), with PaddleX's own
processors as a library, as ``models/paddlex_ocr.py``'s: the image decoded and prepared as PaddleX's
``DetRunnerPredictor`` builds its steps from the export's ``inference.yml`` and the file's ``img_size``
(``Detector``), the network's boxes filtered and shaped by PaddleX's ``DetPostProcess``. The network runs
elsewhere: the export's model, on the devices, batched across requests (``per_image`` gives its answers
a row an image).

The request parameter ``threshold`` (PaddleX's name) sets the score a box must pass: a number from 0 to 1,
or per class (``protocol/paddlex.threshold``); without it, the file's ``threshold``, else the export's
``draw_threshold``, else 0.5, as PaddleX's predictor takes it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

from ..protocol import paddlex as settings_of
from .base import Model, TensorSpec
from .paddlex_ocr import decoded

#: The inputs PaddleX's ``ToBatch`` makes for a detector, in the order it feeds them (the export's inputs
#: in theirs), as ``Prepare`` hands them on: the resized image's [h, w], the image, its [h, w] scales.
BATCH_KEYS = ("img_size", "img", "scale_factors")
OUTPUTS = (TensorSpec("class_ids", "INT32", (-1,)), TensorSpec("scores", "FP32", (-1,)),
           TensorSpec("label_names", "BYTES", (-1,)), TensorSpec("coordinates", "FP32", (-1, 4)))
#: The file's settings PaddleX's object detection pipeline hands its model (``SubModules.ObjectDetection``),
#: each with its check and what to give instead.
MODES = ("union", "large", "small")
SETTINGS = {
    "img_size": (lambda v: (type(v) is int and v > 0) or _pair(v, int), "a whole number of pixels, or [width, height]"),
    "threshold": (lambda v: settings_of.is_score(v) or _per_class(v, settings_of.is_score),
                  "a number from 0 to 1, or per class id such a number"),
    "layout_nms": (lambda v: isinstance(v, bool), "true or false"),
    "layout_unclip_ratio": (lambda v: type(v) is float or _pair(v, (int, float)) or _per_class(
        v, lambda r: _pair(r, (int, float))),
        "a number with a point, [width, height], or per class id [width, height]"),
    "layout_merge_bboxes_mode": (lambda v: v in MODES or _per_class(v, lambda m: m in MODES),
                                 "union, large or small, or per class id one of them"),
}
#: The Preprocess steps PaddleX's detection predictor builds.
PREPROCESS = ("Resize", "NormalizeImage", "Permute", "Pad", "PadStride", "WarpAffine")


def _pair(value, kinds) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 2 and all(
        isinstance(v, kinds) and not isinstance(v, bool) and v > 0 for v in value)


def _per_class(value, check) -> bool:
    return isinstance(value, dict) and all(type(k) is int and check(v) for k, v in value.items())


def read_config(directory: str | Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load((Path(directory) / "inference.yml").read_text(encoding="utf-8")) or {}


def file_settings(module: dict[str, Any]) -> dict[str, Any]:
    """The file's settings of its detector (``SETTINGS``), those it leaves out None; ``ValueError`` naming
    the first that PaddleX's predictor would refuse or fail on. A whole-number threshold becomes a float:
    PaddleX's postprocess filters by a float or a dict only, so its 1 would pass every box."""
    found = {setting: module.get(setting) for setting in SETTINGS}
    for setting, value in found.items():
        check, wanted = SETTINGS[setting]
        if value is not None and not check(value):
            raise ValueError(f"{setting} {value!r}: give {wanted}, or leave it out")
    if found["threshold"] is not None and not isinstance(found["threshold"], dict):
        found["threshold"] = float(found["threshold"])
    return found


def inspected(directory: Path, module: dict[str, Any], settings: dict[str, Any]) -> "Detector":
    """The file's detector's processors, built as the service builds them (PaddleX imported): ``ValueError``
    saying what is wrong where the export's ``inference.yml`` is not one PaddleX's detection predictor runs,
    its model name is not the file's, or PaddleX refuses the settings for it."""
    config = read_config(directory)
    steps = config.get("Preprocess")
    unknown = [step.get("type") if isinstance(step, dict) else step for step in steps or []
               if not isinstance(step, dict) or step.get("type") not in PREPROCESS]
    if not isinstance(steps, list) or unknown or not isinstance(config.get("label_list"), list):
        what = f"Preprocess steps {unknown} PaddleX does not build" if unknown else "no Preprocess list or label_list"
        raise ValueError(f"{directory / 'inference.yml'} is not a detector's inference.yml ({what}): give the "
                         "model_dir of its PaddleX export")
    given, exported = module.get("model_name"), (config.get("Global") or {}).get("model_name")
    if given and exported and given != exported:  # (PaddleX's resolve_model_name refuses it too)
        raise ValueError(f"model_name {given!r}, but {directory / 'inference.yml'} is {exported!r}'s: give the "
                         "model_dir of the model named, or its name")
    try:
        return Detector(config, str(given or exported or ""), settings)
    except Exception as exc:  # noqa: BLE001 - what PaddleX refuses in the export or the file, said
        raise ValueError(f"PaddleX cannot build its processors: {type(exc).__name__}: {exc}") from None


class Detector:
    """PaddleX's detection processors for an export, built by PaddleX's own ``DetRunnerPredictor._build``
    from its ``inference.yml`` (``config``) and the file's settings, without its predictor (which would load
    the network): the steps that prepare an image, the keys ``ToBatch`` feeds, ``DetPostProcess``."""

    @classmethod
    def of(cls, context) -> "Detector":
        """A CPU step's: its context's ``parameters`` (``models/paddlex._detection``'s settings)."""
        parameters = context.parameters
        return cls(read_config(parameters["dir"]), parameters["model_name"], parameters["settings"])

    def __init__(self, config: dict[str, Any], model_name: str, settings: dict[str, Any]):
        from paddlex.inference.models.object_detection.predictor import DetRunnerPredictor
        from paddlex.inference.models.object_detection.utils import STATIC_SHAPE_MODEL_LIST

        img_size = settings.get("img_size")
        if img_size is not None and model_name in STATIC_SHAPE_MODEL_LIST:  # as PaddleX's predictor asserts
            raise ValueError(f"img_size: {model_name} takes images of one size; leave img_size out")

        class Built:  # what _build reads of a predictor
            _FUNC_MAP = DetRunnerPredictor._FUNC_MAP
            build_resize = DetRunnerPredictor.build_resize
            build_to_batch = DetRunnerPredictor.build_to_batch
            build_postprocess = DetRunnerPredictor.build_postprocess

        built = Built()
        built.config, built.model_name = copy.deepcopy(config), model_name  # (_build pops keys)
        self.model_name = model_name
        built.img_size = (img_size, img_size) if isinstance(img_size, int) else img_size
        built.threshold = settings.get("threshold")
        built.layout_nms = settings.get("layout_nms")
        unclip = settings.get("layout_unclip_ratio")
        built.layout_unclip_ratio = (unclip, unclip) if isinstance(unclip, float) else unclip
        built.layout_merge_bboxes_mode = settings.get("layout_merge_bboxes_mode")
        pre, self.post = DetRunnerPredictor._build(built)
        self.steps, self.batch = pre[:-1], pre[-1]
        self.keys = tuple(self.batch.ordered_required_keys)
        self.threshold, self.layout_nms = built.threshold, built.layout_nms
        self.layout_unclip_ratio = built.layout_unclip_ratio
        self.layout_merge_bboxes_mode = built.layout_merge_bboxes_mode

    def prepare(self, image: np.ndarray) -> dict[str, np.ndarray]:
        """One image (BGR) as ``ToBatch`` makes each of ``BATCH_KEYS`` (the network takes ``keys``), a row each."""
        datas = [image]
        for step in self.steps:
            datas = step(datas)
        return {key: self.batch.apply(datas, key) for key in BATCH_KEYS}

    def boxes(self, found: np.ndarray, size: tuple[int, int], threshold) -> list[dict]:
        """One image's boxes (the network's ``[M, 6]``) as PaddleX's predictor answers them: over the threshold,
        inside the image ``size`` (w, h), each ``cls_id``, ``label``, ``score``, ``coordinate``. An image
        without boxes has none (PaddleX's postprocess fails on it with a per-class threshold and NMS)."""
        if found.shape[-1] not in (6, 7, 8):
            raise RuntimeError(f"the detector answers boxes of {found.shape[-1]} numbers; served: 6 (class, score, "
                               "x1, y1, x2, y2), and 7 or 8 of ordered layout detectors")
        if not len(found):
            return []
        return self.post([{"boxes": found}], [{"ori_img_size": list(size)}],
                         threshold=self.threshold if threshold is None else threshold, layout_nms=self.layout_nms,
                         layout_unclip_ratio=self.layout_unclip_ratio,
                         layout_merge_bboxes_mode=self.layout_merge_bboxes_mode)[0]


def per_image(model_class: type[Model], boxes: str, counts: str) -> type[Model]:
    """``model_class`` with its answers a row an image, so that requests share its forward passes: a
    PaddleDetection export answers its batch's boxes all in one ``[M, 6]`` (``boxes``) and how many are
    each image's (``counts``, ``[N]``), which become ``[N, K, 6]``, each image's boxes first, the rest
    rows of -1 (the next step takes ``counts`` of them)."""

    class PerImage(model_class):
        def postprocess(self, outputs):
            found = super().postprocess(outputs)
            rows, numbers = np.asarray(found[boxes]), np.asarray(found[counts]).astype(np.int64).reshape(-1)
            if numbers.sum() != len(rows):
                raise RuntimeError(f"the detector answered {len(rows)} boxes, its {counts} says {int(numbers.sum())}")
            shaped = np.full((len(numbers), int(numbers.max(initial=0)), *rows.shape[1:]), -1, rows.dtype)
            starts = np.concatenate([[0], np.cumsum(numbers)])
            for i, number in enumerate(numbers):
                shaped[i, :number] = rows[starts[i]:starts[i + 1]]
            found[boxes] = shaped
            return found

    PerImage.__name__ = PerImage.__qualname__ = f"PerImage{model_class.__name__}"
    return PerImage


class Prepare(Model):
    """A PaddleX object detection pipeline's first step, on the CPU: an encoded image decoded (OpenCV, BGR,
    as PaddleX serving reads it) and prepared for the detector by PaddleX's own processors."""

    inputs = (TensorSpec("image", "BYTES", (1,)),)
    outputs = (TensorSpec("img_size", "FP32", (1, 2)), TensorSpec("img", "FP32", (1, 3, -1, -1)),
               TensorSpec("scale_factors", "FP32", (1, 2)), TensorSpec("size", "INT32", (1, 2)))

    def load(self, context):
        self.detector = Detector.of(context)
        return None

    def preprocess(self, inputs):
        settings_of.threshold(self.request_parameters)  # a bad threshold is the request's 400 before any step runs
        return {"image": decoded(inputs)[None]}

    def execute(self, inputs):
        image = inputs["image"].numpy()[0]
        found = self.detector.prepare(image)
        return {**{key: np.ascontiguousarray(found[key], dtype=np.float32) for key in BATCH_KEYS},
                "size": np.asarray([[image.shape[1], image.shape[0]]], np.int32)}


class Boxes(Model):
    """A PaddleX object detection pipeline's last step, on the CPU: the detector's boxes for one image
    filtered and shaped by PaddleX's ``DetPostProcess``: class ids, scores, label names and coordinates
    ``[x1, y1, x2, y2]`` in the image, in the detector's order."""

    inputs = (TensorSpec("detections", "FP32", (1, -1, -1)), TensorSpec("counts", "INT32", (1,)),
              TensorSpec("size", "INT32", (1, 2)))
    outputs = OUTPUTS

    def load(self, context):
        self.detector = Detector.of(context)
        return None

    def execute(self, inputs):
        found = inputs["detections"].numpy()[0][:int(inputs["counts"].numpy()[0])]
        width, height = (int(v) for v in inputs["size"].numpy()[0])
        boxes = self.detector.boxes(found, (width, height), settings_of.threshold(self.request_parameters))
        return {"class_ids": np.asarray([b["cls_id"] for b in boxes], np.int32),
                "scores": np.asarray([b["score"] for b in boxes], np.float32),
                "label_names": np.array([str(b["label"]).encode() for b in boxes], dtype=object),
                "coordinates": np.asarray([b["coordinate"] for b in boxes], np.float32).reshape(-1, 4)}
