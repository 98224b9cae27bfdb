"""The engine: models, devices, queues and workers, with one way in, ``Engine.submit``. No HTTP, no JSON.

A request arrives checked against the catalog (``Catalog.check``, done by the gateway
in whichever process received it): from ``LocalEngine`` (local.py) in the single
process, from ``link.EngineServer`` in the engine process. Here it is preprocessed
on the CPU under ``PlaceEnv('cpu')``, queued on the least-loaded device that holds
the model (dispatch.py), batched and run by a worker thread pinned to that device
(workers.py), and answered with host arrays. Every failure is a ``ServiceError``
(protocol/errors.py), or the exception of a bug of ours; either way every accepted
request gets exactly one answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import placeenv
from placeenv import PlaceEnv

from .. import metrics
from ..config import Settings
from .dispatch import DeviceQueue, Dispatcher, Job, Settled
from ..protocol.errors import InvalidInput, ModelFailed, ServiceError, StartupError, UnknownModel
from ..models import examples
from ..models.base import InputError, Model, ModelError, host_inputs
from ..models.repository import BUNDLED, Entry, RepositoryError, Version, scan
from ..protocol.request import Catalog, ModelInfo, Result, VersionInfo, Work
from .workers import Answer, PlaceChecker, WorkerPool

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Stats:
    """Per model version, Triton's statistics shape: counts, and cumulative nanoseconds per stage."""

    success: int = 0
    success_ns: int = 0
    fail: int = 0
    fail_ns: int = 0
    queue_ns: int = 0
    compute_ns: int = 0
    preprocess_ns: int = 0
    last_inference_ms: int = 0

    def describe(self, name: str, version: int) -> dict:
        pair = lambda count, ns: {"count": count, "ns": ns}
        return {
            "name": name, "version": str(version), "last_inference": self.last_inference_ms,
            "inference_count": self.success, "execution_count": self.success,
            "inference_stats": {
                "success": pair(self.success, self.success_ns), "fail": pair(self.fail, self.fail_ns),
                "queue": pair(self.success, self.queue_ns), "compute_input": pair(self.success, self.preprocess_ns),
                "compute_infer": pair(self.success, self.compute_ns), "compute_output": pair(self.success, 0),
            },
        }


def platform(version: Version) -> str:
    """The Open Inference Protocol's platform of a version: a model.py of its own, or a saved program."""
    return "paddle_python" if version.model_class.__module__.startswith("placeenv_repository") else "paddle_jit"


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


def read_repository(settings: Settings) -> tuple[dict[str, Entry], dict[str, str]]:
    """The entries to serve and, with ``on_model_failure=skip``, the skipped ones' reasons.

    Refuses (``StartupError``, every problem named) under the default ``fail``.
    """
    repositories = settings.repository_list()
    if BUNDLED in repositories:
        try:
            examples.ensure_mobilenet()
        except OSError as exc:
            log.error("cannot build the bundled mobilenet into %s: %s; set XDG_CACHE_HOME to a writable "
                      "directory, or run python -m placeenv.serve.models.examples DIR and serve DIR with "
                      "PLACEENV_MODEL_REPOSITORY", examples.mobilenet_home(), exc)
    try:
        entries, errors = scan(repositories, settings.model_list(), max_batch_size=settings.max_batch_size,
                               max_batch_delay_ms=settings.max_batch_delay_ms)
    except RepositoryError as exc:
        raise StartupError(f"model repository: {exc}") from None
    if errors and settings.on_model_failure == "fail":
        raise StartupError("model repository: " + "; ".join(str(e) for e in errors)
                           + " (PLACEENV_ON_MODEL_FAILURE=skip serves the rest)")
    skipped = {e.model: str(e) for e in errors}
    for message in skipped.values():
        log.error("not serving: %s", message)
    if not entries:
        raise StartupError("model repository: no model to serve")
    return entries, skipped


#: How the engine answers a request: ``done(result, None)`` or ``done(None, error)``, once, on the loop thread.
Done = Callable[["Result | None", "BaseException | None"], None]


class Engine:
    """Models, devices, queues and workers: built by the single process's gateway (local.py) or the
    engine process (process/engine_main.py)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        if settings.isolation == "off":
            placeenv.uninstall()  # the stock-Paddle demonstration
            # Not isolation: Paddle's unlocked first-use maps, which install() fills too. Without it,
            # two workers' first runs can crash the process (benchmarks/first_run_race.py), and the
            # control would show a crash instead of the leaks it is there to show.
            placeenv.prepare_devices()
        else:
            placeenv.install()
        self.entries, self.skipped = read_repository(settings)
        # CPU-side instances for preprocessing: they have a context, never a network.
        self.templates: dict[tuple[str, int], Model] = {}
        for entry in self.entries.values():
            for number, version in entry.versions.items():
                template = version.model_class()
                template.context = version.context
                self.templates[entry.name, number] = template
        # The versions whose model.py has a preprocess of its own: only they run code that could make
        # a tensor, so only they need PlaceEnv('cpu') (two Tracer switches) and may go to the pool.
        self.own_preprocess = {key: type(t).preprocess is not Model.preprocess for key, t in self.templates.items()}
        self.devices = resolve_devices(settings)
        queues = {
            d: DeviceQueue(d, settings.queue_capacity, settings.workers_per_device) for d in self.devices
        }
        self.dispatcher = Dispatcher(queues)
        self.pool = WorkerPool(queues, dict(self.entries), settings)
        self.preprocess_pool = ThreadPoolExecutor(settings.preprocess_threads, thread_name_prefix="preprocess")
        self.check_cpu = PlaceChecker("preprocess", "cpu")
        self.stats = {key: Stats() for key in self.templates}  # written on the event loop thread only
        self.received = self.answered = 0  # requests submitted / answered
        self.stopping = False  # not ready; requests are still served until the dispatcher closes

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self.pool.start()
        self._settle_failures()
        # Paddle, FastAPI and the models leave many long-lived objects that a full collection
        # walks with the GIL held, a latency spike for every request in flight; frozen, they are skipped.
        gc.collect()
        gc.freeze()
        metrics.READY.set(1)

    def _settle_failures(self) -> None:
        failures = {}
        for worker in self.pool.workers:
            for model, why in worker.failed.items():
                failures.setdefault(model, f"model {model!r} did not load on {worker.device}: {why}")
        unserved = [name for name in self.entries if not any(
            (name, n) in w.held for w in self.pool.workers for n in self.entries[name].versions)]
        for name in unserved:
            failures.setdefault(name, f"model {name!r}: no worker loads it (instance_group kinds "
                                f"{[g.kind for g in self.entries[name].config.instance_group or []]}, "
                                f"devices {', '.join(self.devices)})")
        if failures and self.settings.on_model_failure == "fail":
            self.pool.stop(5)
            raise StartupError("; ".join(failures.values()) + " (PLACEENV_ON_MODEL_FAILURE=skip serves the rest)")
        for name, why in failures.items():
            log.error("not serving: %s", why)
            self.skipped[name] = why
            self.entries.pop(name, None)
            self.pool.entries.pop(name, None)
        if not self.entries:
            self.pool.stop(5)
            raise StartupError("no model could be loaded: " + "; ".join(failures.values()))
        for queue in self.dispatcher.queues.values():
            held = [{k for k in w.held if k[0] in self.entries} for w in self.pool.workers if w.queue is queue]
            queue.models = set().union(*held)
            queue.uniform = all(h == held[0] for h in held)

    def begin_stopping(self) -> None:
        """Readiness off; requests are still served (a load balancer needs time to stop routing here)."""
        self.stopping = True
        metrics.READY.set(0)

    def stop(self) -> None:
        """Refuse new requests (503 Draining), let the workers finish what they hold, answer the rest."""
        self.begin_stopping()
        self.dispatcher.close()
        self.pool.stop(self.settings.shutdown_grace_s)
        self.dispatcher.fail_unstarted()
        self.preprocess_pool.shutdown(wait=True)
        log.info("stopped: %d inference requests received, %d answered", self.received, self.answered)

    def ready(self) -> bool:
        return not self.stopping and self.pool.ready()

    # -- what front ends read ------------------------------------------------------------------

    def catalog(self) -> Catalog:
        """The served models, as front ends check requests against them (after ``start``)."""
        models = {}
        for entry in self.entries.values():
            versions = {n: VersionInfo(n, v.inputs, v.outputs, platform(v)) for n, v in entry.versions.items()}
            # What runs the default version on each device: the backend auto chose, or why it fell back.
            key = (entry.name, entry.default.number)
            backends = {w.device: w.backends[key] for w in self.pool.workers if key in w.backends}
            models[entry.name] = ModelInfo(
                entry.name, versions, entry.max_batch_size, entry.max_batch_delay_ms, entry.config.description,
                {**entry.config.model_dump(mode="json", exclude={"inputs", "outputs"}), "backends": backends})
        return Catalog(models, dict(self.skipped), list(self.devices), self.settings.max_examples_per_request,
                       self.dispatcher.capacity(self.settings.max_batch_size))

    def status(self) -> dict:
        """Readiness, as ``/readyz`` shows it: each worker started and alive."""
        return {"ready": self.ready(), "stopping": self.stopping,
                "workers": {w.name: w.alive() and w.ready.is_set() for w in self.pool.workers}}

    def statistics(self, model: str | None = None, version: int | None = None) -> list[dict]:
        """Triton's statistics of every served version, of ``model``'s, or of one version."""
        return [stats.describe(name, number) for (name, number), stats in self.stats.items()
                if name in self.entries and model in (None, name) and version in (None, number)]

    # -- the request path --------------------------------------------------------------------

    def submit(self, work: Work, arrays: Mapping[str, np.ndarray], done: Done) -> None:
        """The one way in: run a checked request (``Catalog.check``), answered by ``done`` once on the
        loop thread. No task per request: a request preprocessed on the pool's threads takes one."""
        key = (work.model, work.version)
        self.received += 1  # event-loop thread only

        def answer(result: Result | None, error: BaseException | None) -> None:
            self.answered += 1
            if error is None:
                self._succeeded(key, result)
            else:
                self._failed(key, work.arrived)
            done(result, error)

        try:
            entry, version, template = self._served(work)
            self.dispatcher.admit(key)  # before spending CPU on preprocessing
            if self._preprocess_inline(key, work):
                self._enqueue(entry, version, work, self._prepare(key, entry, template, arrays), answer)
            else:
                asyncio.ensure_future(self._preprocess_then_enqueue(entry, version, template, work, arrays, answer))
        except Exception as exc:  # a ServiceError, or a bug of ours: answered either way
            answer(None, exc)

    def _served(self, work: Work) -> tuple[Entry, Version, Model]:
        """What serves ``work``; ``UnknownModel`` when nothing does (a front end's catalog may be older)."""
        entry = self.entries.get(work.model)
        template = self.templates.get((work.model, work.version))
        if entry is None or template is None:  # a template is made for every version the entry had
            raise UnknownModel(f"model {work.model!r} version {work.version} is not served")
        return entry, entry.versions[work.version], template

    def _preprocess_inline(self, key: tuple[str, int], work: Work) -> bool:
        """Where a request is preprocessed: on the event loop thread when the model has no preprocess of
        its own or the request is small (cheaper than two thread hand-offs), else on the pool's threads."""
        return work.inline or not self.own_preprocess[key]

    async def _preprocess_then_enqueue(self, entry: Entry, version: Version, template: Model, work: Work,
                                       arrays, answer: Done) -> None:
        try:
            loop = asyncio.get_running_loop()
            try:
                tensors = await loop.run_in_executor(self.preprocess_pool, self._preprocess, template, arrays)
            except Exception as exc:
                raise self._preprocess_error(entry, exc) from None
            self._enqueue(entry, version, work, tensors, answer)
        except Exception as exc:  # a ServiceError (Draining meanwhile, Overloaded), or a bug of ours
            answer(None, exc)

    def _failed(self, key: tuple[str, int], arrived: float) -> None:
        stats = self.stats.get(key)
        if stats is not None:
            stats.fail += 1
            stats.fail_ns += int((time.perf_counter() - arrived) * 1e9)

    def _succeeded(self, key: tuple[str, int], result: Result) -> None:
        stats = self.stats[key]
        timings = result.timings
        stats.success += 1
        stats.success_ns += int(timings["total_ms"] * 1e6)
        stats.queue_ns += int(timings["queue_ms"] * 1e6)
        stats.compute_ns += int(timings["compute_ms"] * 1e6)
        stats.preprocess_ns += int(timings["preprocess_ms"] * 1e6)
        stats.last_inference_ms = int(time.time() * 1000)

    def _prepare(self, key: tuple[str, int], entry: Entry, template: Model, arrays) -> dict:
        """Preprocess on this thread (``_preprocess_inline``)."""
        try:
            if not self.own_preprocess[key]:
                # Nothing runs that could make a tensor, so no PlaceEnv('cpu'), whose two Tracer
                # switches cost a small request time for nothing.
                return host_inputs(template.context, arrays)
            return self._preprocess(template, arrays)
        except Exception as exc:
            raise self._preprocess_error(entry, exc) from None

    @staticmethod
    def _preprocess_error(entry: Entry, exc: Exception) -> ServiceError:
        if isinstance(exc, InputError):
            return InvalidInput(str(exc))
        if isinstance(exc, ServiceError):
            return exc
        log.error("model %r: preprocess failed", entry.name, exc_info=exc)
        return ModelFailed(f"model {entry.name!r}: preprocess failed: {type(exc).__name__}: {str(exc)[:300]}")

    def _enqueue(self, entry: Entry, version: Version, work: Work, tensors, answer: Done) -> None:
        """Queue a preprocessed request on a device, with a timer at its deadline; the job's answer, from
        a worker or the timer, becomes the request's ``Result`` or error."""
        loop = asyncio.get_running_loop()
        preprocessed = time.perf_counter()
        metrics.ON_LOOP.observe(metrics.ON_LOOP.preprocess, (entry.name,), preprocessed - work.arrived)

        def settled(found: Answer | None, error: BaseException | None) -> None:
            timer.cancel()
            if error is None:
                try:
                    result = self._result(entry, version, job, found, work.outputs, preprocessed, work.arrived)
                except Exception as exc:  # a bug of ours: still answered
                    error = exc
            if error is not None:
                if isinstance(error, ServiceError):
                    error.device = job.device or "none"
                answer(None, error)
            else:
                answer(result, None)

        job = Job(
            model=(entry.name, version.number), inputs=tensors, examples=work.examples,
            batched=entry.max_batch_size > 0, loop=loop, future=Settled(settled), arrived=work.arrived,
            deadline=work.deadline,
        )
        self.dispatcher.submit(job)  # Overloaded or Draining
        # A timer, not asyncio.wait(timeout=): one handle instead of a waiter future and callbacks.
        timer = loop.call_later(max(0.0, job.deadline - time.perf_counter()), job.expire)

    def _result(self, entry: Entry, version: Version, job: Job, answer: Answer, wanted: list[str],
                preprocessed: float, arrived: float) -> Result:
        done = time.perf_counter()
        datatypes = {spec.name: spec.datatype for spec in version.outputs}
        return Result(
            model=entry.name, version=version.number,
            outputs={name: answer.outputs[name] for name in wanted},
            datatypes={name: datatypes[name] for name in wanted},
            device=answer.device, worker=answer.worker, batch_size=answer.batch_size,
            batched=entry.max_batch_size > 0,
            timings={
                "preprocess_ms": round((preprocessed - arrived) * 1000, 3),
                "queue_ms": round((answer.compute_started - job.enqueued) * 1000, 3),
                "compute_ms": round((done - answer.compute_started) * 1000, 3),
                "total_ms": round((done - arrived) * 1000, 3),
            },
        )

    @PlaceEnv("cpu")
    def _preprocess(self, template: Model, arrays: dict[str, np.ndarray]) -> dict:
        """The model's preprocess, in input order: host arrays as they are (the worker makes one host
        tensor per batch of them, not one per request), tensors checked to be on the CPU."""
        # Arrays read over a binary body or the link's frames are read-only; a model's preprocess may
        # change its inputs in place.
        arrays = {n: a if a.flags.writeable else a.copy() for n, a in arrays.items()}
        try:
            prepared = host_inputs(template.context, template.preprocess(arrays))
        except ModelError as exc:
            raise ModelFailed(str(exc)) from None
        for value in prepared.values():
            if not isinstance(value, np.ndarray):
                self.check_cpu("preprocess", placeenv.device_name(value.place))
        return prepared

