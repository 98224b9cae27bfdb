"""A repository model run in the calling thread, as a worker runs it, without the service.

For benchmarks' bare loops and for testing a ``model.py``: ``preprocess`` on the
host under ``PlaceEnv('cpu')``, host tensors moved to the replica's place,
``execute``, ``postprocess``. No queue, no batching across calls, no place checks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from placeenv import PlaceEnv

from .base import Model, batch_tensor, host_inputs, move_to
from .repository import BUNDLED, Entry, scan


def replica(entry: Entry, place, version: int | None = None) -> Model:
    """One worker's replica of ``entry`` (its default version unless named) on ``place``."""
    chosen = entry.versions[version] if version is not None else entry.default
    model = chosen.model_class()
    model.initialize(place, chosen.context)
    return model


def forward(model: Model, inputs: dict[str, np.ndarray], preprocess: Model | None = None):
    """What a worker does with one request: (postprocessed host arrays, ``execute``'s raw outputs).
    ``preprocess``: the instance that preprocesses (the service's has no network); default ``model``."""
    with PlaceEnv("cpu"):
        host = host_inputs(model.context, (preprocess or model).preprocess(dict(inputs)))
    raw = model.execute({name: move_to(batch_tensor([value]), model.place) for name, value in host.items()})
    return model.postprocess(raw), raw


class Local:
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
        return forward(self.replica, inputs, self.template)[0]

    def examples(self, examples: list) -> dict[str, np.ndarray]:
        """``/predict``'s list of examples as this (one-input) model's input arrays."""
        (spec,) = self.context.inputs
        return {spec.name: np.asarray(examples, dtype=spec.dtype)}
