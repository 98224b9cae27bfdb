"""A repository model run in the calling thread, as a worker runs it, without the service.

For benchmarks' bare loops and for testing a ``model.py``: ``preprocess`` on the host under
``PlaceEnv('cpu')``, then the workers' own ``forward`` (forward.py) on one request. No queue, no
batching across calls; place checks only when asked for.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from placeenv import PlaceEnv

from ..models.base import Model, host_inputs
from ..models.repository import BUNDLED, Entry, scan
from .forward import forward as worker_forward
from .forward import unchecked
from .replica import replica_context, warm_up


def replica(entry: Entry, place, version: int | None = None) -> Model:
    """One worker's replica of ``entry`` (its default version unless named) on ``place``, warmed up as a
    worker warms it (a Predictor that cannot run its program rebuilt)."""
    chosen = entry.versions[version] if version is not None else entry.default
    model = chosen.model_class()
    model.initialize(place, replica_context(entry, chosen))
    warm_up(model, entry, chosen)
    return model


def forward(model: Model, inputs: dict[str, np.ndarray], preprocess: Model | None = None,
            check=None) -> dict[str, np.ndarray]:
    """What the service does with one request: the postprocessed outputs, as host arrays.
    ``preprocess``: the instance that preprocesses (the service's has no network); default ``model``.
    ``check(stage, device, expected=None)``: told where each tensor is, as a worker's place checks are."""
    with PlaceEnv("cpu"):
        host = host_inputs(model.context, (preprocess or model).preprocess(dict(inputs)))
    return worker_forward(model, [host], batched=False, examples=1, check=check or unchecked)


class Standalone:
    """One replica of ``name`` (default version) on ``place``; ``infer`` answers one request."""

    def __init__(self, name: str, place, repositories: list[Path] | None = None) -> None:
        entries, errors = scan(repositories or [BUNDLED], [name], max_batch_size=0, max_batch_delay_ms=0)
        if errors:
            raise errors[0]
        self.replica = replica(entries[name], place)
        self.context = self.replica.context
        self.template: Model = type(self.replica)()  # preprocess runs on an instance with no network
        self.template.context = self.context

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return forward(self.replica, inputs, self.template)

    def examples(self, examples: list) -> dict[str, np.ndarray]:
        """``/predict``'s list of examples as this (one-input) model's input arrays."""
        (spec,) = self.context.inputs
        return {spec.name: np.asarray(examples, dtype=spec.dtype)}
