"""Rows of any width (its input's second dimension is dynamic): ``y`` each value doubled plus one, ``total``
each row's sum, on the worker's device. Requests of different widths cannot share a forward pass
unless the config pads the width (``widths_padded``: this file, with ``batch_padding``); zeros padded
change no row's total, and only the padded columns of ``y``.
"""

import paddle

from placeenv.serve.models import Model as Base
from placeenv.serve.models import TensorSpec


class Rows(paddle.nn.Layer):
    def forward(self, x):
        return x * 2 + 1, x.sum(axis=1, keepdim=True)


class Model(Base):
    inputs = (TensorSpec("x", "FP32", (-1, -1)),)
    outputs = (TensorSpec("y", "FP32", (-1, -1)), TensorSpec("total", "FP32", (-1, 1)))

    def load(self, context):
        return Rows()
