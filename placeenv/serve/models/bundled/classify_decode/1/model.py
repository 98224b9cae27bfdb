"""The classification pipeline's first step, on the CPU: PNG or JPEG bytes -> RGB pixels [3, 32, 32] in
[0, 1], decoded and resized in preprocess (CPU threads, under PlaceEnv('cpu'))."""

from placeenv.serve.models import Model as Base
from placeenv.serve.models import TensorSpec
from placeenv.serve.models.images import decode_all


class Model(Base):
    inputs = (TensorSpec("image", "BYTES", (-1,)),)
    outputs = (TensorSpec("pixels", "FP32", (-1, 3, 32, 32)),)

    def load(self, context):
        return None  # nothing to run on a device: preprocess does the work

    def preprocess(self, inputs):
        return {"image": decode_all(inputs["image"], "image", mode="RGB", size=(32, 32))}

    def execute(self, inputs):
        return {"pixels": inputs["image"]}  # the decoded pixels, as the next step's tensor
