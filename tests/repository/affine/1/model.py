"""x * scale + offset (the config's parameters), a dygraph layer on the worker's device, so its outputs
stay there. Its execute notes each sim device's copy counts as it starts and ends (``NOTES``), for the
tests that count the copies between two steps of a pipeline.

``affine_host/1/model.py`` is this file: there, the model has a preprocess of its own, so a pipeline
hands it host arrays (the negative control of the copy count).
"""

import time
from pathlib import Path

import paddle

import placeenv
import placeenv.sim
from placeenv.serve.models import Model as Base
from placeenv.serve.models import TensorSpec

#: (time, directory, "enter" | "exit", device, placeenv.sim.DeviceStats) for each execute on a sim device.
NOTES = []
NAME = Path(__file__).parents[1].name


class Affine(paddle.nn.Layer):
    def __init__(self, scale: float, offset: float) -> None:
        super().__init__()
        self.scale = self.create_parameter([1], default_initializer=paddle.nn.initializer.Constant(scale))
        self.offset = self.create_parameter([1], default_initializer=paddle.nn.initializer.Constant(offset))

    def forward(self, x):
        return x * self.scale + self.offset


class Model(Base):
    inputs = (TensorSpec("x", "FP32", (-1, 4)),)
    outputs = (TensorSpec("y", "FP32", (-1, 4)),)

    def load(self, context):
        return Affine(float(context.parameters.get("scale", 2.0)), float(context.parameters.get("offset", 1.0)))

    def execute(self, inputs):
        self._note("enter")
        out = super().execute(inputs)
        self._note("exit")
        return out

    def _note(self, moment: str) -> None:
        device = placeenv.device_name(self.place)
        if device.startswith("sim:"):
            NOTES.append((time.perf_counter(), NAME, moment, device, placeenv.sim.stats(int(device[4:]))))


if NAME.endswith("_host"):
    class Model(Model):  # noqa: F811 - the control: a preprocess of its own takes host arrays
        def preprocess(self, inputs):
            return dict(inputs)
