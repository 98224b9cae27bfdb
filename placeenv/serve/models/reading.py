"""Reading a model's directory: its versions' directories and programs, the class serving each
(``model.py``), their inputs and outputs, and the fingerprints a poll compares (models/repository.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import inspect
import json
import re
import sys
from pathlib import Path

import paddle

from placeenv import PlaceEnv
from placeenv.tensors import program_signature

from ..config import BUNDLED
from ..protocol.wire import datatype_of
from . import examples
from .base import JIT_LOAD_LOCK, Model, ModelContext, TensorSpec
from .configs import CONFIG_FILES, ModelConfig, RepositoryError
from .entries import Entry, Version
from .runtimes import RUNTIMES
from .warmup import warmup_requests

PROGRAM_PREFIXES = ("model", "inference")
#: A parameter op in a PIR program's JSON (model.json): {"#": "p", ...}.
PARAMETER_OP = re.compile(rb'"#"\s*:\s*"p"')


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
    if config.backend in RUNTIMES and (program is None or model_class.load is not Model.load
                                       or model_class.execute is not Model.execute):
        raise RepositoryError(name, source if source.is_file() else directory,
                              f"backend {config.backend} runs the version's saved program, converted to ONNX, "
                              "through the default load() and execute(): it needs model.json (paddle.jit.save) or "
                              "inference.json and a model.py that overrides neither; set backend: auto, jit or "
                              "inference")
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
                                             runtime=config.runtime, choice=config.choice,
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
