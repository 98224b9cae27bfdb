"""Shows the request's parameters as the model reads them (``Model.request_parameters``): ``y`` is ``x`` plus
the parameter ``add`` its preprocess read (0 without it), and ``seen``, one text a row, the parameters its
execute read (JSON, keys sorted). A batch that mixed requests of different parameters would show one
request's parameters in another's rows.
"""

import json

import numpy as np

from placeenv.serve.models import Model as Base
from placeenv.serve.models import TensorSpec


class Model(Base):
    inputs = (TensorSpec("x", "FP32", (-1, 4)),)
    outputs = (TensorSpec("y", "FP32", (-1, 4)), TensorSpec("seen", "BYTES", (-1,)))

    def load(self, context):
        return None  # no network: execute shows what it reads

    def preprocess(self, inputs):
        return {"x": inputs["x"] + np.float32(self.request_parameters.get("add", 0))}

    def execute(self, inputs):
        x = inputs["x"].numpy()
        seen = json.dumps(dict(self.request_parameters), sort_keys=True).encode()
        return {"y": x, "seen": np.array([seen] * len(x), dtype=object)}
