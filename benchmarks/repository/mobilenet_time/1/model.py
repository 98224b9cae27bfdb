"""mobilenet as an accelerator would run it, for benchmarks/pipelines.py --device-ms: the same tensors
in and out (image [n, 3, 32, 32] -> fetch_name_0 [n, 10]), its time spent on the device and none on the
host: ``parameters.sleep_ms`` a batch, slept without the GIL on its device's one engine, as the null
model does (a sim device runs every kernel on the host CPU, which a GPU does not).
"""

import threading
import time

import paddle

from placeenv import device_name
from placeenv.serve.models import Model as Base, TensorSpec

_ENGINES: dict[str, threading.Lock] = {}  # device name: its one engine, shared by that device's workers


def on_device(model: Base, image):
    """``sleep_ms`` of device time on ``model``'s device, then logits of ``image``: its channels' means."""
    with _ENGINES.setdefault(device_name(model.place), threading.Lock()):  # setdefault: atomic
        time.sleep(float(model.context.parameters["sleep_ms"]) / 1000)  # releases the GIL
    return paddle.tile(image.mean(axis=[2, 3]), [1, 4])[:, :10]


class Model(Base):
    inputs = (TensorSpec("image", "FP32", (-1, 3, 32, 32)),)
    outputs = (TensorSpec("fetch_name_0", "FP32", (-1, 10)),)

    def load(self, context):
        return None

    def execute(self, inputs):
        with self._env:
            return {"fetch_name_0": on_device(self, inputs["image"])}
