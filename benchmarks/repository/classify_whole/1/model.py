"""The classify pipeline's chain inside one model.py, for benchmarks/pipelines.py: the JPEG decoded in
preprocess (as classify_decode does), mobilenet's saved program run in execute, the top 3 labels taken
in postprocess (as classify_topk does, here on the device's worker)."""

import numpy as np
import paddle

from placeenv.serve.models import BUNDLED, Model as Base, TensorSpec, examples
from placeenv.serve.models.images import decode_all
from placeenv.serve.models.repository import read_config
from placeenv.tensors import JIT_LOAD_LOCK

LABELS = np.array([name.encode() for name in read_config("classify_topk", BUNDLED / "classify_topk")[0]
                   .parameters["labels"]], dtype=object)


class Model(Base):
    inputs = (TensorSpec("image", "BYTES", (-1,)),)
    outputs = (TensorSpec("labels", "BYTES", (-1, 3)), TensorSpec("scores", "FP32", (-1, 3)))

    def load(self, context):
        with JIT_LOAD_LOCK:
            return paddle.jit.load(str(examples.home("mobilenet") / "1" / "model"))

    def preprocess(self, inputs):
        return {"image": decode_all(inputs["image"], "image", mode="RGB", size=(32, 32))}

    def execute(self, inputs):
        with self._env, paddle.no_grad():
            return {"logits": self.network(inputs["image"])}

    def postprocess(self, outputs):
        labels, scores = examples.top_labels(outputs["logits"].numpy(), LABELS, 3)
        return {"labels": labels, "scores": scores}
