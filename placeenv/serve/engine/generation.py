"""What the engine serves, as one immutable generation swapped whole.

A ``Generation`` holds every served version (``ServedVersion``: its entry, its preprocessing
template, its outputs' datatypes, where it preprocesses, its statistics, and its replicas on the
workers that hold it) and every served pipeline (``ServedPipeline``: its plan and statistics), and
counts the work admitted under it and not yet answered: requests, pipeline runs, and each of their
steps and calls. The catalog, the queues' dispatch and the workers' batches derive from it: a job
carries the ``ServedVersion`` it was admitted for, whose replicas the workers run it on.

The engine holds one generation at a time (``Served.generation``). A request is admitted under the
generation of its moment, and everything it leads to (a pipeline's steps, a model's call to
another) is looked up in that one, never in a later one. A load or an unload (control.py) builds
the next generation, stages its replicas on the workers, swaps the reference, then waits for the
old generation's count to reach zero before it frees what only the old one held.

A generation and its versions are frozen; what changes is counted (``Count``) or refilled (``Slots``:
a replaced worker's replica). They are made and swapped on the event loop thread; a worker reads a
generation only through the job it runs (``Job.served``, ``Job.generation``), which it does not change.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from ..models.base import Model
from ..models.repository import Entry, Pipeline, Version
from ..protocol.request import Catalog, ModelInfo, VersionInfo
from .pipeline import Plan, plan
from .stats import Stats

#: A served version: (model, version).
Key = tuple[str, int]


class Slots(dict):
    """A served version's replicas, one a worker that holds it (by the worker's name): built and put here
    before the version is served, finalized once no generation serves it, then let go of (``clear``: a
    reference left to the version, a request's or the control's, holds no weights). The one thing of a
    served version that changes: a worker that died is replaced under its name, and the replacement
    refills its slot. A dict (a worker's ``name in slots`` on every batch is the dict's own, no call of
    ours) compared by identity: one version's replicas, whichever generations serve it."""

    __slots__ = ()
    __hash__ = object.__hash__
    __eq__ = object.__eq__
    __ne__ = object.__ne__

    def names(self) -> tuple[str, ...]:
        return tuple(self)

    def refill(self, worker: str, replica: Model) -> None:
        """``worker``'s replica from now on: a replacement's (the dead worker finalized its own)."""
        self[worker] = replica

    def vacate(self, worker: str) -> None:
        """``worker`` holds it no more: a replacement that could not build it."""
        self.pop(worker, None)


def device_of(worker: str) -> str:
    """A worker's device, from its name (``sim:0/1``: sim:0's second worker)."""
    return worker.rsplit("/", 1)[0]


@dataclasses.dataclass(frozen=True, eq=False)
class ServedVersion:
    """Everything one served version needs on the request path: its entry, its preprocessing template, its
    outputs' datatypes, where it preprocesses, its statistics, and its replicas on the workers that hold it,
    with what a queue reads of them (the devices they are on, those where every worker holds it, its batch
    limits)."""

    entry: Entry
    version: Version
    template: Model  # the CPU-side instance that preprocesses: a context, never a network
    # Whether its model.py has a preprocess of its own: only such a version runs code that could make a
    # tensor, so only it needs PlaceEnv('cpu') (two Tracer switches) and may go to the pool's threads.
    own_preprocess: bool
    datatypes: dict[str, str]  # each output's
    stats: Stats  # the same object from one generation to the next while the version is served
    replicas: Slots  # the same object from one generation to the next while the same version is served
    devices: frozenset[str]  # where its workers are
    everywhere: frozenset[str]  # the devices whose every worker holds it: a job of it wakes one worker there
    limits: tuple[int, float]  # (max examples a batch, max delay in seconds)

    @property
    def key(self) -> Key:
        return (self.entry.name, self.version.number)


@dataclasses.dataclass(frozen=True, eq=False)
class ServedPipeline:
    """A served pipeline: how it runs on its generation's models, and its statistics."""

    pipeline: Pipeline
    plan: Plan
    stats: Stats


def serve_version(entry: Entry, version: Version, previous: ServedVersion | None, replicas: Slots,
                  layout: Mapping[str, int]) -> ServedVersion:
    """``version`` as a generation serves it on ``replicas``; what ``previous`` (the same key's, in the
    generation before) had is kept: its statistics, and its template when it is the same version (not
    loaded again). ``layout``: each device's number of workers."""
    if previous is not None and previous.version is version:
        template = previous.template
    else:
        template = version.model_class()
        template.context = version.context
    holders = [device_of(name) for name in replicas.names()]
    return ServedVersion(entry, version, template, type(template).preprocess is not Model.preprocess,
                         {s.name: s.datatype for s in version.outputs},
                         previous.stats if previous is not None else Stats(), replicas, frozenset(holders),
                         frozenset(d for d in holders if holders.count(d) >= layout.get(d, 1)),
                         (entry.max_batch_size, entry.max_batch_delay_ms / 1000))


class Count:
    """The work admitted under a generation and not yet answered: requests, pipeline runs, and each of
    their steps and calls (the loop thread's)."""

    __slots__ = ("admitted", "_zero")

    def __init__(self) -> None:
        self.admitted = 0
        self._zero: asyncio.Event | None = None  # set when ``admitted`` reaches zero, while waited for

    def admit(self) -> None:
        self.admitted += 1

    def release(self) -> None:
        self.admitted -= 1
        if self.admitted == 0 and self._zero is not None:
            self._zero.set()

    async def drained(self, timeout: float) -> bool:
        """Wait until none is unanswered; False when ``timeout`` passes first (each is still answered, by
        its deadline at the latest). One waiter at a time: the control's, which makes one change at a time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.admitted:  # (work may be admitted between the zero and this task's next turn)
            self._zero = asyncio.Event()
            try:
                await asyncio.wait_for(self._zero.wait(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                return self.admitted == 0
            finally:
                self._zero = None
        return True


@dataclasses.dataclass(frozen=True, eq=False)
class Generation:
    """The served versions and pipelines, the devices' workers they are laid out on (``layout``: each
    device's number of workers), and the count of the work admitted under them not yet answered."""

    entries: Mapping[str, Entry]
    versions: Mapping[Key, ServedVersion]
    pipelines: Mapping[str, ServedPipeline]
    layout: Mapping[str, int] = dataclasses.field(default_factory=dict)
    count: Count = dataclasses.field(default_factory=Count)

    @classmethod
    def build(cls, entries: Mapping[str, Entry], pipelines: Mapping[str, Pipeline],
              replicas: Mapping[Key, Mapping[str, Model]] | None = None, layout: Mapping[str, int] | None = None,
              previous: Generation | None = None) -> Generation:
        """The generation serving ``entries`` and ``pipelines`` (linked against them): each version on the
        ``replicas`` given for it (worker name -> replica), else on those of its key in ``previous`` (the one
        it follows), else on none."""
        replicas = replicas or {}
        layout = dict(layout if layout is not None else previous.layout if previous is not None else {})
        before = previous.versions if previous is not None else {}
        versions = {}
        for entry in entries.values():
            for number, version in entry.versions.items():
                key = (entry.name, number)
                old = before.get(key)
                if key in replicas:  # built for this generation
                    slots = Slots(replicas[key])
                elif old is not None:  # served on, though its entry may be read again (its files unchanged)
                    slots = old.replicas
                else:
                    slots = Slots({})
                versions[key] = serve_version(entry, version, old, slots, layout)
        old_pipelines = previous.pipelines if previous is not None else {}
        served = {name: ServedPipeline(found, plan(found, entries),
                                       old_pipelines[name].stats if name in old_pipelines else Stats())
                  for name, found in pipelines.items()}
        return cls(dict(entries), versions, served, layout)

    def next(self, entries: Mapping[str, Entry] | None = None, pipelines: Mapping[str, Pipeline] | None = None,
             replicas: Mapping[Key, Mapping[str, Model]] | None = None) -> Generation:
        """The generation after this one: ``entries`` and ``pipelines`` where given, else this one's; the
        versions ``replicas`` names on those, the rest on this one's."""
        return Generation.build(self.entries if entries is None else entries,
                                self.pipeline_definitions() if pipelines is None else pipelines, replicas,
                                previous=self)

    def pipeline_definitions(self) -> dict[str, Pipeline]:
        return {name: served.pipeline for name, served in self.pipelines.items()}

    def users(self, model: str) -> list[str]:
        """The pipelines that run ``model`` as one of their steps."""
        return [name for name, served in self.pipelines.items()
                if any(step.model == model for step in served.pipeline.steps)]

    def names(self) -> list[str]:
        """Every model and pipeline served, sorted."""
        return sorted([*self.entries, *self.pipelines])

    def held_by(self, worker: str) -> list[ServedVersion]:
        """The versions ``worker`` holds a replica of."""
        return [served for served in self.versions.values() if worker in served.replicas]

    # -- the count ---------------------------------------------------------------------------

    @property
    def admitted(self) -> int:
        return self.count.admitted

    def admit(self) -> None:
        """One more piece of work admitted under this generation (on the loop thread)."""
        self.count.admit()

    def release(self) -> None:
        """One piece of work answered (on the loop thread)."""
        self.count.release()

    async def drained(self, timeout: float) -> bool:
        """Wait until no work admitted under this generation is unanswered (``Count.drained``)."""
        return await self.count.drained(timeout)

    # -- what the protocols read ---------------------------------------------------------------

    def backends(self, key: Key) -> list[tuple[str, str, dict | None]]:
        """What runs version ``key`` on each worker that holds it: (its device, its ``Model.backend``, what
        ``auto`` measured there or None)."""
        served = self.versions.get(key)
        if served is None:
            return []
        return [(device_of(name), replica.backend, replica.choice) for name, replica in served.replicas.items()]

    def models(self) -> dict[str, ModelInfo]:
        """The catalog's models: each pipeline and model served, with what runs each version on each worker
        that holds it (``backends``)."""
        backends = self.backends
        models = {}
        for name, served in self.pipelines.items():
            found = served.pipeline
            config = found.config.model_dump(mode="json", include={"description", "max_batch_size", "pipeline"})
            if found.paddlex is not None:  # what PaddleX serving's API (http/paddlex.py) answers with
                config["paddlex"] = found.paddlex
            models[name] = ModelInfo(name, {found.version: VersionInfo(found.version, found.inputs, found.outputs,
                                                                        "ensemble")},
                                     found.max_batch_size, 0.0, found.config.description, config)
        for entry in self.entries.values():
            versions = {n: VersionInfo(n, v.inputs, v.outputs,
                                       platform(v, [b for _, b, _ in backends((entry.name, n))]))
                        for n, v in entry.versions.items()}
            # What runs the default version on each device: the backend auto chose and its measurements, or
            # why it fell back.
            found = backends((entry.name, entry.default.number))
            config = {**entry.config.model_dump(mode="json", exclude={"inputs", "outputs"}),
                      "backends": {device: backend for device, backend, _ in found}}
            measured = {device: choice for device, _, choice in found if choice is not None}
            if measured:
                config["backend_choice"] = measured
            models[entry.name] = ModelInfo(
                entry.name, versions, entry.max_batch_size, entry.max_batch_delay_ms, entry.config.description, config)
        return models


def platform(version: Version, backends: list[str]) -> str:
    """The Open Inference Protocol's platform of a version: ``paddle_python`` where Python code of its own
    is its forward (no saved program, or an ``execute`` of its own: a model.py, a PaddleX pipeline's CPU
    step), else what runs its program on its workers (``backends``, each a ``Model.backend``):
    ``paddle_inference`` (a Predictor), ``paddle_jit`` (``paddle.jit.load``), Triton's ``onnxruntime_onnx``
    and ``openvino``, joined by ``+`` where its devices differ."""
    if version.program is None or version.model_class.execute is not Model.execute:
        return "paddle_python"
    names = {"inference": "paddle_inference", "onnxruntime": "onnxruntime_onnx", "openvino": "openvino"}
    found = sorted({names.get(b.split(" ", 1)[0], "paddle_jit") for b in backends})
    return "+".join(found) or "paddle_jit"


class Served:
    """What the engine serves now: its one generation, what it could not serve (``skipped`` at start,
    ``load_errors`` of the last failed loads, whose old versions serve on), and who hears of a new
    catalog (``publishers``, in the order added; one may be a coroutine function: the engine
    process's front ends, which it waits for)."""

    def __init__(self, generation: Generation, skipped: dict[str, str]) -> None:
        self.generation = generation
        self.retiring: list[Generation] = []  # swapped out, not retired yet (control.py)
        self.skipped = skipped
        self.load_errors: dict[str, str] = {}
        self.publishers: list[Callable[[Catalog], Any]] = []

    def swap(self, generation: Generation, retiring: bool = True) -> Generation:
        """Serve ``generation`` from now on (one assignment: no request sees half of a change); the old one,
        which is ``retiring`` until ``retired`` unless told otherwise."""
        old, self.generation = self.generation, generation
        if retiring:
            self.retiring.append(old)
        return old

    def retired(self, old: Generation) -> None:
        """``old`` admits nothing more."""
        if old in self.retiring:
            self.retiring.remove(old)

    def admitting(self, key: Key) -> Generation | None:
        """For a request naming ``key``, which the current generation does not serve: a generation still
        retiring that serves it (a front end's catalog may be one change behind until the change reaches
        it); None."""
        return next((g for g in reversed(self.retiring) if key in g.versions), None)

    async def publish(self, catalog: Catalog) -> None:
        """Hand ``catalog`` to everyone who answers from it; wait for those who say when they have it."""
        for publish in self.publishers:
            done = publish(catalog)
            if asyncio.iscoroutine(done):
                await done
