"""Repository models run as the service runs them: one worker's replica, and the workers' own forward
pass (``engine/workers.py``'s ``forward``, through ``engine/standalone.py``), so a test checks a
model against the code that serves it."""

from __future__ import annotations

from pathlib import Path

import placeenv
from placeenv.serve.engine import standalone
from placeenv.serve.models import Model, scan


def replica(entry, device: str, version: int | None = None) -> Model:
    """One worker's replica of a repository ``entry`` (its default version unless named) on ``device``."""
    return standalone.replica(entry, placeenv.to_place(device), version)


def replica_of(repository: Path, name: str, device: str, max_batch_size: int = 8) -> Model:
    """``replica`` of model ``name`` of ``repository``."""
    entries, errors = scan([repository], [name], max_batch_size=max_batch_size, max_batch_delay_ms=0)
    assert not errors, errors
    return replica(entries[name], device)


def run(model: Model, inputs: dict) -> tuple[dict, dict[str, set[str]]]:
    """What the service does with one request: the postprocessed host arrays, and the devices the
    worker's place checks saw at each stage ("output": where the forward's raw outputs were)."""
    seen: dict[str, set[str]] = {}

    def check(stage: str, actual: str, expected: str | None = None) -> bool:
        seen.setdefault(stage, set()).add(actual)
        return True

    return standalone.forward(model, inputs, check=check), seen
