"""The classify pipeline's chain inside one model.py, for benchmarks/pipelines.py: the JPEG decoded in
preprocess (as classify_decode does), mobilenet's saved program (which the benchmark copies beside this
file) run in execute, the top 3 labels taken in postprocess (as classify_topk does, here on the device's
worker). With ``parameters.sleep_ms`` (--device-ms), execute is mobilenet_time's instead: that much
device time a batch, none on the host."""

import threading
import time

import numpy as np
import paddle

from placeenv import device_name
from placeenv.serve.models import BUNDLED, Model as Base, TensorSpec
from placeenv.serve.models.examples import top_labels
from placeenv.serve.models.images import decode_all
from placeenv.serve.models.configs import read_config

LABELS = np.array([name.encode() for name in read_config("classify_topk", BUNDLED / "classify_topk")[0]
                   .parameters["labels"]], dtype=object)
_ENGINES: dict[str, threading.Lock] = {}  # as mobilenet_time's: a device's one engine


class Model(Base):
    inputs = (TensorSpec("image", "BYTES", (-1,)),)
    outputs = (TensorSpec("labels", "BYTES", (-1, 3)), TensorSpec("scores", "FP32", (-1, 3)))

    def load(self, context):
        return None if "sleep_ms" in context.parameters else super().load(context)

    def preprocess(self, inputs):
        return {"image": decode_all(inputs["image"], "image", mode="RGB", size=(32, 32))}

    def execute(self, inputs):
        if self.network is not None:
            return super().execute(inputs)
        with _ENGINES.setdefault(device_name(self.place), threading.Lock()):
            time.sleep(float(self.context.parameters["sleep_ms"]) / 1000)  # releases the GIL
        with self._env:
            return {"logits": paddle.tile(inputs["image"].mean(axis=[2, 3]), [1, 4])[:, :10]}

    def postprocess(self, outputs):
        (logits,) = outputs.values()
        labels, scores = top_labels(logits.numpy(), LABELS, 3)
        return {"labels": labels, "scores": scores}
