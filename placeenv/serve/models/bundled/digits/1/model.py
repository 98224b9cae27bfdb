"""digits: the saved MLP (model.json) with pre- and post-processing for clients.

Pixels are checked to be in [0, pixel_max] (config.yaml's parameters) and scaled
to [0, 1]; the logits become a label and softmax probabilities. preprocess runs
on the service's CPU threads, on an instance that has ``context`` but no network.
"""

import numpy as np

from placeenv.serve.models import InputError, TensorSpec
from placeenv.serve.models import Model as Base
from placeenv.serve.models.base import softmax


class Model(Base):
    inputs = (TensorSpec("pixels", "FP32", (-1, 64)),)
    outputs = (TensorSpec("label", "INT64", (-1,)), TensorSpec("probabilities", "FP32", (-1, 10)))

    def preprocess(self, inputs):
        pixels = inputs["pixels"]
        top = np.float32(self.context.parameters.get("pixel_max", 16))
        if not (0.0 <= pixels.min(initial=0.0) and pixels.max(initial=0.0) <= top):  # NaN fails both
            at = tuple(int(i) for i in np.unravel_index(int(np.argmax(~((pixels >= 0) & (pixels <= top)))),
                                                         pixels.shape))
            raise InputError(f"input 'pixels' has value {pixels[at]:g} at position {list(at)}; "
                             f"expected pixels in [0, {top:g}]")
        return {"pixels": pixels / top}

    def postprocess(self, outputs):
        (logits,) = outputs.values()
        probabilities = softmax(logits.numpy())
        return {"label": probabilities.argmax(axis=1).astype(np.int64), "probabilities": probabilities}
