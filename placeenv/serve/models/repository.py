"""The model repository: Triton's layout, read at start and at each load (engine/control.py).

    <repository>/<model>/config.yaml | config.yml | config.toml   optional, schema ModelConfig
    <repository>/<model>/<version>/model.json + model.pdiparams   what paddle.jit.save(layer, ".../model") writes
                                  (or inference.json + inference.pdiparams, as PaddleX / PaddleOCR export)
    <repository>/<model>/<version>/model.py                       optional: a class Model (base.Model)
    <repository>/<model>/inference.json + inference.pdiparams     a PaddleX export as it comes, with no
                                                                  version directory: served as version 1
    <repository>/<pipeline>/config.yaml                           a config with ``pipeline:`` steps, each a
                                                                  model of the repository (Triton's ensemble)

Versions are positive integers; the config's ``version_policy`` says which are served (Triton's:
the latest one by default), the highest of them the default. A pipeline's steps are linked and
checked here, against the models they name (``link``). Nothing here runs at request time; a load
request names a model of the configured repositories, never a path or code: the files are the
operator's, as in Triton's and KServe's threat model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any, Literal

import paddle
import tomllib
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from placeenv import PlaceEnv
from placeenv.tensors import program_signature

from ..config import BUNDLED
from ..protocol.wire import DATATYPES, datatype_of
from . import examples
from .base import JIT_LOAD_LOCK, Model, ModelContext, TensorSpec
from .inference import Backend, InferenceOptions

__all__ = ["BUNDLED", "Entry", "ModelConfig", "Pipeline", "Repository", "RepositoryError", "read", "scan"]

CONFIG_FILES = ("config.yaml", "config.yml", "config.toml")
#: A PaddleX pipeline file (models/paddlex.py), the pipeline's directory holds it in place of a config.
PADDLEX_FILE = "pipeline.yaml"
PROGRAM_PREFIXES = ("model", "inference")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: A parameter op in a PIR program's JSON (model.json): {"#": "p", ...}.
PARAMETER_OP = re.compile(rb'"#"\s*:\s*"p"')


class RepositoryError(Exception):
    """A repository entry cannot be served: names the model, the file and the problem."""

    def __init__(self, model: str, path: Path | str, problem: str) -> None:
        super().__init__(f"model {model!r}: {path}: {problem}")
        self.model, self.path, self.problem = model, str(path), problem


# -- the config file ---------------------------------------------------------------------------


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
        "'jit' (paddle.jit.load), or 'auto': a Predictor on the CPU, and on a GPU when it is the process's only "
        "accelerator (a Predictor holds the GIL while its device works); paddle.jit.load on custom devices, on "
        "GPUs when the process serves several, and when the Predictor cannot load the program")
    inference: InferenceOptions = Field(default_factory=InferenceOptions,
                                        description="the Predictor's options (backend inference or auto)")
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
STEP_FIELDS = ("max_batch_delay_ms", "instance_group", "parameters", "backend", "inference", "share_weights",
               "version_policy", "warmup", "batch_padding")


# -- entries -----------------------------------------------------------------------------------


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


@dataclasses.dataclass
class Repository:
    """What ``read`` found: the models, the pipelines over them, and the errors of the rest."""

    entries: dict[str, Entry]
    pipelines: dict[str, Pipeline]
    errors: list[RepositoryError]


def scan(repositories: list[Path], select: list[str] | None, *, max_batch_size: int,
         max_batch_delay_ms: float) -> tuple[dict[str, Entry], list[RepositoryError]]:
    """Every model of ``repositories`` (or those in ``select``, and the steps of a pipeline selected):
    the entries, and the errors of the rest. ``read`` gives the pipelines too."""
    found = read(repositories, select, max_batch_size=max_batch_size, max_batch_delay_ms=max_batch_delay_ms)
    return found.entries, found.errors


def read(repositories: list[Path], select: list[str] | None, *, max_batch_size: int,
         max_batch_delay_ms: float) -> Repository:
    """Every model and pipeline of ``repositories``, or those in ``select`` and the models their steps
    name (a pipeline is served with its steps, as Triton loads an ensemble's models)."""
    found: dict[str, Path] = {}
    errors: list[RepositoryError] = []
    for repository in repositories:
        if not repository.is_dir():
            raise RepositoryError("*", repository, "no such directory (PLACEENV_MODEL_REPOSITORY)")
        for child in sorted(repository.iterdir()):
            if child.name.startswith((".", "_")) or not child.is_dir():
                continue
            if child.name in found:
                errors.append(RepositoryError(child.name, child, f"also in {found[child.name].parent}: "
                                              "model names must be unique across repositories"))
                continue
            found[child.name] = child
    if select is not None:
        unknown = [name for name in select if name not in found]
        if unknown:
            raise RepositoryError(
                ", ".join(unknown), ", ".join(str(r) for r in repositories),
                f"not in the repository (PLACEENV_MODELS); it holds: {', '.join(sorted(found)) or 'nothing'}",
            )
    configs: dict[str, tuple[ModelConfig, Path | None]] = {}
    paddlex_files: dict[str, Path] = {}  # PaddleX's pipeline files: read with their models, below
    paddlex_about: dict[str, dict] = {}
    wanted = list(found if select is None else select)
    for name in wanted:  # grows by the steps of each pipeline selected
        try:
            if not NAME.fullmatch(name):
                raise RepositoryError(name, found[name], "a model name is letters, digits, '_', '.', '-' (at most 64)")
            if (found[name] / PADDLEX_FILE).is_file():
                paddlex_files[name] = found[name] / PADDLEX_FILE
                continue
            configs[name] = read_config(name, found[name])
        except RepositoryError as exc:
            errors.append(exc)
            continue
        steps = configs[name][0].pipeline or ()
        wanted += [s.model for s in steps if s.model in found and s.model not in wanted]
    entries, pipelines = {}, {}
    for name, (config, config_file) in configs.items():
        if config.pipeline is None:
            try:
                entries[name] = load_entry(name, found[name], config, config_file, max_batch_size,
                                           max_batch_delay_ms)
            except RepositoryError as exc:
                errors.append(exc)
    for name, path in paddlex_files.items():
        from . import paddlex  # (it imports this module)

        try:
            made, config, about = paddlex.read(name, path, max_batch_size, max_batch_delay_ms)
        except RepositoryError as exc:
            errors.append(exc)
            continue
        entries.update(made)
        configs[name] = (config, path)
        paddlex_about[name] = about
    failed = {e.model: e.problem for e in errors}
    for name, (config, config_file) in configs.items():
        if config.pipeline is not None:
            try:
                pipelines[name] = link(name, found[name], config, config_file, entries, failed,
                                       {n for n, (c, _) in configs.items() if c.pipeline is not None},
                                       max_batch_size)
            except RepositoryError as exc:
                errors.append(exc)
                continue
            pipelines[name].paddlex = paddlex_about.get(name)
    return Repository(entries, pipelines, errors)


def load_entry(name: str, directory: Path, config: ModelConfig, config_file: Path | None, max_batch_size: int,
               max_batch_delay_ms: float) -> Entry:
    home = version_home(name, directory)
    present = served_directories(name, home)
    if not present and home != directory:
        raise RepositoryError(name, home, "not built: the service builds it at start, or run "
                              "python -m placeenv.serve.models.examples")
    if not present:
        raise RepositoryError(name, directory, no_layout(directory))
    try:
        chosen = config.version_policy.chosen(sorted(present))
    except ValueError as exc:
        raise RepositoryError(name, config_file or directory, str(exc)) from None
    configured = config_fingerprint(config_file)
    versions = {}
    for number in chosen:
        version = read_version(name, present[number], config, number)
        version.fingerprint = configured + ":" + files_fingerprint(present[number])
        versions[number] = version
    entry = Entry(name, directory, config, config_file, versions)
    batchable = all(spec.shape[:1] == (-1,) for v in versions.values() for spec in v.inputs)
    if config.max_batch_size is None:
        entry.max_batch_size = max_batch_size if batchable else 0
    elif config.max_batch_size > 0 and not batchable:
        raise RepositoryError(name, config_file, f"max_batch_size {config.max_batch_size} needs every input's "
                              "first dimension dynamic (-1); set 0, or save the program with a None batch dim")
    else:
        entry.max_batch_size = config.max_batch_size
    entry.max_batch_delay_ms = (max_batch_delay_ms if config.max_batch_delay_ms is None
                                else config.max_batch_delay_ms)
    for version in versions.values():
        check_padding(entry, version)
        version.warmup = warmup_requests(entry, version)
    return entry


def check_padding(entry: Entry, version: Version) -> None:
    """``RepositoryError`` unless each input the config's ``batch_padding`` names is one of ``version``'s,
    each of its dims a dynamic (-1) one past the batch dimension, and the model batches."""
    where = entry.config_file or entry.directory
    specs = {spec.name: spec for spec in version.inputs}
    for name, padding in entry.config.batch_padding.items():
        def refuse(problem: str) -> RepositoryError:
            return RepositoryError(entry.name, where, f"batch_padding: {problem}")

        if entry.max_batch_size == 0:
            raise refuse("the model does not batch (max_batch_size 0): remove batch_padding, or set a "
                         "max_batch_size")
        spec = specs.get(name)
        if spec is None:
            raise refuse(f"no input {name!r} (version {version.number}); the inputs are {', '.join(specs)}")
        dynamic = [i for i, d in enumerate(spec.shape) if i > 0 and d == -1]
        wrong = [d for d in padding.dims if d not in dynamic]
        if wrong:
            raise refuse(f"input {name!r} (shape {list(spec.shape)}): dim {wrong[0]} is not a dynamic (-1) "
                         f"dimension after the batch dimension 0; write dims: {dynamic or '[]'}"
                         + ("" if dynamic else " (none: the input cannot be padded; remove it)"))


def version_home(name: str, directory: Path) -> Path:
    """Where a model's version directories are: its own directory, or the cache a bundled example is
    built into at start."""
    if directory.parent == BUNDLED and name in examples.BUILT_AT_START:
        return examples.home(name)
    return directory


def served_directories(name: str, home: Path) -> dict[int, Path]:
    """Each version's directory: the numbered ones, or the model's own directory as version 1 when it
    holds a saved program itself (a PaddleX export copied in as it comes)."""
    numbered = version_directories(home)
    if find_program(name, home) is None:
        return numbered
    if numbered:
        raise RepositoryError(name, home, f"holds a saved program and version directories "
                              f"({', '.join(map(str, numbered))}): keep one layout, <model>/<version>/inference.json "
                              "or <model>/inference.json (served as version 1)")
    return {1: home}


def no_layout(directory: Path) -> str:
    """What a model directory with neither layout is missing, pointing at a program a level too deep."""
    deeper = sorted(p.parent.name for stem in PROGRAM_PREFIXES for p in directory.glob(f"*/{stem}.json"))
    found = (f"; {directory.name}/{deeper[0]}/ holds one, but a version directory is named by a positive "
             f"integer (1, 2, ...): rename it, or move its files up into {directory.name}/") if deeper else ""
    return ("no saved program: expected PaddleX's export as it comes, <model>/inference.json + "
            "inference.pdiparams (version 1), or version directories, <model>/1/inference.json + "
            "inference.pdiparams (or model.json + model.pdiparams: paddle.jit.save(layer, "
            f"'<repository>/<model>/1/model', input_spec=[...])){found}")


def version_directories(home: Path) -> dict[int, Path]:
    """Each version directory of a model: a positive number without leading zeros."""
    return {int(c.name): c for c in sorted(home.iterdir()) if home.is_dir() and c.is_dir() and c.name.isdigit()
            and int(c.name) > 0 and not c.name.startswith("0")} if home.is_dir() else {}


def config_fingerprint(config_file: Path | None) -> str:
    """The config file's content, hashed: a changed config loads every version again."""
    if config_file is None:
        return "-"
    try:
        return hashlib.sha256(config_file.read_bytes()).hexdigest()[:16]
    except OSError:
        return "?"


def files_fingerprint(directory: Path) -> str:
    """Each file under ``directory``: its path, size and modification time, hashed (no file is read: a
    poll looks at every model's often)."""
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        if "__pycache__" in path.parts:
            continue
        try:
            info = path.stat()
        except OSError:  # removed while listed
            continue
        digest.update(f"{path.relative_to(directory)}:{info.st_size}:{info.st_mtime_ns};".encode())
    return digest.hexdigest()[:16]


def fingerprint(directory: Path) -> str:
    """A model directory's state, as a poll compares it: its config and every version's files."""
    name = directory.name
    present = [directory / f for f in CONFIG_FILES if (directory / f).is_file()]
    parts = [config_fingerprint(present[0]) if present else "-"]
    home = version_home(name, directory)
    try:
        served = served_directories(name, home)
    except RepositoryError:  # both layouts: the load that follows says so
        served = version_directories(home)
    parts += [f"{n}={files_fingerprint(d)}" for n, d in served.items()]
    return ",".join(parts)


def warmup_requests(entry: Entry, version: Version) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The arrays of each warm-up request of ``version`` (its config's ``warmup``), checked against its
    inputs; ``RepositoryError`` naming the sample and what is wrong."""
    found = []
    where = entry.config_file or entry.directory
    rng = np.random.default_rng(0)
    samples = entry.config.warmup
    default = samples is None
    if default:
        samples = default_warmup(entry, version)
    for i, sample in enumerate(samples):
        def refuse(problem: str) -> RepositoryError:
            return RepositoryError(entry.name, where, f"warmup[{i}]: {problem}")

        specs = {spec.name: spec for spec in version.inputs}
        for kind, named in (("dims", sample.dims), ("files", sample.files)):
            unknown = [n for n in named if n not in specs]
            if unknown:
                raise refuse(f"{kind} names input {unknown[0]!r}; the inputs are {', '.join(specs)}")
        batched = entry.max_batch_size > 0
        if not batched and sample.batch_sizes != [1]:
            raise refuse(f"batch_sizes {sample.batch_sizes}: the model does not batch (max_batch_size 0); use [1]")
        if batched and max(sample.batch_sizes) > entry.max_batch_size:
            raise refuse(f"batch size {max(sample.batch_sizes)} is over the model's max_batch_size "
                         f"{entry.max_batch_size}")
        examples: dict[str, np.ndarray] = {}  # each input's one example (its batch dimension left out)
        for spec in version.inputs:
            shape = list(spec.shape[1:] if batched else spec.shape)
            if spec.name in sample.dims:
                given = sample.dims[spec.name]
                if len(given) != len(shape) or any(g < 1 or s not in (-1, g) for g, s in zip(given, shape)):
                    raise refuse(f"dims {given} for input {spec.name!r} do not fit its shape "
                                 f"{list(spec.shape)} (without the batch dimension: {shape})")
                shape = given
            if sample.data == "file":
                examples[spec.name] = _sample_file(refuse, entry.directory, spec, sample.files.get(spec.name),
                                                   shape)
                continue
            if -1 in shape:
                raise refuse(f"input {spec.name!r} has a dynamic dimension ({list(spec.shape)}): give its "
                             f"size in dims")
            if spec.datatype == "BYTES":
                raise refuse(f"input {spec.name!r} is BYTES: warm it up with data: file and a sample in files")
            dtype = DATATYPES[spec.datatype]
            if sample.data == "zero":
                examples[spec.name] = np.zeros(shape, dtype)
            elif dtype == np.bool_:
                examples[spec.name] = rng.integers(0, 2, shape).astype(dtype)
            elif np.issubdtype(dtype, np.integer):
                examples[spec.name] = rng.integers(0, 10, shape).astype(dtype)
            else:
                examples[spec.name] = rng.random(shape).astype(dtype)
        for size in sample.batch_sizes:
            arrays = {name: np.stack([one] * size) if batched else one for name, one in examples.items()}
            label = (f"the default warm-up (zeros: {', '.join(f'{n} {list(a.shape)}' for n, a in arrays.items())}; "
                     "the config's warmup sets others, warmup: [] none)" if default else f"warmup[{i}] batch {size}")
            found += [(label, arrays)] * sample.count
    return found


#: A dynamic dimension's size in the default warm-up where the model's files do not give one.
DEFAULT_DIM = 32


def default_warmup(entry: Entry, version: Version) -> list[WarmupSample]:
    """One request of zeros through a version whose saved program a backend runs (a Predictor may build
    and still fail at its first run: oneDNN on some programs), so that is found before ready. Dynamic
    dimensions take the sizes a PaddleX export's inference.yml calls typical (its dynamic shapes' ``opt``),
    else ``DEFAULT_DIM`` (1 for a first dimension the model does not batch on). None for a version whose
    ``execute`` is its own code (it may call other models) or that takes BYTES (its samples are files)."""
    if (version.program is None or version.model_class.execute is not Model.execute
            or any(spec.datatype == "BYTES" for spec in version.inputs)):
        return []
    typical = typical_shapes(version.context.directory)
    batched = entry.max_batch_size > 0
    dims = {}
    for spec in version.inputs:
        shape = list(spec.shape[1:] if batched else spec.shape)
        if -1 not in shape:
            continue
        known = typical.get(spec.name)
        known = known[1:] if known is not None and batched else known
        if known is not None and len(known) == len(shape) and all(s in (-1, k) for s, k in zip(shape, known)):
            dims[spec.name] = known
        else:
            dims[spec.name] = [s if s != -1 else 1 if i == 0 and not batched else DEFAULT_DIM
                               for i, s in enumerate(shape)]
    return [WarmupSample(dims=dims)]


def typical_shapes(directory: Path) -> dict[str, list[int]]:
    """Each input's typical shape, batch dimension included, from a PaddleX export's inference.yml (the
    ``opt`` of ``Hpi.backend_configs.paddle_infer.trt_dynamic_shapes``); none where it says nothing."""
    path = directory / "inference.yml"
    if not path.is_file():
        return {}
    try:
        import yaml  # pyyaml, the service's

        shapes = yaml.safe_load(path.read_text(encoding="utf-8"))["Hpi"]["backend_configs"]["paddle_infer"][
            "trt_dynamic_shapes"]
        return {name: [int(d) for d in ranges[1]] for name, ranges in shapes.items()
                if all(int(d) > 0 for d in ranges[1])}
    except Exception:  # noqa: BLE001 - not one of PaddleX's: the plain defaults
        return {}


def _sample_file(refuse, directory: Path, spec: TensorSpec, relative: str | None, shape: list[int]) -> np.ndarray:
    """One example of input ``spec`` from its sample file, inside the model's ``directory``."""
    if relative is None:
        raise refuse(f"data: file, but files names no sample for input {spec.name!r}")
    path = (directory / relative).resolve()
    if not path.is_relative_to(directory.resolve()) or not path.is_file():
        raise refuse(f"files: {relative!r} for input {spec.name!r} is not a file inside {directory}")
    if spec.datatype == "BYTES":
        if shape != [1] and shape != []:
            raise refuse(f"input {spec.name!r}: a sample file is one element; its shape is {shape}")
        one = np.empty(len(shape) * (1,), dtype=object)
        one[...] = path.read_bytes()
        return one
    try:
        array = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - any failure to read is the file's
        raise refuse(f"files: {relative!r} is not a .npy array: {type(exc).__name__}: {exc}") from None
    if array.dtype != DATATYPES[spec.datatype] or len(array.shape) != len(shape) or any(
            s not in (-1, a) for a, s in zip(array.shape, shape)):
        raise refuse(f"files: {relative!r} holds {array.dtype} {list(array.shape)}; input {spec.name!r} takes "
                     f"{spec.datatype} {shape} (one example, without the batch dimension)")
    return array


# -- pipelines -----------------------------------------------------------------------------------


def link(name: str, directory: Path, config: ModelConfig, config_file: Path | None, entries: dict[str, Entry],
         failed: dict[str, str], pipelines: set[str], max_batch_size: int) -> Pipeline:
    """A pipeline's steps linked to the models they name, every tensor checked from the pipeline's inputs
    through the steps to its outputs; ``RepositoryError`` naming the step and what is wrong."""

    def refuse(problem: str) -> RepositoryError:
        return RepositoryError(name, config_file, f"pipeline: {problem}")

    given = [f for f in STEP_FIELDS if f in config.model_fields_set]
    if given:
        raise refuse(f"{', '.join(given)}: a pipeline's steps run as their models do; set this in their "
                     "config files")
    if not config.pipeline:
        raise refuse("no steps: list at least one {model, inputs, outputs}")
    for child in directory.iterdir():
        if child.is_dir() and child.name.isdigit() and any(
                (child / f).exists() for f in ("model.py", *(p + ".json" for p in PROGRAM_PREFIXES))):
            raise RepositoryError(name, child, "a pipeline runs its steps' models: its version directory "
                                  "holds no program or model.py (an empty 1/ is Triton's layout)")
    inputs = _declared_in_full(refuse, config.inputs, "inputs")
    outputs = _declared_in_full(refuse, config.outputs, "outputs")
    # Every tensor's spec and who makes it: a pipeline input, or a step's output.
    made: dict[str, tuple[TensorSpec, str]] = {spec.name: (spec, "a pipeline input") for spec in inputs}
    steps, counts = [], {}
    for index, step in enumerate(config.pipeline, 1):
        where = f"step {index} ({step.model!r})"
        version = _step_version(refuse, where, step, name, entries, failed, pipelines)
        takes, gives = {s.name: s for s in version.inputs}, {s.name: s for s in version.outputs}
        for kind, mapped, specs in (("input", step.inputs, takes), ("output", step.outputs, gives)):
            for key in mapped:
                if key not in specs:
                    raise refuse(f"{where}: model {step.model!r} has no {kind} {key!r}; its {kind}s are "
                                 + ", ".join(_spec(s) for s in specs.values()))
        for spec in version.inputs:
            if spec.name not in step.inputs:
                raise refuse(f"{where}: input {_spec(spec)} is not mapped: map it to a pipeline input or "
                             "another step's output (inputs: {model input: tensor})")
        for output, tensor in step.outputs.items():
            if tensor in made:
                raise refuse(f"{where}: output {output!r} becomes tensor {tensor!r}, which is already "
                             f"{made[tensor][1]}: give it another name")
            made[tensor] = (dataclasses.replace(gives[output], name=tensor), f"{where}'s output {output!r}")
        counts[step.model] = counts.get(step.model, 0) + 1
        label = step.model if counts[step.model] == 1 else f"{step.model}#{index}"
        steps.append(PipelineStep(index, label, step.model, version.number, dict(step.inputs), dict(step.outputs)))
    for step, version in ((s, entries[s.model].versions[s.version]) for s in steps):
        takes = {s.name: s for s in version.inputs}
        for key, tensor in step.inputs.items():
            if tensor not in made:
                raise refuse(f"{step}: input {key!r} reads tensor {tensor!r}, which no step makes and the "
                             f"pipeline does not take; there are {', '.join(made)}")
            _agree(refuse, f"{step}: input {key!r}", takes[key], *made[tensor])
    for spec in outputs:
        found = made.get(spec.name)
        if found is None or found[1] == "a pipeline input":
            raise refuse(f"output {spec.name!r} is made by no step: map a step's output to it")
        _agree(refuse, f"output {spec.name!r}", spec, *found)
    read_ = {t for s in steps for t in s.inputs.values()} | {s.name for s in outputs}
    for tensor, (_, maker) in made.items():
        if tensor not in read_:
            raise refuse(f"tensor {tensor!r} ({maker}) is read by no step and is not an output of the pipeline")
    batchable = all(spec.shape[:1] == (-1,) for spec in inputs)
    if config.max_batch_size is not None and config.max_batch_size > 0 and not batchable:
        raise refuse(f"max_batch_size {config.max_batch_size} needs every input's first dimension dynamic (-1)")
    # At most each batching step's: what it says it takes, every step takes in one forward pass (a job of
    # more rows is queued as parts, engine/workers.py split).
    smallest = min(((entries[s.model].max_batch_size, s) for s in steps if entries[s.model].max_batch_size > 0),
                   default=None, key=lambda found: found[0])
    if config.max_batch_size is not None and smallest is not None and config.max_batch_size > smallest[0]:
        raise refuse(f"max_batch_size {config.max_batch_size} is more than {smallest[1]} takes: "
                     f"its model's max_batch_size is {smallest[0]}")
    batch = config.max_batch_size if config.max_batch_size is not None else (
        min(max_batch_size, smallest[0]) if batchable and smallest is not None else max_batch_size if batchable else 0)
    return Pipeline(name, directory, config, config_file, inputs, outputs, _ordered(refuse, steps), batch)


def _spec(spec: TensorSpec) -> str:
    return f"{spec.name!r} ({spec.datatype} {list(spec.shape)})"


def _declared_in_full(refuse, overrides: list[TensorOverride], kind: str) -> tuple[TensorSpec, ...]:
    if not overrides:
        raise refuse(f"no {kind}: a pipeline declares its {kind}, each with name, datatype and shape")
    specs = []
    for i, override in enumerate(overrides):
        if override.name is None or override.datatype is None or override.shape is None:
            raise refuse(f"{kind}[{i}]: give its name, datatype and shape")
        specs.append(TensorSpec(override.name, override.datatype, tuple(override.shape)))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise refuse(f"{kind} names repeat: {names}")
    return tuple(specs)


def _step_version(refuse, where: str, step: Step, name: str, entries: dict[str, Entry], failed: dict[str, str],
                  pipelines: set[str]) -> Version:
    """The model version a step runs; why it cannot be had, naming the step."""
    entry = entries.get(step.model)
    if entry is None:
        if step.model == name or step.model in pipelines:
            raise refuse(f"{where}: {step.model!r} is a pipeline; a step is a model (pipelines do not nest)")
        if step.model in failed:
            raise refuse(f"{where}: model {step.model!r} cannot be served: {failed[step.model]}")
        raise refuse(f"{where}: no model {step.model!r} in the repository; it holds "
                     f"{', '.join(sorted(entries)) or 'no model'}")
    if step.version is None:
        return entry.default
    if step.version not in entry.versions:
        raise refuse(f"{where}: model {step.model!r} has no version {step.version}; it has "
                     f"{', '.join(str(v) for v in sorted(entry.versions))}")
    return entry.versions[step.version]


def _agree(refuse, what: str, wanted: TensorSpec, found: TensorSpec, maker: str) -> None:
    """A tensor ``maker`` makes as ``found`` fits where ``wanted`` reads it: one datatype, one rank,
    and each dimension the same where both fix it."""
    if wanted.datatype != found.datatype:
        raise refuse(f"{what} is {wanted.datatype}, but tensor {found.name!r} ({maker}) is {found.datatype}")
    if len(wanted.shape) != len(found.shape) or any(
            a != b and -1 not in (a, b) for a, b in zip(wanted.shape, found.shape)):
        raise refuse(f"{what} has shape {list(wanted.shape)}, but tensor {found.name!r} ({maker}) has "
                     f"{list(found.shape)} (-1: any size)")


def _ordered(refuse, steps: list[PipelineStep]) -> tuple[PipelineStep, ...]:
    """``steps`` so that each comes after every step whose output it reads; a cycle refused, named."""
    maker = {tensor: step for step in steps for tensor in step.outputs.values()}
    after = {step.index: {maker[t].index for t in step.inputs.values() if t in maker} for step in steps}
    by_index = {step.index: step for step in steps}
    order: list[PipelineStep] = []
    while len(order) < len(steps):
        done = {s.index for s in order}
        ready = [s for s in steps if s.index not in done and after[s.index] <= done]
        if not ready:
            # Walk back from any step left: each waits on one left too, so a step repeats.
            path, at = [], min(set(by_index) - done)
            while at not in path:
                path.append(at)
                at = min(after[at] - done)
            cycle = path[path.index(at):] + [at]
            raise refuse("steps read each other's outputs in a cycle: "
                         + " -> ".join(str(by_index[i]) for i in reversed(cycle)))
        order += ready
    return tuple(order)


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


def read_version(name: str, directory: Path, config: ModelConfig, number: int) -> Version:
    program = find_program(name, directory)
    model_class = Model
    source = directory / "model.py"
    if source.is_file():
        model_class = import_model_class(name, source)
    elif program is None:
        raise RepositoryError(name, directory, "no saved program: expected inference.json + inference.pdiparams "
                              "(a PaddleX export), model.json + model.pdiparams (paddle.jit.save), or a model.py")
    if config.backend == "inference" and (program is None or model_class.load is not Model.load):
        raise RepositoryError(name, source if source.is_file() else directory,
                              "backend inference runs the version's saved program with a Predictor: it needs "
                              "model.json (paddle.jit.save) and a model.py that does not override load(); "
                              "set backend: jit or auto")
    inputs, outputs = program_specs(name, program) if program is not None else ((), ())
    inputs = declared(name, source, model_class.inputs, inputs, "inputs")
    outputs = declared(name, source, model_class.outputs, outputs, "outputs")
    where = source if source.is_file() else directory
    inputs = overridden(name, where, inputs, config.inputs, "inputs")
    outputs = overridden(name, where, outputs, config.outputs, "outputs")
    for kind, specs in (("inputs", inputs), ("outputs", outputs)):
        if not specs:
            raise RepositoryError(name, where, f"no {kind}: declare them in model.py or the config file")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise RepositoryError(name, where, f"{kind} names repeat: {names}")
    text = [s.name for s in inputs if s.datatype == "BYTES"]
    if text and model_class.preprocess is Model.preprocess:
        # A worker joins each input into one host tensor: only a preprocess can turn bytes into numbers.
        raise RepositoryError(name, where, f"BYTES inputs {text} need a preprocess of the model's own (model.py) "
                                           "that turns them into numeric arrays")
    return Version(model_class, ModelContext(name, number, directory, program, inputs, outputs,
                                             config.parameters, config.backend, config.inference,
                                             share_weights=config.share_weights,
                                             padding={name: (tuple(p.dims), p.value)
                                                      for name, p in config.batch_padding.items()}))


def find_program(name: str, directory: Path) -> Path | None:
    for stem in PROGRAM_PREFIXES:
        prefix = directory / stem
        if prefix.with_suffix(".json").is_file():
            # No .pdiparams is fine for a layer without parameters (jit.save writes none). A program that
            # has some would still load without them, and fail at its first forward (KeyError): refuse it.
            params = prefix.with_suffix(".pdiparams")
            if not params.is_file() and PARAMETER_OP.search(prefix.with_suffix(".json").read_bytes()):
                raise RepositoryError(name, params, "missing: the saved program's parameters (paddle.jit.save "
                                      "writes both files)")
            return prefix
        if prefix.with_suffix(".pdmodel").is_file():
            raise RepositoryError(
                name, prefix.with_suffix(".pdmodel"),
                "a legacy (pre-PIR) program, which Paddle 3.3's paddle.jit.load reads only with "
                "FLAGS_enable_pir_api=0, and then no .json program: save it again with Paddle 3 "
                f"(paddle.jit.save writes {stem}.json)",
            )
    return None


def import_model_class(name: str, source: Path) -> type[Model]:
    module_name = f"placeenv_repository.{name}.v{source.parent.name}"
    try:
        spec = importlib.util.spec_from_file_location(module_name, source)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the operator's code: report, do not crash with a traceback
        sys.modules.pop(module_name, None)
        line = _line_in(exc, source)
        raise RepositoryError(name, f"{source}{line}", f"import failed: {type(exc).__name__}: {exc}") from None
    cls = getattr(module, "Model", None)
    if not (inspect.isclass(cls) and issubclass(cls, Model)):
        raise RepositoryError(name, source, "defines no class Model(placeenv.serve.models.Model)")
    return cls


def _line_in(exc: BaseException, source: Path) -> str:
    frames = [f for f in inspect.getinnerframes(exc.__traceback__, 0) if Path(f.filename) == source]
    if isinstance(exc, SyntaxError) and exc.lineno:
        return f":{exc.lineno}"
    return f":{frames[-1].lineno}" if frames else ""


def program_specs(name: str, program: Path) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Inputs and outputs as the saved program declares them, read by loading it on the CPU once."""
    try:
        with PlaceEnv("cpu"), JIT_LOAD_LOCK:
            layer = paddle.jit.load(str(program))
        specs = program_signature(layer)
    except Exception as exc:  # noqa: BLE001 - any failure to load is the program's
        raise RepositoryError(name, program.with_suffix(".json"),
                              f"paddle.jit.load failed: {type(exc).__name__}: {str(exc)[:300]}") from None
    result = []
    for kind, found in zip(("input", "output"), specs):
        tensors = []
        for i, spec in enumerate(found):
            try:
                datatype = datatype_of(spec.dtype)
            except ValueError as exc:
                raise RepositoryError(name, program.with_suffix(".json"), f"{kind} {i}: {exc}") from None
            tensors.append(TensorSpec(spec.name or f"{kind}_{i}", datatype, tuple(int(d) for d in spec.shape)))
        result.append(tuple(tensors))
    # paddle.jit.load calls the outputs output_N; the program's fetch ops name them (fetch_name_N), as a
    # Predictor, PaddleX and Triton's Paddle backend do.
    names = fetch_names(program.with_suffix(".json"))
    if len(names) == len(result[1]):
        result[1] = tuple(dataclasses.replace(spec, name=n) for spec, n in zip(result[1], names))
    return result[0], result[1]


def fetch_names(program_json: Path) -> list[str]:
    """The names of a PIR program's outputs, from its fetch ops (``name``, in ``col`` order); none where
    the file holds none or is not such a program."""
    try:
        program = json.loads(program_json.read_bytes())
    except (OSError, ValueError):
        return []
    found: dict[int, str] = {}
    stack = [program]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if node.get("#") == "1.fetch" and isinstance(node.get("A"), list):
                attributes = {a.get("N"): (a.get("AT") or {}).get("D") for a in node["A"] if isinstance(a, dict)}
                if isinstance(attributes.get("name"), str) and isinstance(attributes.get("col"), int):
                    found[attributes["col"]] = attributes["name"]
            else:
                stack.extend(v for v in node.values() if isinstance(v, (dict, list)))
    return [found[col] for col in sorted(found)] if sorted(found) == list(range(len(found))) else []


def declared(name, source, specs, found, kind):
    if specs is None:
        return found
    try:
        return tuple(s if isinstance(s, TensorSpec) else TensorSpec(s["name"], s["datatype"], tuple(s["shape"]))
                     for s in specs)
    except (KeyError, TypeError) as exc:
        raise RepositoryError(name, source, f"Model.{kind}: each is a TensorSpec or a dict with name, "
                              f"datatype and shape ({exc!r})") from None


def overridden(name, where, specs, overrides, kind):
    if not overrides:
        return specs
    if specs and len(overrides) > len(specs):
        raise RepositoryError(name, where, f"the config overrides {len(overrides)} {kind}; the model has "
                              f"{len(specs)}")
    result = list(specs)
    for i, override in enumerate(overrides):
        base = result[i] if i < len(result) else None
        fields = {k: v for k, v in override.model_dump().items() if v is not None}
        if base is None:
            if set(fields) != {"name", "datatype", "shape"}:
                raise RepositoryError(name, where, f"{kind}[{i}] is new: give its name, datatype and shape")
            result.append(TensorSpec(fields["name"], fields["datatype"], tuple(fields["shape"])))
            continue
        if "shape" in fields and len(fields["shape"]) != len(base.shape):
            raise RepositoryError(name, where, f"{kind}[{i}] shape {fields['shape']} has another rank than "
                                  f"the program's {list(base.shape)}")
        result[i] = dataclasses.replace(base, **{k: tuple(v) if k == "shape" else v for k, v in fields.items()})
    return tuple(result)
