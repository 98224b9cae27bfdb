"""The null model: what the front end costs when the model costs (almost) nothing.

``execute`` slices its input on the worker's device (one op, so place checks still see a
device tensor) and sleeps ``parameters.sleep_ms`` per batch without the GIL, standing in
for a device kernel that leaves the host CPU free.
"""

import time

from placeenv.serve.models import Model as Base, TensorSpec


class Model(Base):
    inputs = [TensorSpec("x", "FP32", (-1, 64))]
    outputs = [TensorSpec("y", "FP32", (-1, 10))]

    def load(self, context):
        self.sleep_s = float(context.parameters.get("sleep_ms", 0)) / 1000
        return None  # no network

    def execute(self, inputs):
        if self.sleep_s:
            time.sleep(self.sleep_s)  # releases the GIL
        return {"y": inputs["x"][:, :10]}
