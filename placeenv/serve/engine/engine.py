"""The engine: models, devices, queues and workers, with one way in, ``Engine.submit``. No HTTP, no JSON.

``Engine`` puts the engine's parts together and is what the rest of the service holds:

- what it serves: one generation at a time (generation.py), swapped whole by a load or an unload
  (control.py);
- the request path (path.py): a request admitted under the generation of its moment, preprocessed
  on the CPU under ``PlaceEnv('cpu')``, queued on the least-loaded device that holds its model
  (dispatch.py), batched and run by a worker thread pinned to that device (worker.py, workers.py),
  and answered with host arrays; a request to a pipeline runs each of its steps that way, as does a
  model's call to another (pipeline.py);
- the statistics each served version keeps (stats.py), and the catalog the front ends read.

A request arrives checked against the catalog (``Catalog.check``, done by the gateway in whichever
process received it): from ``LocalEngine`` (local.py) in the single process, from
``link.EngineServer`` in the engine process; both start and stop the engine with ``running``. Every
failure is a ``ServiceError`` (protocol/errors.py), or the exception of a bug of ours; either way
every accepted request gets exactly one answer.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import numpy as np

import placeenv

from .. import metrics
from ..config import Settings
from ..models import examples
from ..models.repository import BUNDLED, Entry, Pipeline, Repository, RepositoryError, read
from ..protocol.errors import InvalidInput, StartupError
from ..protocol.request import Catalog, Work
from . import control, pipeline
from .dispatch import DeviceQueue, Dispatcher
from .generation import Generation, Served, device_of
from .path import Done, Handle, RequestPath
from .workers import WorkerPool

log = logging.getLogger(__name__)


def resolve_devices(settings: Settings) -> list[str]:
    """Device names to serve, validated; 'auto' is every accelerator, else cpu."""
    names = settings.device_list()
    if names == ["auto"]:
        names = [d for d in placeenv.available_devices() if d != "cpu"] or ["cpu"]
    good = []
    for name in names:
        try:
            good.append(placeenv.device_name(placeenv.to_place(name)))
        except ValueError as exc:
            if settings.on_device_failure == "fail":
                raise StartupError(f"device {name!r} cannot be used: {exc}") from None
            log.error("skipping device %r: %s", name, exc)
    if not good:
        raise StartupError(f"no usable device in {settings.devices!r}")
    return list(dict.fromkeys(good))


def read_repository(settings: Settings) -> tuple[Repository, dict[str, str]]:
    """The models and pipelines to serve and, with ``on_model_failure=skip``, the skipped ones' reasons.

    Refuses (``StartupError``, every problem named) under the default ``fail``.
    """
    repositories = settings.repository_list()
    if BUNDLED in repositories:
        for name in examples.BUILT_AT_START:
            try:
                examples.ensure(name)
            except OSError as exc:
                log.error("cannot build the bundled %s into %s: %s; set XDG_CACHE_HOME to a writable "
                          "directory, or run python -m placeenv.serve.models.examples DIR and serve DIR with "
                          "PLACEENV_MODEL_REPOSITORY", name, examples.home(name), exc)
    try:
        found = read(repositories, settings.model_list(), max_batch_size=settings.max_batch_size,
                     max_batch_delay_ms=settings.max_batch_delay_ms)
    except RepositoryError as exc:
        raise StartupError(f"model repository: {exc}") from None
    if found.errors and settings.on_model_failure == "fail":
        raise StartupError("model repository: " + "; ".join(str(e) for e in found.errors)
                           + " (PLACEENV_ON_MODEL_FAILURE=skip serves the rest)")
    skipped = {e.model: str(e) for e in found.errors}
    for message in skipped.values():
        log.error("not serving: %s", message)
    if not found.entries:
        raise StartupError("model repository: no model to serve")
    return found, skipped


def install(settings: Settings) -> None:
    """placeenv's isolation on, or (``isolation=off``) stock Paddle with only its first-use maps filled."""
    if settings.isolation != "off":
        placeenv.install()
        return
    placeenv.uninstall()  # the stock-Paddle demonstration
    # Not isolation: Paddle's unlocked first-use maps, which install() fills too. Without it, two
    # workers' first runs can crash the process (benchmarks/first_run_race.py), and the control would
    # show a crash instead of the leaks it is there to show.
    placeenv.prepare_devices()


def device_queues(settings: Settings, devices: list[str], entries: Mapping[str, Entry]) -> tuple[dict, frozenset]:
    """A queue for each device, and the devices whose workers serve only the models that name them."""
    queues = {d: DeviceQueue(d, settings.queue_capacity, settings.workers_per_device) for d in devices}
    cpu_counts = [g.count for e in entries.values() for g in e.config.instance_group or () if g.kind == "cpu"]
    if not cpu_counts or "cpu" in queues:
        return queues, frozenset()
    # A model whose instance_group names the CPU (a pipeline's CPU step) gets CPU workers of its own,
    # whichever devices the service serves, as Triton's KIND_CPU instances do. They are not one of the
    # service's devices: requests are answered by these.
    queues["cpu"] = DeviceQueue("cpu", settings.queue_capacity, max(cpu_counts))
    return queues, frozenset({"cpu"})


class Engine:
    """Models, devices, queues and workers: built by the single process's gateway (local.py) or the
    engine process (process/engine_main.py), each with ``running``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        install(settings)
        # What a poll compares its first look with: the files as they were before they were read.
        seen = control.look(settings) if settings.model_control_mode == "poll" else {}
        found, skipped = read_repository(settings)
        # As read, until ``start`` has built the generation that serves what of it loaded.
        self.repository: Repository | None = found
        self.devices = resolve_devices(settings)
        queues, listed_only = device_queues(settings, self.devices, found.entries)
        self.dispatcher = Dispatcher(queues)
        self.served = Served(Generation.build(found.entries, {}), skipped)
        #: Who hears of a new catalog (``catalog()``): local.py's ``LocalEngine``, process/link.py's server.
        self.publishers = self.served.publishers
        self.path = RequestPath(self.served, self.dispatcher, settings)
        self.pool = WorkerPool(queues, dict(found.entries), settings, functools.partial(pipeline.call, self.path.run),
                               listed_only, self.served)
        self.control = control.Control(settings, self.pool, self.dispatcher, self.served, self.catalog, seen)
        self.stopping = False  # not ready; requests are still served until the dispatcher closes

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        loaded = self.pool.start()
        entries, pipelines = self._settle_failures(loaded)
        replicas: dict = {}
        for worker, (built, _) in loaded.items():
            for key, replica in built.items():
                replicas.setdefault(key, {})[worker] = replica
            built.clear()  # (each worker's ready future holds it: the generation alone holds the replicas)
        self.served.swap(Generation.build(entries, pipelines, replicas, self.pool.layout), retiring=False)
        self.repository = None  # (a version unloaded later is not kept by it)
        # Paddle, FastAPI and the models leave many long-lived objects that a full collection
        # walks with the GIL held, a latency spike for every request in flight; frozen, they are skipped.
        gc.collect()
        gc.freeze()
        metrics.READY.set(1)

    def _settle_failures(self, loaded: dict[str, tuple[dict, dict[str, str]]]) -> tuple[dict[str, Entry],
                                                                                      dict[str, Pipeline]]:
        """The models and pipelines that serve once every worker has loaded what it could (``loaded``, by
        worker: what it built, what did not load and why); those that do not are skipped
        (``on_model_failure=skip``) or refuse the start (``StartupError``)."""
        entries, skipped = dict(self.repository.entries), self.served.skipped
        failures = {}
        for worker, (_, failed) in loaded.items():
            for model, why in failed.items():
                failures.setdefault(model, f"model {model!r} did not load on {device_of(worker)} (worker {worker}): "
                                           f"{why}")
        for name, entry in entries.items():
            if not any((name, n) in built for built, _ in loaded.values() for n in entry.versions):
                failures.setdefault(name, f"model {name!r}: no worker loads it (instance_group kinds "
                                    f"{[g.kind for g in entry.config.instance_group or []]}, "
                                    f"devices {', '.join(self.devices)})")
        if failures and self.settings.on_model_failure == "fail":
            self._refuse("; ".join(failures.values()) + " (PLACEENV_ON_MODEL_FAILURE=skip serves the rest)")
        for name, why in failures.items():
            log.error("not serving: %s", why)
            skipped[name] = why
            entries.pop(name, None)
        if not entries:
            self._refuse("no model could be loaded: " + "; ".join(failures.values()))
        pipelines = {}
        for name, found in self.repository.pipelines.items():
            lost = next((s for s in found.steps if s.model not in entries), None)
            if lost is None:
                pipelines[name] = found
                continue
            why = f"pipeline {name!r}: {lost} is not served: {skipped[lost.model]}"
            if self.settings.on_model_failure == "fail":  # (its model's failure is fatal before this)
                self._refuse(why)
            log.error("not serving: %s", why)
            skipped[name] = why
        return entries, pipelines

    def _refuse(self, why: str) -> None:
        self.pool.stop(5)
        raise StartupError(why)

    def begin_stopping(self) -> None:
        """Readiness off; requests are still served (a load balancer needs time to stop routing here)."""
        self.stopping = True
        metrics.READY.set(0)

    def stop(self) -> None:
        """Refuse new requests (503 Draining), let the workers finish what they hold and the pipelines
        their steps, answer the rest."""
        self.begin_stopping()
        self.dispatcher.close()
        deadline = time.monotonic() + self.settings.shutdown_grace_s
        while self.path.pipelines_running and time.monotonic() < deadline:  # their next steps are still taken
            time.sleep(0.02)
        self.pool.stop(max(0.0, deadline - time.monotonic()))
        self.dispatcher.fail_unstarted()
        self.path.preprocess_pool.shutdown(wait=True)
        log.info("stopped: %d inference requests received, %d answered", self.path.received, self.path.answered)

    def ready(self) -> bool:
        return not self.stopping and self.pool.ready()

    # -- what front ends read ------------------------------------------------------------------

    def catalog(self) -> Catalog:
        """The served models, as front ends check requests against them (after ``start``)."""
        models = self.served.generation.models()
        return Catalog(models, dict(self.served.skipped), list(self.devices), self.settings.max_examples_per_request,
                       self.dispatcher.capacity(self.settings.max_batch_size), dict(self.served.load_errors),
                       self.settings.model_control_mode)

    def status(self) -> dict:
        """Readiness, as ``/readyz`` shows it: each worker started and alive."""
        return {"ready": self.ready(), "stopping": self.stopping,
                "workers": {w.name: w.alive() and w.ready.done() for w in self.pool.workers}}

    def statistics(self, model: str | None = None, version: int | None = None) -> list[dict]:
        """Triton's statistics of every served version, of ``model``'s, or of one version."""
        generation = self.served.generation
        found = [(key, served.stats) for key, served in generation.versions.items()]
        found += [((name, served.pipeline.version), served.stats) for name, served in generation.pipelines.items()]
        # Beside Triton's fields (gRPC's answer leaves them out): what runs the version on each device.
        return [{**stats.describe(name, number),
                 "backends": {device: backend for device, backend, _ in generation.backends((name, number))}}
                for (name, number), stats in found if model in (None, name) and version in (None, number)]

    # -- model control (control.py) -------------------------------------------------------------

    async def load(self, name: str) -> None:
        """Load ``name`` from the repositories, or load it again if its files changed (explicit model
        control); answered once every worker and front end serves it."""
        self._controlled("load")
        await self.control.load(name)

    async def unload(self, name: str, dependents: bool = False) -> None:
        """Stop serving ``name``; answered once its requests in flight drained and its memory is freed."""
        self._controlled("unload")
        await self.control.unload(name, dependents)

    def _controlled(self, what: str) -> None:
        mode = self.settings.model_control_mode
        if mode == "none":
            raise InvalidInput(f"cannot {what} models: model control is off; start the service with "
                               "--model-control-mode explicit (PLACEENV_MODEL_CONTROL_MODE=explicit)")
        if mode == "poll":
            raise InvalidInput(f"cannot {what} models by request: the service polls its repository "
                               "(--model-control-mode poll); change the repository's files instead")

    # -- the request path (path.py) ------------------------------------------------------------

    def submit(self, work: Work, arrays: Mapping[str, np.ndarray], done: Done) -> Handle | None:
        """The one way in: run a checked request (``Catalog.check``), answered by ``done`` once on the
        loop thread. No task per request: a request preprocessed on the pool's threads takes one.

        Returns its handle: ``cancel()`` (on the loop thread) when its client leaves withdraws it, answered
        ``Cancelled``; None when it is answered already."""
        return self.path.submit(work, arrays, done)


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[Engine]:
    """An ``Engine`` started (its workers loaded, off the loop), its repository polled when the settings
    ask for it, and stopped at the end: requests in flight answered, new ones 503 Draining. The one way
    the single process (local.py) and the engine process (process/engine_main.py) run it."""
    engine = Engine(settings)
    await asyncio.to_thread(engine.start)
    polling = asyncio.ensure_future(engine.control.poll()) if settings.model_control_mode == "poll" else None
    try:
        yield engine
    finally:
        if polling is not None:
            polling.cancel()
        await asyncio.to_thread(engine.stop)
