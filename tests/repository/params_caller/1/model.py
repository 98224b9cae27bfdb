"""Calls ``params`` from its execute (``Model.infer``) and answers its outputs: the call has the request's
parameters, or, when the request sends ``call_with`` (a string), its own ``{"tag": call_with}``.
"""

from placeenv.serve.models import Model as Base
from placeenv.serve.models import TensorSpec


class Model(Base):
    inputs = (TensorSpec("x", "FP32", (-1, 4)),)
    outputs = (TensorSpec("y", "FP32", (-1, 4)), TensorSpec("seen", "BYTES", (-1,)))

    def load(self, context):
        return None  # no network: execute calls params

    def execute(self, inputs):
        own = self.request_parameters.get("call_with")
        return self.infer("params", {"x": inputs["x"].numpy()}, parameters=None if own is None else {"tag": own})
