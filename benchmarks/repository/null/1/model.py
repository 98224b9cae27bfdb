"""The null model: what the front end costs when the model costs (almost) nothing.

``execute`` slices its input on the worker's device (one op, so place checks still see a
device tensor) and sleeps ``parameters.sleep_ms`` per batch without the GIL, standing in
for a device kernel that leaves the host CPU free.

A device runs one such kernel at a time, as an accelerator's one engine does: the sleep
holds its device's lock. With several workers a device, one worker's host work (taking
the batch, copies, answers) overlaps another's kernel, but the device is never more than
busy, so ``1000 / sleep_ms`` batches a second stays the ideal.
"""

import threading
import time

from placeenv import device_name
from placeenv.serve.models import Model as Base, TensorSpec

_DEVICES: dict[str, threading.Lock] = {}  # device name: its engine, shared by that device's workers


class Model(Base):
    inputs = [TensorSpec("x", "FP32", (-1, 64))]
    outputs = [TensorSpec("y", "FP32", (-1, 10))]

    def load(self, context):
        self.sleep_s = float(context.parameters.get("sleep_ms", 0)) / 1000
        self.engine = _DEVICES.setdefault(device_name(self.place), threading.Lock())  # setdefault: atomic
        return None  # no network

    def execute(self, inputs):
        if self.sleep_s:
            with self.engine:
                time.sleep(self.sleep_s)  # releases the GIL
        return {"y": inputs["x"][:, :10]}
