"""Each row's sum, on CPU workers of its own (instance_group kind cpu): a pipeline's CPU step."""

import paddle

from placeenv.serve.models import Model as Base
from placeenv.serve.models import TensorSpec


class Model(Base):
    inputs = (TensorSpec("x", "FP32", (-1, 4)),)
    outputs = (TensorSpec("sum", "FP32", (-1, 1)),)

    def load(self, context):
        layer = paddle.nn.Linear(4, 1, bias_attr=False)
        layer.weight.set_value(paddle.ones([4, 1]))
        return layer
