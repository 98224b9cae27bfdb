"""The classification pipeline's last step, on the CPU: logits -> the 3 likeliest labels (the config's
``labels``) and their probabilities, worked out on the host in execute."""

import numpy as np

from placeenv.serve.models import Model as Base
from placeenv.serve.models import TensorSpec
from placeenv.serve.models.examples import top_labels

TOP_K = 3


class Model(Base):
    inputs = (TensorSpec("logits", "FP32", (-1, 10)),)
    outputs = (TensorSpec("labels", "BYTES", (-1, TOP_K)), TensorSpec("scores", "FP32", (-1, TOP_K)))

    def load(self, context):
        self.labels = np.array([name.encode() for name in context.parameters["labels"]], dtype=object)
        return None

    def execute(self, inputs):
        labels, scores = top_labels(inputs["logits"].numpy(), self.labels, TOP_K)
        return {"labels": labels, "scores": scores}
