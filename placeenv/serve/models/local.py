"""A repository model run in the calling thread, as a worker runs it, without the service.

For benchmarks' bare loops and for testing a ``model.py``: ``preprocess`` on the
host under ``PlaceEnv('cpu')``, host tensors moved to the replica's place,
``execute``, ``postprocess``. No queue, no batching across calls, no place checks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from placeenv import PlaceEnv

from .base import Model, host_tensor, move_to
from .repository import BUNDLED, scan


class Local:
    """One replica of ``name`` (default version) on ``place``; ``infer`` answers one request."""

    def __init__(self, name: str, place, repositories: list[Path] | None = None) -> None:
        entries, errors = scan(repositories or [BUNDLED], [name], max_batch_size=0, max_batch_delay_ms=0)
        if errors:
            raise errors[0]
        version = entries[name].default
        self.context = version.context(name, entries[name].config)
        self.replica: Model = version.model_class()
        self.replica.initialize(place, self.context)
        self.template: Model = version.model_class()  # preprocess runs on an instance with no network
        self.template.context = self.context

    @PlaceEnv("cpu")
    def _preprocess(self, inputs: dict[str, np.ndarray]) -> dict:
        out = self.template.preprocess(dict(inputs))
        return {spec.name: host_tensor(out[spec.name]) if isinstance(out[spec.name], np.ndarray)
                else out[spec.name] for spec in self.context.inputs}

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        host = self._preprocess(inputs)
        moved = {name: move_to(tensor, self.replica.place) for name, tensor in host.items()}
        return self.replica.postprocess(self.replica.execute(moved))

    def examples(self, examples: list) -> dict[str, np.ndarray]:
        """``/predict``'s list of examples as this (one-input) model's input arrays."""
        (spec,) = self.context.inputs
        return {spec.name: np.asarray(examples, dtype=spec.dtype)}
