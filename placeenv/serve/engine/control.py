"""Model control: loading and unloading models while the engine serves (Triton's
``--model-control-mode explicit|poll`` and its repository extension).

One change at a time, on the event loop thread, in four moves:

1. **Read** the model's directory from the configured repositories (a thread: ``jit.load`` reads each
   program's signature), with its version policy; every pipeline it would change is linked again
   against the result. A problem refuses the load here, the old versions serving on.
2. **Build** each new or changed version on every worker that will serve it, on the worker's own
   thread (``Worker.stage``: initialize, place check, warm-up), beside what it serves.
3. **Swap** in one turn of the loop once every worker holds its replica (``Worker.install``, the
   engine's tables, the catalog), then hand the catalog to every front end, and wait until each has it.
4. **Retire** the versions no longer served: out of the catalog at the swap (new requests get 404),
   still served to the requests already taken, which drain (``inflight``); then each worker drops its
   replicas, the pool the weights its workers shared, and the device allocator its cached memory.

A poll (``--model-control-mode poll``) looks at every model directory's files each
``--repository-poll-s`` and loads what changed; a change that does not load leaves the old versions
serving, and says why in the log, the repository index and ``placeenv_model_load_failed``.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import time
from typing import TYPE_CHECKING

import paddle

from .. import metrics
from ..models.repository import Entry, Pipeline, RepositoryError, fingerprint, link, read
from ..protocol.errors import InvalidInput, LoadFailed, UnknownModel

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger(__name__)

Key = tuple[str, int]


class Control:
    """The engine's model control: ``load``, ``unload`` and the poll, one change at a time."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.lock: asyncio.Lock | None = None  # made on the loop that serves (the first change's)
        self.seen: dict[str, str] = {}  # poll: each model directory's fingerprint at the last look

    # -- the requests --------------------------------------------------------------------------

    async def load(self, name: str) -> None:
        """Load ``name`` (a model, or a pipeline and its steps) from the repositories, or load it again
        if its files changed; ``LoadFailed`` naming why, the old versions serving on."""
        async with self._lock():
            started = time.perf_counter()
            try:
                await self._load(name)
            except LoadFailed as exc:
                self.engine.load_errors[name] = str(exc)
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
            engine = self.engine
            if name in engine.plans:
                self._drop_pipeline(name)
                await self._publish()
                return
            if name not in engine.entries:
                raise UnknownModel(f"model {name!r} is not loaded; loaded: {', '.join(self._loaded()) or 'none'}")
            users = [p for p, planned in engine.plans.items() if any(s.model == name for s in planned.pipeline.steps)]
            if users and not dependents:
                raise InvalidInput(f"model {name!r} is a step of pipeline {', '.join(map(repr, users))}: unload "
                                   "that first, or send parameters {\"unload_dependents\": true}")
            for user in users:
                self._drop_pipeline(user)
            old = engine.entries.pop(name)
            engine.pool.entries = {k: v for k, v in engine.pool.entries.items() if k != name}
            engine.load_errors.pop(name, None)
            metrics.MODEL_LOAD_FAILED.labels(name).set(0)
            retired = {(name, n): (old, v) for n, v in old.versions.items()}
            engine.retiring.update(retired)
            await self._publish()
            await self._retire(retired, {})
            log.info("unload: model %r unloaded", name)

    def _loaded(self) -> list[str]:
        return sorted([*self.engine.entries, *self.engine.plans])

    def _lock(self) -> asyncio.Lock:
        if self.lock is None:
            self.lock = asyncio.Lock()
        return self.lock

    # -- a load ----------------------------------------------------------------------------------

    async def _load(self, name: str) -> None:
        engine = self.engine
        found = await asyncio.to_thread(self._read, name)
        served = {**engine.entries}
        changed: dict[str, tuple[Entry, list[int], list[int]]] = {}  # name -> (entry, to build, to retire)
        for model, entry in found.entries.items():
            old = served.get(model)
            build = [n for n, v in entry.versions.items()
                     if old is None or n not in old.versions or old.versions[n].fingerprint != v.fingerprint]
            retire = [n for n in (old.versions if old else ()) if n not in entry.versions]
            if build or retire or old is None:
                changed[model] = (entry, build, retire)
        after = {**served, **{model: entry for model, (entry, _, _) in changed.items()}}
        relinked = self._relinked(found.pipelines, set(changed), after)
        workers = {model: self._workers(entry, served.get(model)) for model, (entry, _, _) in changed.items()}
        staged: dict[str, list[dict]] = {}  # model -> each of its workers' built replicas
        for model, (entry, build, _) in changed.items():
            if not build:
                continue
            futures = [w.do(functools.partial(w.stage, entry, build)) for w in workers[model]]
            results = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)
            staged[model] = [{} if isinstance(r, BaseException) else r for r in results]
            failed = next(((w, r) for w, r in zip(workers[model], results) if isinstance(r, BaseException)), None)
            if failed is not None:
                await self._discard(staged, workers, changed)
                worker, exc = failed
                raise LoadFailed(f"model {model!r} did not load on {worker.device} (worker {worker.name}): "
                                 f"{type(exc).__name__}: {str(exc)[:500]}")
        # The swap: one turn of the loop, so no request sees half of it.
        retired: dict[Key, tuple[Entry, object]] = {}
        replaced: dict = {}
        for model, (entry, build, retire) in changed.items():
            old = served.get(model)
            for w, built in zip(workers[model], staged.get(model, [])):
                replaced[w] = {**replaced.get(w, {}), **w.install(entry, built)}
            for n in retire:
                retired[model, n] = (old, old.versions[n])
            for n in build:
                if old is not None and n in old.versions:  # loaded again from changed files: its old weights go
                    engine.pool.shares.forget(model, n, old.versions[n].fingerprint)
            engine._adopt(entry)
            # A new dict: the pool's replacer thread reads it (a replacement worker loads what it holds).
            engine.pool.entries = {**engine.pool.entries, model: entry}
        engine.retiring.update(retired)
        for planned in relinked:
            engine._adopt_pipeline(planned)
        engine.load_errors.pop(name, None)
        engine._hold()
        await self._publish()
        await self._retire(retired, replaced)

    def _read(self, name: str):
        """The model's (or the pipeline's and its steps') entries, as the repositories hold them now."""
        settings = self.engine.settings
        try:
            found = read(settings.repository_list(), [name], max_batch_size=settings.max_batch_size,
                         max_batch_delay_ms=settings.max_batch_delay_ms)
        except RepositoryError as exc:
            raise UnknownModel(str(exc)) from None
        if found.errors:
            raise LoadFailed("; ".join(str(e) for e in found.errors))
        return found

    def _relinked(self, pipelines: dict[str, Pipeline], changed: set[str], after: dict[str, Entry]) -> list[Pipeline]:
        """The pipelines loaded, and every served one that runs a changed model, linked against ``after``."""
        engine = self.engine
        wanted = dict(pipelines)
        for name, planned in engine.plans.items():
            if name not in wanted and any(s.model in changed for s in planned.pipeline.steps):
                wanted[name] = planned.pipeline
        names = set(wanted) | set(engine.plans)
        found = []
        for name, old in wanted.items():
            try:
                found.append(link(name, old.directory, old.config, old.config_file, after, {}, names,
                                  engine.settings.max_batch_size))
            except RepositoryError as exc:
                raise LoadFailed(f"pipeline {name!r} would not run on the loaded models: {exc}") from None
        return found

    def _workers(self, entry: Entry, old: Entry | None) -> list:
        """The workers that serve ``entry``, as its instance_group places it: those that serve ``old``, when
        it is served (a load does not move a model between workers)."""
        pool = self.engine.pool
        chosen = [w for w in pool.workers if int(w.name.rsplit("/", 1)[1]) < entry.instances(
            w.device, w.queue.workers, listed_only=w.device in pool.listed_only)]
        if not chosen:
            kinds = [g.kind for g in entry.config.instance_group or []]
            raise LoadFailed(f"model {entry.name!r}: no worker serves it (instance_group kinds {kinds}, devices "
                             f"{', '.join(pool.queues)}; a CPU queue exists only when a model at start asked for one)")
        holding = [w for w in pool.workers if old is not None and any(k[0] == old.name for k in w.held)]
        if old is not None and holding != chosen:
            raise LoadFailed(f"model {entry.name!r}: its instance_group now places it on other workers "
                             f"({', '.join(w.name for w in chosen)}, not {', '.join(w.name for w in holding)}): "
                             "unload it and load it, or restart the service")
        return chosen

    async def _discard(self, staged: dict, workers: dict, changed: dict) -> None:
        """Finalize what a failed load built, on each replica's own worker, and let go of the weights its
        workers shared (the new builds' own: their files' fingerprints are new)."""
        futures = []
        for model, built in staged.items():
            entry, build, _ = changed[model]
            for w, replicas in zip(workers[model], built):
                futures.append(w.do(functools.partial(w.drop, (), replicas)))
            for n in build:
                self.engine.pool.shares.forget(model, n, entry.versions[n].fingerprint)
        await _settled(futures)
        await asyncio.to_thread(_free_memory)

    # -- retiring --------------------------------------------------------------------------------

    def _drop_pipeline(self, name: str) -> None:
        engine = self.engine
        engine.plans.pop(name, None)
        engine.pipelines.pop(name, None)

    async def _drain(self, keys: set[Key]) -> bool:
        """Wait until no request taken before now is still running ``keys``: none in flight (``inflight``),
        no pipeline run started before now, and every worker past a batch boundary since (a batch that
        began before the swap may still call one of them: ``Model.infer``). False when the wait ends at
        ``shutdown_grace_s``, what a stopping engine gives them (each is answered by its deadline anyway:
        the engine's timer answers it then)."""
        engine = self.engine
        before = engine.runs_started
        deadline = time.monotonic() + engine.settings.shutdown_grace_s
        crossed = False
        while time.monotonic() < deadline:
            if not any(engine.inflight[key] for key in keys) and all(run > before for run in engine.runs_live):
                if crossed:
                    return True
                # Each worker between two batches once: what was running at the swap has finished.
                futures = [w.do(lambda: None) for w in engine.pool.workers]
                try:
                    await asyncio.wait_for(_settled(futures), max(0.0, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    break
                crossed = True
                continue
            await asyncio.sleep(0.01)
        log.error("unload: requests for %s still in flight after the shutdown grace; dropping them", sorted(keys))
        return False

    async def _retire(self, retired: dict[Key, tuple[Entry, object]], replaced: dict) -> None:
        """Drain ``retired`` versions, then drop them and the ``replaced`` replicas on their workers and free
        their memory: the weights, the pool's shares, the device allocator's cache."""
        engine = self.engine
        if retired:
            await self._drain(set(retired))
        keys = set(retired)
        for key in keys:  # served no more: a request that names it now is refused (404)
            engine.retiring.pop(key, None)
        engine._hold()  # (the queues' models: without ``keys`` from here on)
        futures = [w.do(functools.partial(w.drop, keys, replaced.get(w))) for w in engine.pool.workers
                   if keys & w.held.keys() or replaced.get(w)]
        await _settled(futures)
        for queue in engine.dispatcher.queues.values():  # left behind by a drain that stopped waiting
            for job in queue.withdraw(keys):
                job.fail(UnknownModel(f"model {job.model[0]!r} version {job.model[1]} was unloaded"))
        for key, (_, version) in retired.items():
            engine.pool.shares.forget(*key, version.fingerprint)
            if not engine._serves(key):
                engine._forget(key)
        if futures:
            await asyncio.to_thread(_free_memory)

    async def _publish(self) -> None:
        await self.engine._publish()

    # -- the poll --------------------------------------------------------------------------------

    async def poll(self) -> None:
        """Until cancelled: every ``repository_poll_s``, load each model whose files changed (new ones
        too), unload each that left the repository. What fails to load is said, and tried again only
        once its files change again."""
        engine = self.engine
        while True:
            await asyncio.sleep(engine.settings.repository_poll_s)
            try:
                await self.poll_once()
            except Exception:  # noqa: BLE001 - a poll that fails is said; the next one looks again
                log.exception("poll: looking at the repository failed")

    async def poll_once(self) -> None:
        engine = self.engine
        now = await asyncio.to_thread(look, engine.settings)
        pipelines_first = sorted(now, key=lambda n: n not in engine.plans)
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
            engine.load_errors.pop(name, None)
            metrics.MODEL_LOAD_FAILED.labels(name).set(0)
            if name in engine.entries or name in engine.plans:
                try:
                    await self.unload(name, dependents=True)
                except (UnknownModel, InvalidInput) as exc:
                    log.error("poll: %r left the repository but cannot be unloaded: %s", name, exc)


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


def _free_memory() -> None:
    """Collect what the unloaded replicas leave (the start's objects are frozen: the collector skips
    them until unfrozen), then hand the devices' cached memory back."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    empty = getattr(paddle.device, "empty_cache", None)  # only where Paddle has an accelerator
    if empty is not None:
        empty()

