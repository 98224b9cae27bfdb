"""Model control: loading and unloading models while the engine serves (Triton's
``--model-control-mode explicit|poll`` and its repository extension).

One change at a time, on the event loop thread, each building the next generation (generation.py):

1. **Read** the model's directory from the configured repositories (a thread: ``jit.load`` reads each
   program's signature), with its version policy; every pipeline it would change is linked again
   against the result. A problem refuses the load here, the old versions serving on.
2. **Stage** each new or changed version on every worker that will serve it, on the worker's own
   thread (``Replicas.stage``: initialize, place check, warm-up), beside what it serves.
3. **Swap** in one turn of the loop once every worker holds its replica (``Replicas.install``, then the
   next generation in place of the current one), then hand the catalog to every front end, and wait
   until each has it. New requests are admitted under the new generation; one naming a version only
   the old generation serves (a front end's catalog a change behind) under the old one until it
   retires, and after that 404.
4. **Retire** the old generation: wait until the work admitted under it is answered (its count reaches
   zero: a request, its pipeline's steps, its model's calls, all looked up in the old generation), then
   each worker drops the replicas only the old generation held, the pool the weights its workers
   shared, and the device allocator its cached memory.

A poll (``--model-control-mode poll``) looks at every model directory's files each
``--repository-poll-s`` and loads what changed; a change that does not load leaves the old versions
serving, and says why in the log, the repository index and ``placeenv_model_load_failed``.

The control works with the engine's parts, handed to it (the worker pool, the dispatcher, what is
served, the catalog): it does not import the engine.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import threading
import time
from collections.abc import Callable, Mapping

import paddle

from .. import metrics
from ..models.repository import Entry, Pipeline, RepositoryError, fingerprint, link, read
from ..protocol.errors import InvalidInput, LoadFailed, UnknownModel
from ..protocol.request import Catalog
from .dispatch import Dispatcher
from .generation import Generation, Served
from .replica import finalize_all, stage
from .workers import WorkerPool

log = logging.getLogger(__name__)

#: A load's changes: model -> (its entry, the version numbers to build, those to retire).
Changes = dict[str, tuple[Entry, list[int], list[int]]]


class Control:
    """The engine's model control: ``load``, ``unload`` and the poll, one change at a time. ``catalog``:
    the engine's catalog as it is now, which each change hands to ``served``'s publishers."""

    def __init__(self, settings, pool: WorkerPool, dispatcher: Dispatcher, served: Served,
                 catalog: Callable[[], Catalog], seen: dict[str, str] | None = None) -> None:
        self.settings, self.pool, self.dispatcher = settings, pool, dispatcher
        self.served, self.catalog = served, catalog
        self.lock: asyncio.Lock | None = None  # made on the loop that serves (the first change's)
        self.seen: dict[str, str] = dict(seen or {})  # poll: each model directory's fingerprint at the last look

    # -- the requests --------------------------------------------------------------------------

    async def load(self, name: str) -> None:
        """Load ``name`` (a model, or a pipeline and its steps) from the repositories, or load it again
        if its files changed; ``LoadFailed`` naming why, the old versions serving on."""
        async with self._lock():
            started = time.perf_counter()
            try:
                await self._load(name)
            except LoadFailed as exc:
                self.served.load_errors[name] = str(exc)
                metrics.MODEL_LOADS.labels(name, "failed").inc()
                metrics.MODEL_LOAD_FAILED.labels(name).set(1)
                log.error("load: %s", exc)
                await self._publish()  # the index says why
                raise
            metrics.MODEL_LOADS.labels(name, "ok").inc()
            metrics.MODEL_LOAD_FAILED.labels(name).set(0)
            log.info("load: model %r loaded in %.2f s", name, time.perf_counter() - started)

    async def unload(self, name: str, dependents: bool = False) -> None:
        """Stop serving ``name``: out of the catalog at once (404), then its requests in flight drain and
        its memory is freed. A model that a pipeline runs is unloaded with ``dependents`` only."""
        async with self._lock():
            current = self.served.generation
            if name in current.pipelines:
                pipelines = {n: p for n, p in current.pipeline_definitions().items() if n != name}
                self._swap(current.next(pipelines=pipelines), retiring=False)
                await self._publish()  # (a pipeline holds no replica: nothing to free)
                return
            if name not in current.entries:
                raise UnknownModel(f"model {name!r} is not loaded; loaded: {', '.join(current.names()) or 'none'}")
            users = current.users(name)
            if users and not dependents:
                raise InvalidInput(f"model {name!r} is a step of pipeline {', '.join(map(repr, users))}: unload "
                                   "that first, or send parameters {\"unload_dependents\": true}")
            entries = {n: e for n, e in current.entries.items() if n != name}
            pipelines = {n: p for n, p in current.pipeline_definitions().items() if n not in users}
            self.served.load_errors.pop(name, None)
            metrics.MODEL_LOAD_FAILED.labels(name).set(0)
            old = self._swap(current.next(entries, pipelines))
            await self._publish()
            await self._retire(old)
            log.info("unload: model %r unloaded", name)

    def _lock(self) -> asyncio.Lock:
        if self.lock is None:
            self.lock = asyncio.Lock()
        return self.lock

    # -- a load ----------------------------------------------------------------------------------

    async def _load(self, name: str) -> None:
        found = await asyncio.to_thread(self._read, name)
        current = self.served.generation
        changed = changes(found.entries, current.entries)
        after = {**current.entries, **{model: entry for model, (entry, _, _) in changed.items()}}
        relinked = self._relinked(found.pipelines, set(changed), after, current)
        workers = {model: self._workers(entry, current) for model, (entry, _, _) in changed.items()}
        staged = await self._stage(changed, workers)
        replicas = self._built(changed, workers, staged, current)
        for adopted in [*changed, *relinked]:
            self.served.skipped.pop(adopted, None)
            self.served.load_errors.pop(adopted, None)
        self.served.load_errors.pop(name, None)
        old = self._swap(current.next(after, {**current.pipeline_definitions(), **relinked}, replicas))
        await self._publish()
        await self._retire(old)

    def _read(self, name: str):
        """The model's (or the pipeline's and its steps') entries, as the repositories hold them now."""
        settings = self.settings
        try:
            found = read(settings.repository_list(), [name], max_batch_size=settings.max_batch_size,
                         max_batch_delay_ms=settings.max_batch_delay_ms)
        except RepositoryError as exc:
            raise UnknownModel(str(exc)) from None
        if found.errors:
            raise LoadFailed("; ".join(str(e) for e in found.errors))
        return found

    def _relinked(self, pipelines: dict[str, Pipeline], changed: set[str], after: dict[str, Entry],
                  current: Generation) -> dict[str, Pipeline]:
        """The pipelines loaded, and every served one that runs a changed model, linked against ``after``."""
        wanted = dict(pipelines)
        for name, served in current.pipelines.items():
            if name not in wanted and any(s.model in changed for s in served.pipeline.steps):
                wanted[name] = served.pipeline
        names = set(wanted) | set(current.pipelines)
        found = {}
        for name, old in wanted.items():
            try:
                found[name] = link(name, old.directory, old.config, old.config_file, after, {}, names,
                                   self.settings.max_batch_size)
            except RepositoryError as exc:
                raise LoadFailed(f"pipeline {name!r} would not run on the loaded models: {exc}") from None
        return found

    def _workers(self, entry: Entry, current: Generation) -> list:
        """The workers that serve ``entry``, as its instance_group places it: those that serve its model in
        ``current``, when it is served (a load does not move a model between workers)."""
        pool = self.pool
        chosen = [w for w in pool.workers if int(w.name.rsplit("/", 1)[1]) < entry.instances(
            w.device, w.queue.workers, listed_only=w.device in pool.listed_only)]
        if not chosen:
            kinds = [g.kind for g in entry.config.instance_group or []]
            raise LoadFailed(f"model {entry.name!r}: no worker serves it (instance_group kinds {kinds}, devices "
                             f"{', '.join(pool.queues)}; a CPU queue exists only when a model at start asked for one)")
        old = current.entries.get(entry.name)
        holding = [w for w in pool.workers if any(w.name in served.replicas for key, served in current.versions.items()
                                                  if key[0] == entry.name)]
        if old is not None and holding != chosen:
            raise LoadFailed(f"model {entry.name!r}: its instance_group now places it on other workers "
                             f"({', '.join(w.name for w in chosen)}, not {', '.join(w.name for w in holding)}): "
                             "unload it and load it, or restart the service")
        return chosen

    async def _stage(self, changed: Changes, workers: dict[str, list]) -> dict[str, list[dict]]:
        """Each changed model's new versions built on each of its workers, beside what they serve (model ->
        each worker's replicas); ``LoadFailed`` naming the first worker that could not, what was built
        finalized again."""
        staged: dict[str, list[dict]] = {}
        for model, (entry, build, _) in changed.items():
            if not build:
                continue
            futures = [w.do(functools.partial(stage, w.holding.slot, entry, build)) for w in workers[model]]
            results = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)
            staged[model] = [{} if isinstance(r, BaseException) else r for r in results]
            failed = next(((w, r) for w, r in zip(workers[model], results) if isinstance(r, BaseException)), None)
            if failed is not None:
                await self._discard(staged, workers, changed)
                worker, exc = failed
                raise LoadFailed(f"model {model!r} did not load on {worker.device} (worker {worker.name}): "
                                 f"{type(exc).__name__}: {str(exc)[:500]}")
        return staged

    def _built(self, changed: Changes, workers: dict[str, list], staged: dict[str, list[dict]],
               current: Generation) -> dict:
        """The staged replicas as the next generation serves them: each version's, by worker name. A version
        loaded again from changed files lets go of the weights its workers shared (its old replicas are
        finalized once the old generation retires)."""
        replicas: dict = {}
        for model, (_, build, _) in changed.items():
            old = current.entries.get(model)
            for w, built in zip(workers[model], staged.get(model, [])):
                for key, replica in built.items():
                    replicas.setdefault(key, {})[w.name] = replica
            for n in build:
                if old is not None and n in old.versions:  # loaded again from changed files: its old weights go
                    self.pool.shares.forget(model, n, old.versions[n].fingerprint)
        return replicas

    async def _discard(self, staged: dict, workers: dict, changed: Changes) -> None:
        """Finalize what a failed load built, on each replica's own worker, and let go of the weights its
        workers shared (the new builds' own: their files' fingerprints are new)."""
        futures = []
        for model, built in staged.items():
            entry, build, _ = changed[model]
            for w, replicas in zip(workers[model], built):
                futures.append(w.do(functools.partial(finalize_all, list(replicas.values()), w.name)))
            for n in build:
                self.pool.shares.forget(model, n, entry.versions[n].fingerprint)
        await _settled(futures)
        await self._free_memory()

    # -- the swap and the old generation's retirement ----------------------------------------------

    def _swap(self, generation: Generation, retiring: bool = True) -> Generation:
        """Serve ``generation`` from now on; the old one's jobs still run on its replicas until it retires (a
        request that names a version only the old one serves is admitted under it until then)."""
        return self.served.swap(generation, retiring)

    async def _retire(self, old: Generation) -> None:
        """Once the work admitted under ``old`` is answered (or ``shutdown_grace_s`` has passed, what a
        stopping engine gives it too), finalize the replicas of its versions that no generation serves any
        more (unloaded, or loaded again from changed files) on their workers, and free their memory: the
        weights, the pool's shares, the device allocator's cache."""
        current = self.served.generation
        kept = {id(served.replicas) for served in current.versions.values()}
        gone = [served for served in old.versions.values() if id(served.replicas) not in kept]
        if gone and not await old.drained(self.settings.shutdown_grace_s):
            log.error("model control: requests for %s still in flight after the shutdown grace; dropping them",
                      sorted({served.key for served in gone}))
        self.served.retired(old)
        live = {id(served.replicas) for generation in (current, *self.served.retiring)
                for served in generation.versions.values()}
        gone = [served for served in gone if id(served.replicas) not in live]  # (another change's may serve it)
        futures = self._finalize(gone)
        await _settled(futures)
        slots = {served.replicas for served in gone}
        for replicas in slots:
            replicas.clear()
        for queue in self.dispatcher.queues.values():  # left behind by a drain that stopped waiting
            for job in queue.withdraw(slots):
                job.fail(UnknownModel(f"model {job.model[0]!r} version {job.model[1]} was unloaded"))
        for served in gone:
            if served.key not in current.versions:  # (one loaded again let go of its weights at the load)
                self.pool.shares.forget(*served.key, served.version.fingerprint)
        if futures:
            await self._free_memory()

    def _finalize(self, gone: list) -> list:
        """Each worker finalizes its replicas of the ``gone`` versions on its own thread; their futures. (A
        function of its own: no local of the caller's keeps a replica, and its weights, past the collection.)"""
        futures = []
        for w in self.pool.workers:
            held = [served.replicas[w.name] for served in gone if w.name in served.replicas]
            if held:
                futures.append(w.do(functools.partial(finalize_all, held, w.name)))
        return futures

    async def _free_memory(self) -> None:
        """Collect what the unloaded replicas leave, then hand the devices' cached memory back with every
        worker held at a batch boundary: Paddle's ``empty_cache`` releases the cached blocks of every
        device, and a worker allocating on one meanwhile crashed the process (a segfault in CI: a version
        swapped under load on sim devices). The workers serve on while the collector runs."""
        await asyncio.to_thread(_collect)
        empty = getattr(paddle.device, "empty_cache", None)  # only where Paddle has an accelerator
        if empty is None:
            return
        arrived, go = threading.Semaphore(0), threading.Event()

        def hold() -> None:
            arrived.release()
            go.wait(2 * QUIET_S)  # the control sets it; never forever

        futures = [w.do(hold) for w in self.pool.workers if not w.mailbox.closed]
        try:
            await asyncio.to_thread(_empty_once_arrived, empty, arrived, len(futures))
        finally:
            go.set()
        await _settled(futures)

    async def _publish(self) -> None:
        await self.served.publish(self.catalog())

    # -- the poll --------------------------------------------------------------------------------

    async def poll(self) -> None:
        """Until cancelled: every ``repository_poll_s``, load each model whose files changed (new ones
        too), unload each that left the repository. What fails to load is said, and tried again only
        once its files change again."""
        while True:
            await asyncio.sleep(self.settings.repository_poll_s)
            try:
                await self.poll_once()
            except Exception:  # noqa: BLE001 - a poll that fails is said; the next one looks again
                log.exception("poll: looking at the repository failed")

    async def poll_once(self) -> None:
        now = await asyncio.to_thread(look, self.settings)
        pipelines_first = sorted(now, key=lambda n: n not in self.served.generation.pipelines)
        for name in pipelines_first:
            if now[name] == self.seen.get(name):
                continue
            self.seen[name] = now[name]
            try:
                await self.load(name)
            except (LoadFailed, UnknownModel, InvalidInput) as exc:
                log.error("poll: %r changed but does not load; what served it serves on: %s", name, exc)
        for name in [n for n in self.seen if n not in now]:
            del self.seen[name]
            self.served.load_errors.pop(name, None)
            metrics.MODEL_LOAD_FAILED.labels(name).set(0)
            if name in self.served.generation.names():
                try:
                    await self.unload(name, dependents=True)
                except (UnknownModel, InvalidInput) as exc:
                    log.error("poll: %r left the repository but cannot be unloaded: %s", name, exc)


def changes(found: Mapping[str, Entry], served: Mapping[str, Entry]) -> Changes:
    """What a load of ``found`` changes in ``served``: each model new, or with versions to build (new, or
    whose files changed) or to retire."""
    changed: Changes = {}
    for model, entry in found.items():
        old = served.get(model)
        build = [n for n, v in entry.versions.items()
                 if old is None or n not in old.versions or old.versions[n].fingerprint != v.fingerprint]
        retire = [n for n in (old.versions if old else ()) if n not in entry.versions]
        if build or retire or old is None:
            changed[model] = (entry, build, retire)
    return changed


def look(settings) -> dict[str, str]:
    """Each model directory of the repositories (those PLACEENV_MODELS names, when it names some) and its
    fingerprint: what a poll compares, taken first before the engine reads the repository at start."""
    wanted = settings.model_list()
    return {name: fingerprint(directory) for name, directory in settings.model_directories().items()
            if wanted is None or name in wanted}


async def _settled(futures) -> None:
    """Wait for each of the workers' ``futures``; a failure is logged (what failed to finalize or to run is
    the control's to say, not to raise past the swap)."""
    results = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            log.error("model control: a worker's task failed: %r", result)


#: How long an unload waits for every worker to reach a batch boundary before the devices' cache is emptied
#: (a worker in a long batch, or in a call to a model another held worker serves); past it the cache is kept
#: until the next unload.
QUIET_S = 10.0


def _collect() -> None:
    """Collect what the unloaded replicas leave (the start's objects are frozen: the collector skips
    them until unfrozen)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _empty_once_arrived(empty: Callable[[], None], arrived: threading.Semaphore, workers: int) -> None:
    """``empty()`` the devices' cache once each of the ``workers`` has ``arrived`` at a batch boundary,
    where it waits."""
    deadline = time.monotonic() + QUIET_S
    if all(arrived.acquire(timeout=max(0.0, deadline - time.monotonic())) for _ in range(workers)):
        empty()
    else:
        log.warning("model control: not every worker reached a batch boundary within %g s; the devices' "
                    "cached memory is kept until the next unload", QUIET_S)

