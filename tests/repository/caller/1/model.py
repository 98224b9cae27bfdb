"""Calls another model from its execute (``Model.infer``, Triton's BLS): its one input goes to the model
the config's ``parameters.calls`` names, as input ``parameters.input``, and that model's output
``parameters.output`` comes back as its own. The device tensor goes as it is unless ``parameters.host``.

With ``parameters.thread`` the call is made from a thread the model starts, not the worker's: what the
engine refuses with a clear error, raised here as the request's failure.

``cycle_a``, ``cycle_b``, ``call_gate``, ``call_host``, ``call_split`` and ``call_thread`` are this file
with configs of their own.
"""

import threading

from placeenv.serve.models import Model as Base


class Model(Base):
    def load(self, context):
        return None  # no network: execute calls another model

    def execute(self, inputs):
        parameters = self.context.parameters
        (value,) = inputs.values()
        if parameters.get("thread"):
            failed = []

            def call() -> None:
                try:
                    self.infer(parameters["calls"], {"x": value})
                except Exception as exc:  # noqa: BLE001 - the request's answer
                    failed.append(exc)

            thread = threading.Thread(target=call)
            thread.start()
            thread.join()
            raise failed[0] if failed else RuntimeError("the call from a thread of its own was not refused")
        found = self.infer(parameters["calls"], {parameters.get("input", "x"): value.numpy() if parameters.get(
            "host") else value})
        return {self.context.outputs[0].name: found[parameters.get("output", "y")]}
