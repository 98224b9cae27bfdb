"""The CPU steps of a PaddleX image classification pipeline (``models/paddlex.py``), with PaddleX's own
processors as a library, as ``models/paddlex_ocr.py``'s: the image decoded and prepared as the export's
``inference.yml`` says (``paddlex_ocr.Classifier``, PaddleX's ``ClasRunnerPredictor``'s processors), the
network's scores to the best classes by PaddleX's ``Topk``. The network runs elsewhere: the export's model,
on the devices, batched across requests.

The request parameter ``topk`` (PaddleX's name; a whole number from 1) sets how many classes an answer
lists; without it, the file's ``topk``, else the export's ``inference.yml``'s, as PaddleX serving answers.
"""

from __future__ import annotations

import numpy as np

from ..protocol import paddlex as settings_of
from .base import Model, TensorSpec
from .paddlex_ocr import Classifier, check_resize, decoded

OUTPUTS = (TensorSpec("class_ids", "INT32", (-1,)), TensorSpec("scores", "FP32", (-1,)),
           TensorSpec("label_names", "BYTES", (-1,)))


class Prepare(Model):
    """A PaddleX image classification pipeline's first step, on the CPU: an encoded image decoded (OpenCV,
    BGR, as PaddleX serving reads it) and prepared for the classifier by PaddleX's own processors."""

    inputs = (TensorSpec("image", "BYTES", (1,)),)
    outputs = (TensorSpec("x", "FP32", (1, 3, -1, -1)),)

    def load(self, context):
        self.classifier = Classifier(context.parameters["dir"])
        return None

    def preprocess(self, inputs):
        settings_of.topk(self.request_parameters)  # a bad topk is the request's 400 before any step runs
        image = decoded(inputs)
        check_resize(image, self.context.parameters["short"])
        return {"image": image[None]}

    def execute(self, inputs):
        x = self.classifier.prepare([inputs["image"].numpy()[0]])
        return {"x": np.ascontiguousarray(x, dtype=np.float32)}


class Top(Model):
    """A PaddleX image classification pipeline's last step, on the CPU: the classifier's scores to its best
    classes (PaddleX's ``Topk``: ids, scores rounded to 5 places, names), best first."""

    inputs = (TensorSpec("probabilities", "FP32", (1, -1)),)
    outputs = OUTPUTS

    def load(self, context):
        self.classifier = Classifier(context.parameters["dir"])
        self.topk = context.parameters["topk"] or self.classifier.default_topk
        return None

    def execute(self, inputs):
        ids, scores, names = self.classifier.top(inputs["probabilities"].numpy(),
                                                 settings_of.topk(self.request_parameters) or self.topk)
        return {"class_ids": np.asarray(ids[0], dtype=np.int32), "scores": np.asarray(scores[0], dtype=np.float32),
                "label_names": np.array([name.encode() for name in names[0]], dtype=object)}
