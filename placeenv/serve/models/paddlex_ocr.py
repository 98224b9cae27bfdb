"""The CPU steps of a PaddleX OCR pipeline (``models/paddlex.py``), with PaddleX's own processors as a
library (``paddlex[ocr-core]``, the service extra): the same page orientation and unwarping (its
``doc_preprocessor`` pipeline's), resize, normalisation, DB postprocess, box sort, crops, text-line
orientation, recogniser groups and CTC decode as PaddleX's ``OCR`` pipeline, so the answers are
PaddleX's. Only the networks run elsewhere: the exports' models, on the devices, batched across requests.
``Classifier`` and ``decoded`` serve the image classification pipeline's steps too.

Each step's settings are its context's ``parameters`` (the pipeline file's, with PaddleX's defaults),
overridden by the request's parameters of PaddleX's ``pipeline.predict`` names (``text_det_thresh`` ...,
protocol/paddlex.py): ``Prepare``'s preprocess checks them all, so a bad one is the request's 400 before
any step runs.
PaddleX is imported when a step's replica loads (about 1.5 s, once a process): a service that serves no
PaddleX pipeline never imports it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..protocol import paddlex as settings_of
from .base import InputError, Model, TensorSpec


def _transform_ops(directory: str) -> tuple[dict, dict]:
    """An export's ``inference.yml``: its preprocessing ops by name, and its ``PostProcess``."""
    import yaml

    found = yaml.safe_load((Path(directory) / "inference.yml").read_text(encoding="utf-8")) or {}
    ops = {name: (args or {}) for op in (found.get("PreProcess") or {}).get("transform_ops") or []
           for name, args in op.items()}
    return ops, found.get("PostProcess") or {}


#: The most pixels an image may claim to be decoded: 2^26, three bytes each as BGR, a 50-megapixel photo
#: with room to spare. A small PNG may decode to gigabytes, and a header may claim any size in a few
#: bytes (OpenCV raises, not refuses, past its own 2^30; docs/models.md).
MAX_DECODED_PIXELS = 1 << 26


def decoded(inputs) -> np.ndarray:
    """A request's one encoded image (its input ``image``), decoded as PaddleX reads it: OpenCV, BGR.
    ``InputError`` naming what to send where it is not one image OpenCV can decode, or its header claims
    over ``MAX_DECODED_PIXELS``."""
    import cv2

    data = inputs["image"].reshape(-1)
    if data.size != 1:
        raise InputError(f"input 'image': one encoded image a request, got {data.size}")
    blob = data[0]
    if not isinstance(blob, (bytes, bytearray)) or not blob:
        raise InputError("input 'image': expected the bytes of an encoded image (JPEG, PNG, BMP, TIFF, WebP)")
    size = settings_of.claimed_size(blob)
    if size is None or size[0] * size[1] > MAX_DECODED_PIXELS:
        from PIL import Image

        pixels = size[0] * size[1] if size else 2 * (Image.MAX_IMAGE_PIXELS or 0)  # (at least Pillow's limit)
        claims = f"{'' if size else 'over '}{pixels / 1e6:.0f} million"
        raise InputError(f"input 'image': its header claims {claims} pixels ({len(blob)} bytes); send an image of at "
                         f"most {MAX_DECODED_PIXELS >> 20} million pixels (a 12-megapixel photo is fine)")
    image = cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise InputError(f"input 'image': not an image OpenCV can decode ({len(blob)} bytes, starting "
                         f"{bytes(blob[:8])!r}); send a JPEG, PNG, BMP, TIFF or WebP file's bytes")
    return image


#: The most pixels a classifier's resize may make of one image (``check_resize``).
MAX_RESIZED_PIXELS = 1 << 24


def check_resize(image: np.ndarray, short: int | None) -> None:
    """``InputError`` for an image whose classifier resize (its shorter side to ``short``, the export's
    ``resize_short``; None: a fixed size) would make over ``MAX_RESIZED_PIXELS``: a thin strip of a few bytes
    would otherwise take gigabytes. Run in ``preprocess``, where the replica may not be loaded."""
    height, width = image.shape[:2]
    if short and short * short * max(height, width) / max(min(height, width), 1) > MAX_RESIZED_PIXELS:
        raise InputError(f"input 'image': {width}x{height} px, its shorter side resized to {short} px for the "
                         f"classifier, would make over {MAX_RESIZED_PIXELS // 1_000_000} million pixels; send an image "
                         f"whose sides are within 1:{MAX_RESIZED_PIXELS // short ** 2}")


class Classifier:
    """PaddleX's image classification processors for an export, from its ``inference.yml`` as PaddleX's
    ``ClasRunnerPredictor`` builds them: the images (BGR, as the pipeline holds them) read as RGB,
    resized (``ResizeImage``), cropped (``CropImage``), normalised and batched; the network's scores to
    classes by ``Topk``."""

    def __init__(self, directory: str):
        from paddlex.inference.common.reader import ReadImage
        from paddlex.inference.models.common import Normalize, Resize, ResizeByShort, ToBatch, ToCHWImage
        from paddlex.inference.models.image_classification.processors import Crop, Topk

        ops, post = _transform_ops(directory)
        self.steps = [ReadImage(format="RGB")]
        resize = ops.get("ResizeImage") or {}
        interp, backend = resize.get("interpolation", "LINEAR"), resize.get("backend", "cv2")
        if resize.get("resize_short"):
            self.steps.append(ResizeByShort(target_short_edge=resize["resize_short"], size_divisor=None,
                                            interp=interp, backend=backend))
        elif resize.get("size"):
            self.steps.append(Resize(target_size=resize["size"], size_divisor=None, interp=interp, backend=backend))
        else:  # as PaddleX's predictor: it asserts one (models/paddlex.py refuses such a file at start)
            raise ValueError(f"{directory}/inference.yml: ResizeImage gives neither size nor resize_short")
        if "CropImage" in ops:
            self.steps.append(Crop(crop_size=(ops["CropImage"] or {}).get("size", 224)))
        norm = ops.get("NormalizeImage") or {}
        self.steps += [Normalize(scale=norm.get("scale", 1 / 255), mean=norm.get("mean", [0.485, 0.456, 0.406]),
                                 std=norm.get("std", [0.229, 0.224, 0.225])), ToCHWImage()]
        self.batch = ToBatch()
        topk = post.get("Topk") or {}
        self.topk = Topk(class_ids=topk.get("label_list"))
        self.default_topk = int(topk.get("topk", 1))

    def prepare(self, images: list[np.ndarray]) -> np.ndarray:
        for step in self.steps:
            images = step(images)
        return self.batch(images)[0]

    def top(self, scores: np.ndarray, k: int | None = None):
        """PaddleX's ``Topk``: per image its class ids, scores and label names, best first."""
        return self.topk([scores], topk=k or self.default_topk)


class Prepare(Model):
    """A PaddleX OCR pipeline's first step, on the CPU: an encoded image decoded (OpenCV, BGR, as PaddleX
    reads it); with the document preprocessor, turned upright by the page-orientation classifier's angle
    and flattened by the unwarping model, as PaddleX's ``doc_preprocessor`` pipeline does; resized and
    normalised for the text detector by PaddleX's own processors."""

    inputs = (TensorSpec("image", "BYTES", (1,)),)
    outputs = (TensorSpec("x", "FP32", (1, 3, -1, -1)), TensorSpec("page", "UINT8", (1, -1, -1, 3)),
               TensorSpec("shape", "FP64", (1, 4)), TensorSpec("doc_preprocessor_angle", "INT32", (1,)))

    def load(self, context):
        from paddlex.inference.models.common.vision.processors import ToCHWImage
        from paddlex.inference.models.text_detection.processors import DetResizeForTest, NormalizeImage

        self.settings = context.parameters["detection"]
        ops, _ = _transform_ops(context.parameters["det_dir"])
        # As PaddleX's text detection predictor: the pipeline's limit_side_len and limit_type win.
        extra = {k: v for k, v in ops["DetResizeForTest"].items()
                 if k not in ("limit_side_len", "limit_type", "resize_long", "max_side_limit")}
        self.resize = DetResizeForTest(limit_side_len=self.settings["limit_side_len"],
                                       limit_type=self.settings["limit_type"],
                                       max_side_limit=self.settings["max_side_limit"], **extra)
        norm = ops["NormalizeImage"]
        self.normalize = NormalizeImage(scale=norm.get("scale"), mean=norm.get("mean"), std=norm.get("std"),
                                        order=norm.get("order", ""))
        self.chw = ToCHWImage()
        parameters = context.parameters
        self.doc, self.io = parameters.get("doc"), parameters["io"]
        self.orientation = self.unwarping = None
        if parameters.get("orientation_model") is not None:
            from paddlex.inference.pipelines.components.common.warp_image import rotate_image

            self.orientation, self.rotate = Classifier(parameters["orientation_dir"]), rotate_image
            self.orientation_model = parameters["orientation_model"]
        if parameters.get("unwarping_model") is not None:
            from paddlex.inference.models.common import Normalize, ToBatch
            from paddlex.inference.models.image_unwarping.processors import DocTrPostProcess

            # PaddleX's WarpRunnerPredictor's processors (it reads no inference.yml for them).
            self.unwarping = (Normalize(mean=0.0, std=1.0, scale=1.0 / 255), ToCHWImage(), ToBatch())
            self.unwarped, self.unwarping_model = DocTrPostProcess(), parameters["unwarping_model"]
        return None

    def preprocess(self, inputs):
        asked = settings_of.requested(self.request_parameters)  # every OCR setting, Read's too: a bad one is a 400
        # (On the replica that only preprocesses too, which is not loaded: its context says.)
        doc = settings_of.doc_preprocessing(self.context.parameters.get("doc"), asked)
        settings_of.textline_orientation(self.context.parameters.get("textline_model") is not None, asked)
        page = decoded(inputs)
        if (doc or {}).get("use_doc_orientation_classify"):
            check_resize(page, self.context.parameters["orientation_short"])
        return {"image": page[None]}

    def execute(self, inputs):
        page, angle = inputs["image"].numpy()[0], -1
        doc = settings_of.doc_preprocessing(self.doc, self.request_parameters)
        if doc and doc["use_doc_orientation_classify"]:
            given, answer = self.io["DocOrientationClassify"]
            scores = self.infer(self.orientation_model, {given: self.orientation.prepare([page])}, [answer],
                                parameters={})
            _, _, labels = self.orientation.top(scores[answer], 1)
            angle = int(labels[0][0])  # PaddleX's: the class's name is the angle that sets the page upright
            page = self.rotate(page, angle)
        if doc and doc["use_doc_unwarping"]:
            normalize, chw, batch = self.unwarping
            given, answer = self.io["DocUnwarping"]
            flat = self.infer(self.unwarping_model, {given: batch(chw(normalize([page])))[0]}, [answer], parameters={})
            # PaddleX's: DocTrPostProcess reverses the model's channels (BGR, as it was given the page), and its
            # pipeline reverses them back.
            page = np.ascontiguousarray(self.unwarped([flat[answer]])[0][:, :, ::-1])
        settings, _ = settings_of.used(self.settings, {}, self.request_parameters)
        resized, shapes = self.resize([page], limit_side_len=settings["limit_side_len"],
                                      limit_type=settings["limit_type"], max_side_limit=settings["max_side_limit"])
        x = self.chw(self.normalize(resized))[0]
        return {"x": np.ascontiguousarray(x[None], dtype=np.float32), "page": page[None],
                "shape": np.asarray(shapes, dtype=np.float64).reshape(1, 4),
                "doc_preprocessor_angle": np.asarray([angle], dtype=np.int32)}


class Read(Model):
    """A PaddleX OCR pipeline's last step, on the CPU: the detector's map to text boxes (PaddleX's DB
    postprocess), sorted and cut out; the crops read by the recogniser in PaddleX's groups (by width
    ratio, its batch size each), all groups queued at once; CTC-decoded; kept above the score threshold."""

    inputs = (TensorSpec("maps", "FP32", (1, 1, -1, -1)), TensorSpec("page", "UINT8", (1, -1, -1, 3)),
              TensorSpec("shape", "FP64", (1, 4)))
    outputs = (TensorSpec("rec_texts", "BYTES", (-1,)), TensorSpec("rec_scores", "FP32", (-1,)),
               TensorSpec("rec_polys", "INT32", (-1, 4, 2)), TensorSpec("rec_boxes", "INT32", (-1, 4)),
               TensorSpec("dt_polys", "INT32", (-1, 4, 2)), TensorSpec("textline_orientation_angles", "INT32", (-1,)))

    def load(self, context):
        from paddlex.inference.models.text_detection.processors import DBPostProcess
        from paddlex.inference.models.text_recognition.processors import CTCLabelDecode, OCRReisizeNormImg
        from paddlex.inference.models.text_recognition.processors import ToBatch
        from paddlex.inference.pipelines.components.common.convert_points_and_boxes import convert_points_to_boxes
        from paddlex.inference.pipelines.components.common.crop_image_regions import CropByPolys
        from paddlex.inference.pipelines.components.common.sort_boxes import SortQuadBoxes

        parameters = context.parameters
        self.detection, self.recognition = parameters["detection"], parameters["recognition"]
        self.rec_model, self.io = parameters["rec_model"], parameters["io"]
        _, post = _transform_ops(parameters["det_dir"])
        self.post = DBPostProcess(thresh=self.detection["thresh"], box_thresh=self.detection["box_thresh"],
                                  unclip_ratio=self.detection["unclip_ratio"],
                                  max_candidates=post.get("max_candidates", 1000),
                                  use_dilation=post.get("use_dilation", False),
                                  score_mode=post.get("score_mode", "fast"), box_type=post.get("box_type", "quad"))
        rec_ops, rec_post = _transform_ops(parameters["rec_dir"])
        self.rec_resize = OCRReisizeNormImg(rec_image_shape=rec_ops["RecResizeImg"]["image_shape"])
        self.rec_batch = ToBatch()
        self.decode = CTCLabelDecode(character_list=rec_post["character_dict"])
        self.sort, self.crop, self.boxes = SortQuadBoxes(), CropByPolys(det_box_type="quad"), convert_points_to_boxes
        self.textline = None  # the file turns text-line orientation on exactly where it gives the model
        if parameters.get("textline_model") is not None:
            from paddlex.inference.pipelines.components.common.warp_image import rotate_image

            self.textline = Classifier(parameters["textline_dir"])
            self.textline_model, self.textline_batch = parameters["textline_model"], parameters["textline_batch_size"]
            self.rotate = rotate_image
        return None

    def execute(self, inputs):
        maps, page = inputs["maps"].numpy(), inputs["page"].numpy()[0]
        shapes = inputs["shape"].numpy()
        detection, recognition = settings_of.used(self.detection, self.recognition, self.request_parameters)
        polys, _ = self.post([maps], shapes, thresh=detection["thresh"], box_thresh=detection["box_thresh"],
                             unclip_ratio=detection["unclip_ratio"])
        polys = self.sort(polys[0])
        kept = [(crop, poly) for crop, poly in zip(self.crop(page, polys), polys)
                if crop.size > 0 and crop.shape[0] > 0 and crop.shape[1] > 0]
        crops = [crop for crop, _ in kept]
        angles = [-1] * len(crops)
        if crops and settings_of.textline_orientation(self.textline is not None, self.request_parameters):
            # PaddleX's: each crop classified, class 1 (180 degrees) turned before it is read.
            angles = self._orientations(crops)
            crops = [self.rotate(crop, angle * 180) for crop, angle in zip(crops, angles)]
        read = self._read(crops)
        threshold = recognition["score_thresh"]
        found = [(text, score, poly) for (text, score), (_, poly) in zip(read, kept) if score >= threshold]
        rec_polys = np.asarray([poly for *_, poly in found], dtype=np.int32).reshape(-1, 4, 2)
        return {
            "rec_texts": np.array([text.encode() for text, *_ in found], dtype=object),
            "rec_scores": np.asarray([score for _, score, _ in found], dtype=np.float32),
            "rec_polys": rec_polys,
            "rec_boxes": np.asarray(self.boxes(rec_polys), dtype=np.int32).reshape(-1, 4) if found
            else np.zeros((0, 4), np.int32),
            "dt_polys": np.asarray([poly for _, poly in kept], dtype=np.int32).reshape(-1, 4, 2),
            "textline_orientation_angles": np.asarray(angles, dtype=np.int32),
        }

    def _orientations(self, crops: list[np.ndarray]) -> list[int]:
        """Each crop's class by the text-line orientation model (0: upright, 1: turned 180 degrees), in
        groups of its batch size, all queued at once (a crop's class does not depend on its group)."""
        groups = [crops[start:start + self.textline_batch] for start in range(0, len(crops), self.textline_batch)]
        given, scores = self.io["TextLineOrientation"]
        answers = self.infer_all(self.textline_model, [{given: self.textline.prepare(group)} for group in groups],
                                 [scores], parameters={})
        found = []
        for answer in answers:
            ids, _, _ = self.textline.top(answer[scores], 1)
            found.extend(int(row[0]) for row in ids)
        return found

    def _read(self, crops: list[np.ndarray]) -> list[tuple[str, float]]:
        """Each crop's text and score, in the crops' order: PaddleX's groups (sorted by width/height, its
        batch size each, each padded to its widest), every group queued at once to the recogniser."""
        order = sorted(range(len(crops)), key=lambda i: crops[i].shape[1] / float(crops[i].shape[0]))
        size = self.recognition["batch_size"]
        groups = [order[start:start + size] for start in range(0, len(order), size)]
        batches = [self.rec_batch(self.rec_resize([crops[i] for i in group]))[0] for group in groups]
        # The recogniser reads no parameters: called without the request's ({}), its crops share forward
        # passes with every request's, whatever their settings (a batch joins only equal parameters).
        given, probabilities = self.io["TextRecognition"]
        answers = self.infer_all(self.rec_model, [{given: batch} for batch in batches], outputs=[probabilities],
                                 parameters={})
        found: dict[int, tuple[str, float]] = {}
        for group, answer in zip(groups, answers):
            texts, scores = self.decode([answer[probabilities]])
            found.update((i, (text, float(score))) for i, text, score in zip(group, texts, scores))
        return [found[i] for i in range(len(crops))]
