"""Calls another model from its execute (``Model.infer``, Triton's BLS): its one input goes to the model
the config's ``parameters.calls`` names, as input ``parameters.input``, and that model's output
``parameters.output`` comes back as its own. The device tensor goes as it is unless ``parameters.host``.

``cycle_a``, ``cycle_b``, ``call_gate``, ``call_host`` and ``call_split`` are this file with configs of
their own.
"""

from placeenv.serve.models import Model as Base


class Model(Base):
    def load(self, context):
        return None  # no network: execute calls another model

    def execute(self, inputs):
        parameters = self.context.parameters
        (value,) = inputs.values()
        found = self.infer(parameters["calls"], {parameters.get("input", "x"): value.numpy() if parameters.get(
            "host") else value})
        return {self.context.outputs[0].name: found[parameters.get("output", "y")]}
