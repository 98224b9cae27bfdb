"""A model for fault-injection tests: fails on request. Served only when named in PLACEENV_MODELS."""

from __future__ import annotations

from typing import Any

import paddle

from .base import Model

RAISE = -1.0  # first value of an example: execute raises (the request gets 500)
CRASH = -2.0  # first value of an example: the worker thread dies (replaced by the supervisor)


class WorkerCrash(BaseException):
    """Not an Exception: escapes every ``except Exception`` and ends the worker thread."""


class Faulty(Model):
    name = "faulty"
    description = (
        "Fault injection for tests: 4 numbers in [-2, 2] in, their sum out. "
        f"First value {RAISE:g} makes the model raise; {CRASH:g} kills the worker thread."
    )
    input_shape = (4,)
    accepted_shapes = ((4,),)
    value_range = (-2.0, 2.0)
    output = '{"sum": float}'

    def build(self) -> paddle.nn.Layer:
        layer = paddle.nn.Linear(4, 1, bias_attr=False)
        layer.weight.set_value(paddle.ones([4, 1]))
        return layer

    def execute(self, batch: paddle.Tensor) -> paddle.Tensor:
        first = batch[:, 0].numpy()
        if (first == CRASH).any():
            raise WorkerCrash("injected worker crash")
        if (first == RAISE).any():
            raise RuntimeError("injected model failure")
        return super().execute(batch)

    def postprocess(self, outputs: paddle.Tensor) -> list[dict[str, Any]]:
        return [{"sum": float(v)} for v in outputs.numpy().ravel()]
