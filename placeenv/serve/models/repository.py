"""The model repository: Triton's layout, read once at start.

    <repository>/<model>/config.yaml | config.yml | config.toml   optional, schema ModelConfig
    <repository>/<model>/<version>/model.json + model.pdiparams   what paddle.jit.save(layer, ".../model") writes
                                  (or inference.json + inference.pdiparams, as PaddleX / PaddleOCR export)
    <repository>/<model>/<version>/model.py                       optional: a class Model (base.Model)

Versions are positive integers; the highest is the default. Nothing here runs
at request time, and no endpoint makes it read anything: the files are the
operator's, as in Triton's and KServe's threat model.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from typing import Any, Literal

import paddle
import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from placeenv import PlaceEnv
from placeenv.tensors import program_signature

from ..config import BUNDLED
from ..protocol.wire import DATATYPES, datatype_of
from . import examples
from .base import JIT_LOAD_LOCK, Model, ModelContext, TensorSpec
from .inference import Backend, InferenceOptions

__all__ = ["BUNDLED", "Entry", "ModelConfig", "RepositoryError", "scan"]

#: Bundled models whose versions are built at start into the per-user cache (an installed package
#: may be read-only): where each one's version directories are.
BUILT_AT_START = {"mobilenet": examples.mobilenet_home}

CONFIG_FILES = ("config.yaml", "config.yml", "config.toml")
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


# -- entries -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Version:
    """One version: the class serving it, and the context each of its instances gets."""

    model_class: type[Model]
    context: ModelContext

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

    def instances(self, device: str, workers: int) -> int:
        """How many of ``device``'s workers load this model."""
        groups = self.config.instance_group
        if groups is None:
            return workers
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


def scan(repositories: list[Path], select: list[str] | None, *, max_batch_size: int,
         max_batch_delay_ms: float) -> tuple[dict[str, Entry], list[RepositoryError]]:
    """Every model of ``repositories`` (or those in ``select``): the entries, and the errors of the rest."""
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
        found = {name: found[name] for name in select}
    entries = {}
    for name, directory in found.items():
        try:
            entries[name] = load_entry(name, directory, max_batch_size, max_batch_delay_ms)
        except RepositoryError as exc:
            errors.append(exc)
    return entries, errors


def load_entry(name: str, directory: Path, max_batch_size: int, max_batch_delay_ms: float) -> Entry:
    if not NAME.fullmatch(name):
        raise RepositoryError(name, directory, "a model name is letters, digits, '_', '.', '-' (at most 64)")
    config, config_file = read_config(name, directory)
    home = directory
    if directory.parent == BUNDLED and name in BUILT_AT_START:
        home = BUILT_AT_START[name]()
    versions = {}
    for child in sorted(home.iterdir()) if home.is_dir() else ():
        if child.is_dir() and child.name.isdigit() and int(child.name) > 0 and not child.name.startswith("0"):
            versions[int(child.name)] = read_version(name, child, config)
    if not versions and home != directory:
        raise RepositoryError(name, home, "not built: the service builds it at start, or run "
                              "python -m placeenv.serve.models.examples")
    if not versions:
        raise RepositoryError(name, directory, "no version directory: expected <model>/1/model.json "
                              "(paddle.jit.save(layer, '<repository>/<model>/1/model', input_spec=[...]))")
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
    return entry


def read_config(name: str, directory: Path) -> tuple[ModelConfig, Path | None]:
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


def read_version(name: str, directory: Path, config: ModelConfig) -> Version:
    program = find_program(name, directory)
    model_class = Model
    source = directory / "model.py"
    if source.is_file():
        model_class = import_model_class(name, source)
    elif program is None:
        raise RepositoryError(name, directory, "no saved program: expected model.json + model.pdiparams "
                              "(paddle.jit.save), inference.json + inference.pdiparams, or a model.py")
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
    return Version(model_class, ModelContext(name, int(directory.name), directory, program, inputs, outputs,
                                             config.parameters, config.backend, config.inference,
                                             share_weights=config.share_weights))


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
    return result[0], result[1]


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
