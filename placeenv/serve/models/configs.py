"""A model's config file: ``<repository>/<model>/config.yaml`` (or .yml, .toml), schema ``ModelConfig``,
and ``RepositoryError``, what every step of reading the repository raises (models/repository.py).

Every field is optional; pydantic checks each as the file is read, so a config that would fail at a
request fails at the load instead, naming the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..protocol.wire import DATATYPES
from .inference import Backend, ChoiceOptions, InferenceOptions
from .runtimes import RuntimeOptions

CONFIG_FILES = ("config.yaml", "config.yml", "config.toml")


class RepositoryError(Exception):
    """A repository entry cannot be served: names the model, the file and the problem."""

    def __init__(self, model: str, path: Path | str, problem: str) -> None:
        super().__init__(f"model {model!r}: {path}: {problem}")
        self.model, self.path, self.problem = model, str(path), problem


class TensorOverride(BaseModel):
    """One input or output, by position: any field left out keeps what the program says."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, description="the name clients use")
    datatype: Literal[tuple(DATATYPES)] | None = Field(None, description="FP32, INT64, BOOL, ...")
    shape: list[int] | None = Field(None, description="-1 for a dynamic dimension; the first is the batch")

    @field_validator("shape")
    @classmethod
    def _dims(cls, shape: list[int] | None) -> list[int] | None:
        if shape is not None and any(d == 0 or d < -1 for d in shape):
            raise ValueError("dimensions are positive, or -1 for dynamic")
        return shape


class InstanceGroup(BaseModel):
    """Like Triton's instance_group: on each device of ``kind``, ``count`` workers load the model."""

    model_config = ConfigDict(extra="forbid")
    kind: str = Field(description="a device kind: gpu, cpu, sim, xpu, or a custom device's type")
    count: int = Field(1, ge=1, description="workers per device of that kind (at most --workers-per-device)")


class Step(BaseModel):
    """One step of a pipeline: a model of the repository, with the tensors it reads and writes."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(description="a model of the repository (not a pipeline)")
    version: int | None = Field(None, ge=1, description="default: the model's highest")
    inputs: dict[str, str] = Field(
        description="each input of the model -> the tensor it reads: a pipeline input or another step's output")
    outputs: dict[str, str] = Field(
        default_factory=dict, description="outputs of the model -> the tensor each becomes (others are dropped)")
    parameters: bool = Field(
        True, description="false: the model reads none of the request's parameters, so it runs without them and "
                          "its batches join requests whatever parameters they sent")


class Latest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_versions: int = Field(1, ge=1, description="the highest this many versions")


class Specific(BaseModel):
    model_config = ConfigDict(extra="forbid")
    versions: list[int] = Field(min_length=1, description="these versions, each of which must exist")

    @field_validator("versions")
    @classmethod
    def _positive(cls, versions: list[int]) -> list[int]:
        if any(v < 1 for v in versions):
            raise ValueError("versions are positive integers")
        return sorted(set(versions))


class VersionPolicy(BaseModel):
    """Which versions of the repository's are served, as Triton's ``version_policy``: exactly one of
    ``latest: {num_versions: N}``, ``all: {}``, ``specific: {versions: [...]}``."""

    model_config = ConfigDict(extra="forbid")
    latest: Latest | None = None
    all: dict[str, Any] | None = None
    specific: Specific | None = None

    @model_validator(mode="after")
    def _one(self) -> VersionPolicy:
        given = [k for k in ("latest", "all", "specific") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of latest: {num_versions: N}, all: {}, specific: {versions: [...]}")
        if self.all:
            raise ValueError("all takes no settings: write all: {}")
        return self

    def chosen(self, present: list[int]) -> list[int]:
        """The versions served of those ``present``; ``ValueError`` naming versions that are not there."""
        if self.all is not None:
            return sorted(present)
        if self.latest is not None:
            return sorted(present)[-self.latest.num_versions:]
        missing = [v for v in self.specific.versions if v not in present]
        if missing:
            raise ValueError(f"version_policy specific names versions {missing}, which the repository does not "
                             f"have (it has {sorted(present)})")
        return list(self.specific.versions)


class WarmupSample(BaseModel):
    """Requests each worker runs through a version before it is ready (Triton's model_warmup)."""

    model_config = ConfigDict(extra="forbid")
    batch_sizes: list[int] = Field([1], min_length=1, description="one warm-up request of each size")
    data: Literal["zero", "random", "file"] = Field("zero", description="zeros, random values (seeded), or "
                                                   "each input's sample file (files)")
    dims: dict[str, list[int]] = Field(default_factory=dict, description="an input's shape without its batch "
                                       "dimension, where the model's has a dynamic (-1) one")
    files: dict[str, str] = Field(default_factory=dict, description="data: file: each input's sample, relative "
                                  "to the model's directory: a .npy of one example, or for a BYTES input the "
                                  "file's bytes as its one element (an image, a text)")
    count: int = Field(1, ge=1, le=100, description="runs of each request")

    @field_validator("batch_sizes")
    @classmethod
    def _sizes(cls, sizes: list[int]) -> list[int]:
        if any(s < 1 for s in sizes):
            raise ValueError("batch sizes are positive")
        return sizes


class BatchPadding(BaseModel):
    """An input's dynamic dimensions that may be padded for its requests to share a forward pass, as PaddleX's
    text recognition pads its crops' width: the batch's parts are padded at the end of ``dims`` with ``value``
    up to the batch's largest."""

    model_config = ConfigDict(extra="forbid")
    dims: list[int] = Field(min_length=1, description="dimension indexes, each a dynamic (-1) one other than "
                            "the batch dimension 0")
    value: float = Field(0.0, description="what the padding holds")


class ModelConfig(BaseModel):
    """``<model>/config.yaml`` (or .yml, .toml). Every field is optional."""

    model_config = ConfigDict(extra="forbid")
    description: str = ""
    max_batch_size: int | None = Field(
        None, ge=0, le=4096,
        description="examples per forward pass; 0: no batching across requests. Default: the service's "
        "--max-batch-size when every input's first dimension is dynamic, else 0",
    )
    max_batch_delay_ms: float | None = Field(None, ge=0, le=1000, description="default: --max-batch-delay-ms")
    instance_group: list[InstanceGroup] | None = Field(None, description="default: every worker loads the model")
    inputs: list[TensorOverride] = Field(default_factory=list, description="overrides, by position")
    outputs: list[TensorOverride] = Field(default_factory=list, description="overrides, by position")
    parameters: dict[str, Any] = Field(default_factory=dict, description="free-form, for model.py")
    backend: Backend = Field(
        "auto", description="what runs the saved program: 'inference' (a Paddle Inference Predictor per worker), "
        "'jit' (paddle.jit.load), 'onnxruntime' or 'openvino' (the program converted by paddle2onnx, one session "
        "a device), or 'auto': on the CPU (and a GPU ONNX Runtime has a provider for), each of Paddle Inference "
        "and the runtimes installed timed on the warm-up inputs, and the fastest whose outputs agree with "
        "Paddle's serves; paddle.jit.load on custom devices, on GPUs when the process serves several (a "
        "Predictor holds the GIL while its device works), and when the Predictor cannot load the program")
    inference: InferenceOptions = Field(default_factory=InferenceOptions,
                                        description="the Predictor's options (backend inference or auto)")
    runtime: RuntimeOptions = Field(default_factory=RuntimeOptions,
                                    description="ONNX Runtime's and OpenVINO's options (backends onnxruntime, "
                                    "openvino or auto)")
    choice: ChoiceOptions = Field(default_factory=ChoiceOptions,
                                  description="how backend auto measures: tolerances, rounds, which backends")
    share_weights: bool | None = Field(
        None, description="whether the workers of a device share one copy of each version's weights. Default: "
        "yes, unless a model.py overrides load() or initialize() (which may make or change tensors per worker); "
        "true: share them anyway; false: each worker loads its own (e.g. a forward that changes its buffers)")
    pipeline: list[Step] | None = Field(
        None, description="steps, each a model of the repository: this entry is then a pipeline, which has "
        "no program of its own and declares its inputs and outputs in full")
    version_policy: VersionPolicy = Field(
        default_factory=lambda: VersionPolicy(latest=Latest()),
        description="which versions are served, as Triton's: latest: {num_versions: N} (default: the latest "
        "one), all: {}, or specific: {versions: [...]}")
    warmup: list[WarmupSample] | None = Field(
        None, description="requests each worker runs through each version it loads before it is ready; a "
        "failure is the model's load error. Default: one request of zeros from the inputs' shapes (dynamic "
        "dimensions from a PaddleX export's inference.yml, else 32) for a saved program the service runs; "
        "[]: none")
    batch_padding: dict[str, BatchPadding] = Field(
        default_factory=dict, description="inputs whose dynamic dimensions may be padded for requests of "
        "different sizes to share a forward pass: {input: {dims: [...], value: 0.0}}; by default only "
        "requests whose every input has the same dimensions after the first share one")


#: A model config's fields that a pipeline does not take: its steps' models have their own.
STEP_FIELDS = ("max_batch_delay_ms", "instance_group", "parameters", "backend", "inference", "runtime",
               "choice", "share_weights",
               "version_policy", "warmup", "batch_padding")


def read_config(name: str, directory: Path) -> tuple[ModelConfig, Path | None]:
    """The model's config file, validated (a default config when it has none)."""
    present = [directory / f for f in CONFIG_FILES if (directory / f).is_file()]
    if len(present) > 1:
        raise RepositoryError(name, directory, f"more than one config file: {', '.join(p.name for p in present)}")
    if not present:
        return ModelConfig(), None
    path = present[0]
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".toml":
            raw = tomllib.loads(text)
        else:
            import yaml  # pyyaml: only when a YAML config is present

            raw = yaml.safe_load(text) or {}
    except Exception as exc:  # noqa: BLE001 - any parse failure is the file's
        raise RepositoryError(name, path, f"not readable: {type(exc).__name__}: {exc}") from None
    if not isinstance(raw, dict):
        raise RepositoryError(name, path, f"expected a mapping of settings, got {type(raw).__name__}")
    try:
        return ModelConfig.model_validate(raw), path
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
        )
        raise RepositoryError(name, path, f"invalid config: {problems} (schema: docs/models.md)") from None

