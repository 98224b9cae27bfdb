"""Fault injection for tests: 4 numbers in, their sum out (a model.py with no saved program).

First value RAISE makes execute raise (that request gets a model-failed answer);
CRASH ends the worker thread (the supervisor replaces it).
"""

import paddle

from placeenv.serve.models import Model as Base, TensorSpec

RAISE = -1.0
CRASH = -2.0


class WorkerCrash(BaseException):
    """Not an Exception: escapes every ``except Exception`` and ends the worker thread."""


class Model(Base):
    inputs = [TensorSpec("values", "FP32", (-1, 4))]
    outputs = [TensorSpec("sum", "FP32", (-1, 1))]

    def load(self, context):
        layer = paddle.nn.Linear(4, 1, bias_attr=False)
        layer.weight.set_value(paddle.ones([4, 1]))
        return layer

    def execute(self, inputs):
        first = inputs["values"][:, 0].numpy()
        if (first == CRASH).any():
            raise WorkerCrash("injected worker crash")
        if (first == RAISE).any():
            raise RuntimeError("injected model failure")
        return super().execute(inputs)
