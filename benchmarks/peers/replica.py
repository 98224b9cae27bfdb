"""The service's model code for one device, for the peers' workers (litserve_app.py, ray_app.py).

Import it after ``placeenv.sim.prepare()``: it imports Paddle. The repository entry is
loaded by ``placeenv.serve.engine.standalone.Standalone`` (scan, ``model.py``'s ``Model``,
``initialize`` on the device); ``decode`` is what the service does with a ``/predict``
body before queueing it (the model's ``preprocess`` on the host, under
``PlaceEnv('cpu')``), and ``forward`` what a service worker does with a batch (the
workers' own ``forward``: one host tensor, ``move_to`` the device, ``execute``,
``postprocess``), without the service's place checks and metrics. Each peer wraps these in its own batching.
"""

from __future__ import annotations

import numpy as np
import paddle

from placeenv import PlaceEnv
from placeenv.serve.models import InputError
from placeenv.serve.engine.standalone import Standalone
from placeenv.serve.engine.forward import forward
from placeenv.serve.models.base import host_inputs


class BadRequest(ValueError):
    """The request is the client's mistake: the peer answers it with 400 (404 for an unknown model)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Replica:
    """One replica of ``model`` (one input, like digits) on ``place``, in the calling thread."""

    def __init__(self, model: str, place: str) -> None:
        self.model, self.place = model, place
        paddle.set_device(place)  # a peer worker is one process (or thread) per device
        self.local = Standalone(model, place)
        (self.spec,) = self.local.context.inputs  # /predict's list of examples is this input
        self.forward([self.decode({"model": model, "inputs": [[0.0] * self.spec.shape[-1]]})])  # warm

    def decode(self, request: dict) -> np.ndarray:
        """A ``/predict`` body's examples, preprocessed on the host: ``[examples, ...]``."""
        if not isinstance(request, dict) or request.get("model") != self.model:
            name = request.get("model") if isinstance(request, dict) else None
            raise BadRequest(404, f"model {name!r} is not served here; it serves {self.model!r}")
        try:
            arrays = self.local.examples(request["inputs"])
            self.spec.check(arrays[self.spec.name])
            with PlaceEnv("cpu"):
                host = host_inputs(self.local.context, self.local.template.preprocess(arrays))
        except (InputError, ValueError, TypeError, KeyError) as exc:
            raise BadRequest(400, f"{type(exc).__name__}: {exc}") from None
        return host[self.spec.name]

    def forward(self, parts: list[np.ndarray]) -> list[dict]:
        """One forward pass for every request's examples; one ``/predict``-shaped answer per request."""
        replica = self.local.replica
        examples = sum(len(part) for part in parts)
        # batched: the peers serve models that batch along their first dimension (digits, mobilenet)
        results = forward(replica, [{self.spec.name: part} for part in parts], True, examples)
        columns = {name: array.tolist() for name, array in results.items()}
        answers, start = [], 0
        for part in parts:
            rows = range(start, start + len(part))
            answers.append({"model": self.model, "device": self.place, "batch_size": examples,
                            "outputs": [{name: column[i] for name, column in columns.items()} for i in rows]})
            start += len(part)
        return answers
