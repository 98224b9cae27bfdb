"""Linking a pipeline's steps to the models they name: every tensor checked from the pipeline's inputs
through its steps to its outputs, as the repository is read (models/repository.py); nothing here runs
at request time (engine/pipeline.py runs the steps)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .base import TensorSpec
from .configs import STEP_FIELDS, ModelConfig, RepositoryError, Step, TensorOverride
from .entries import Entry, Pipeline, PipelineStep, Version
from .reading import PROGRAM_PREFIXES


#: Every tensor of a pipeline by name: its spec and what makes it (a pipeline input, or a step's output).
Made = dict[str, tuple[TensorSpec, str]]


def link(name: str, directory: Path, config: ModelConfig, config_file: Path | None, entries: dict[str, Entry],
         failed: dict[str, str], pipelines: set[str], max_batch_size: int) -> Pipeline:
    """A pipeline's steps linked to the models they name, every tensor checked from the pipeline's inputs
    through the steps to its outputs; ``RepositoryError`` naming the step and what is wrong."""

    def refuse(problem: str) -> RepositoryError:
        return RepositoryError(name, config_file, f"pipeline: {problem}")

    _check_its_own(refuse, name, directory, config)
    inputs = _declared_in_full(refuse, config.inputs, "inputs")
    outputs = _declared_in_full(refuse, config.outputs, "outputs")
    made: Made = {spec.name: (spec, "a pipeline input") for spec in inputs}
    steps = _linked_steps(refuse, name, config.pipeline, entries, failed, pipelines, made)
    _check_tensors(refuse, steps, entries, made, outputs)
    batch = _batch_size(refuse, config, steps, entries, inputs, max_batch_size)
    return Pipeline(name, directory, config, config_file, inputs, outputs, _ordered(refuse, steps), batch)


def _check_its_own(refuse, name: str, directory: Path, config: ModelConfig) -> None:
    """Refused: a pipeline that sets what only its steps' models take, lists no step, or has a version
    directory holding a program or a model.py."""
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


def _linked_steps(refuse, name: str, listed: list[Step], entries: dict[str, Entry], failed: dict[str, str],
                  pipelines: set[str], made: Made) -> list[PipelineStep]:
    """Each step ``listed``, linked to its model's version, every key it maps checked against that
    version's inputs and outputs; the tensors its outputs become added to ``made``."""
    steps, counts = [], {}
    for index, step in enumerate(listed, 1):
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
        steps.append(PipelineStep(index, label, step.model, version.number, dict(step.inputs), dict(step.outputs),
                                  step.parameters))
    return steps


def _check_tensors(refuse, steps: list[PipelineStep], entries: dict[str, Entry], made: Made,
                   outputs: tuple[TensorSpec, ...]) -> None:
    """Refused: a step reading a tensor nothing makes, or one that does not fit its input; an output of
    the pipeline no step makes, or one that does not fit it; a tensor nothing reads."""
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


def _batch_size(refuse, config: ModelConfig, steps: list[PipelineStep], entries: dict[str, Entry],
                inputs: tuple[TensorSpec, ...], max_batch_size: int) -> int:
    """The pipeline's max_batch_size: its config's, or the service's; refused where its inputs do not
    batch, or where it is more than a batching step takes."""
    batchable = all(spec.shape[:1] == (-1,) for spec in inputs)
    if config.max_batch_size is not None and config.max_batch_size > 0 and not batchable:
        raise refuse(f"max_batch_size {config.max_batch_size} needs every input's first dimension dynamic (-1)")
    # At most each batching step's: what it says it takes, every step takes in one forward pass (a job of
    # more rows is queued as parts, engine/forward.py split).
    smallest = min(((entries[s.model].max_batch_size, s) for s in steps if entries[s.model].max_batch_size > 0),
                   default=None, key=lambda found: found[0])
    if config.max_batch_size is not None and smallest is not None and config.max_batch_size > smallest[0]:
        raise refuse(f"max_batch_size {config.max_batch_size} is more than {smallest[1]} takes: "
                     f"its model's max_batch_size is {smallest[0]}")
    return config.max_batch_size if config.max_batch_size is not None else (
        min(max_batch_size, smallest[0]) if batchable and smallest is not None else max_batch_size if batchable else 0)


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
