"""What reading the repository makes of a model's directory: a ``Version`` of a model, an ``Entry``
(a model and its versions), and a ``Pipeline`` whose steps are linked to versions (models/linking.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from .base import Model, ModelContext, TensorSpec
from .configs import ModelConfig


@dataclasses.dataclass
class Version:
    """One version: the class serving it, and the context each of its instances gets."""

    model_class: type[Model]
    context: ModelContext
    fingerprint: str = ""  # of its directory's files and its model's config: a changed one is loaded again
    #: The warm-up requests its workers run before it is ready: (what a message calls it, its arrays).
    warmup: list[tuple[str, dict[str, np.ndarray]]] = dataclasses.field(default_factory=list)

    @property
    def number(self) -> int:
        return self.context.version

    @property
    def program(self) -> Path | None:
        return self.context.program

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self.context.inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self.context.outputs


@dataclasses.dataclass
class Entry:
    """One model of the repository: its config and versions, highest last."""

    name: str
    directory: Path
    config: ModelConfig
    config_file: Path | None
    versions: dict[int, Version]
    max_batch_size: int = 0
    max_batch_delay_ms: float = 0.0

    @property
    def default(self) -> Version:
        return self.versions[max(self.versions)]

    def instances(self, device: str, workers: int, listed_only: bool = False) -> int:
        """How many of ``device``'s workers load this model; with ``listed_only``, none unless its
        instance_group names the device's kind."""
        groups = self.config.instance_group
        if groups is None:
            return 0 if listed_only else workers
        kind = device.split(":")[0]
        return min(workers, sum(g.count for g in groups if g.kind == kind))

    def describe(self) -> dict[str, Any]:
        version = self.default
        return {
            "name": self.name,
            "versions": [str(v) for v in sorted(self.versions)],
            "description": self.config.description,
            "max_batch_size": self.max_batch_size,
            "inputs": [s.describe() for s in version.inputs],
            "outputs": [s.describe() for s in version.outputs],
        }


@dataclasses.dataclass(frozen=True)
class PipelineStep:
    """A pipeline's step, linked to the model version it runs."""

    index: int  # its place in the config's list, from 1
    label: str  # what metrics and messages call it: the model's name, "#<index>" added if it repeats
    model: str
    version: int
    inputs: dict[str, str]  # the model's input -> the tensor it reads
    outputs: dict[str, str]  # the model's output -> the tensor it becomes
    parameters: bool = True  # whether the request's parameters go to the model (a batch joins equal ones only)

    def __str__(self) -> str:
        return f"step {self.index} ({self.model!r})"


@dataclasses.dataclass
class Pipeline:
    """A repository entry whose config names steps: each a model, run by the engine (engine/pipeline.py)."""

    name: str
    directory: Path
    config: ModelConfig
    config_file: Path | None
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    steps: tuple[PipelineStep, ...]  # in an order that runs each after the steps it reads from
    max_batch_size: int = 0
    version: int = 1  # a pipeline has one version: its config
    #: A PaddleX pipeline file's (models/paddlex.py): its kind and settings, for PaddleX serving's API.
    paddlex: dict[str, Any] | None = None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "versions": [str(self.version)], "description": self.config.description,
                "max_batch_size": self.max_batch_size, "inputs": [s.describe() for s in self.inputs],
                "outputs": [s.describe() for s in self.outputs]}

