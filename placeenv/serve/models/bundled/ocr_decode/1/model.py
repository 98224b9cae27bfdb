"""The OCR pipeline's first step, on the CPU: a PNG or JPEG page -> grey pixels [1, 32, 128] in [0, 1]."""

from placeenv.serve.models import Model as Base
from placeenv.serve.models import TensorSpec
from placeenv.serve.models.examples import PAGE
from placeenv.serve.models.images import decode_all


class Model(Base):
    inputs = (TensorSpec("page", "BYTES", (-1,)),)
    outputs = (TensorSpec("image", "FP32", (-1, 1, *PAGE)),)

    def load(self, context):
        return None

    def preprocess(self, inputs):
        return {"page": decode_all(inputs["page"], "page", mode="L", size=PAGE[::-1])}

    def execute(self, inputs):
        return {"image": inputs["page"]}
