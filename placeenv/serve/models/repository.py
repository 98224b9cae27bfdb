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
the latest one by default), the highest of them the default. Nothing here runs at request time; a
load request names a model of the configured repositories, never a path or code: the files are the
operator's, as in Triton's and KServe's threat model.

``read`` walks the repositories; each step is a module of its own:

    configs.py   a model's config file (``ModelConfig``, ``read_config``), and ``RepositoryError``
    reading.py   a model's versions: their directories, programs, ``model.py`` classes, fingerprints
    warmup.py    the warm-up requests each version's workers run before it is ready
    paddlex.py   a PaddleX pipeline file's models and steps
    linking.py   a pipeline's steps linked to the models they name (``link``)
    entries.py   what these make: ``Version``, ``Entry``, ``Pipeline``
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ..config import BUNDLED, list_model_directories
from . import paddlex
from .configs import ModelConfig, RepositoryError, read_config
from .entries import Entry, Pipeline, PipelineStep, Version
from .linking import link
from .reading import fingerprint, load_entry

# The names the engine and model code import from here, wherever they are defined.
__all__ = ["BUNDLED", "Entry", "ModelConfig", "Pipeline", "PipelineStep", "Repository", "RepositoryError", "Version",
           "fingerprint", "link", "read", "read_config", "scan"]

#: A PaddleX pipeline file (models/paddlex.py), the pipeline's directory holds it in place of a config.
PADDLEX_FILE = "pipeline.yaml"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

#: Each model's config read, and the file it came from (none for a model without one), by name.
Configs = dict[str, tuple[ModelConfig, Path | None]]


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
    errors: list[RepositoryError] = []
    found = _model_directories(repositories, select, errors)
    configs, paddlex_files = _configs(found, list(found if select is None else select), errors)
    entries = {}
    for name, (config, config_file) in configs.items():
        if config.pipeline is None:
            try:
                entries[name] = load_entry(name, found[name], config, config_file, max_batch_size,
                                           max_batch_delay_ms)
            except RepositoryError as exc:
                errors.append(exc)
    paddlex_about: dict[str, dict] = {}
    for name, path in paddlex_files.items():
        try:
            made, config, about = paddlex.read(name, path, max_batch_size, max_batch_delay_ms)
        except RepositoryError as exc:
            errors.append(exc)
            continue
        entries.update(made)
        configs[name] = (config, path)
        paddlex_about[name] = about
    pipelines = _linked(found, configs, entries, errors, max_batch_size)
    for name, pipeline in pipelines.items():
        pipeline.paddlex = paddlex_about.get(name)
    return Repository(entries, pipelines, errors)


def _model_directories(repositories: list[Path], select: list[str] | None,
                       errors: list[RepositoryError]) -> dict[str, Path]:
    """Each model directory of ``repositories``, by name, a repeated name's error added to ``errors``;
    ``RepositoryError`` for a repository that is not a directory, or a model ``select`` names that none
    holds."""
    for repository in repositories:
        if not repository.is_dir():
            raise RepositoryError("*", repository, "no such directory (PLACEENV_MODEL_REPOSITORY)")
    found, repeats = list_model_directories(repositories)
    errors += [RepositoryError(child.name, child, f"also in {first.parent}: model names must be unique across "
                               "repositories") for child, first in repeats]
    if select is not None:
        unknown = [name for name in select if name not in found]
        if unknown:
            raise RepositoryError(
                ", ".join(unknown), ", ".join(str(r) for r in repositories),
                f"not in the repository (PLACEENV_MODELS); it holds: {', '.join(sorted(found)) or 'nothing'}",
            )
    return found


def _configs(found: dict[str, Path], wanted: list[str],
             errors: list[RepositoryError]) -> tuple[Configs, dict[str, Path]]:
    """The config of each model ``wanted``, and of each model a pipeline among them names as a step
    (``wanted`` grows by those); and the PaddleX pipeline files met instead, read with their models
    (``paddlex.read``). Each model that cannot be read has its error added to ``errors``."""
    configs: Configs = {}
    paddlex_files: dict[str, Path] = {}
    for name in wanted:
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
    return configs, paddlex_files


def _linked(found: dict[str, Path], configs: Configs, entries: dict[str, Entry], errors: list[RepositoryError],
            max_batch_size: int) -> dict[str, Pipeline]:
    """Each pipeline of ``configs``, linked to the ``entries`` its steps name; each that cannot be
    linked has its error added to ``errors``."""
    failed = {e.model: e.problem for e in errors}
    named = {n for n, (c, _) in configs.items() if c.pipeline is not None}
    pipelines = {}
    for name, (config, config_file) in configs.items():
        if config.pipeline is not None:
            try:
                pipelines[name] = link(name, found[name], config, config_file, entries, failed, named,
                                       max_batch_size)
            except RepositoryError as exc:
                errors.append(exc)
    return pipelines
