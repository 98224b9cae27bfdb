"""The engine: models, devices, queues and workers, with one way in, ``Engine.submit``. No HTTP, no JSON.

A request arrives checked against the catalog (``Catalog.check``, done by the gateway
in whichever process received it): from ``LocalEngine`` (local.py) in the single
process, from ``link.EngineServer`` in the engine process. Here it is preprocessed
on the CPU under ``PlaceEnv('cpu')``, queued on the least-loaded device that holds
the model (dispatch.py), batched and run by a worker thread pinned to that device
(workers.py), and answered with host arrays. A request to a pipeline runs each of its
steps that way, as does a model's call to another (pipeline.py). Every failure is a
``ServiceError`` (protocol/errors.py), or the exception of a bug of ours; either way
every accepted request gets exactly one answer.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import gc
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

import placeenv
from placeenv import PlaceEnv

from .. import metrics
from ..config import Settings
from .dispatch import DeviceQueue, Dispatcher, Job, Settled, Ticket, batch_key, shape_key
from ..protocol.errors import (Cancelled, InvalidInput, ModelFailed, ServiceError, StartupError, Timeout,
                               UnknownModel)
from ..models import examples
from ..models.base import CALLS, InputError, Model, ModelError, host_inputs
from ..models.repository import BUNDLED, Entry, Pipeline, Repository, RepositoryError, Version, read
from ..protocol.request import Catalog, ModelInfo, Result, VersionInfo, Work
from . import pipeline
from . import control
from .workers import Answer, PlaceChecker, WorkerPool, split

log = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class Stats:
    """Per model version, Triton's statistics (``ModelStatistics``): requests answered and failed, the
    examples they held, the batches that ran, and cumulative nanoseconds per stage. Each request counts
    its batch's stages, as Triton's do; the batch itself is counted once, by its size."""

    success: int = 0
    success_ns: int = 0
    fail: int = 0
    fail_ns: int = 0
    queue_ns: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    inferences: int = 0  # examples answered
    executions: int = 0  # forward passes (a pipeline's: its requests answered)
    last_inference_ms: int = 0
    batches: dict[int, list[int]] = dataclasses.field(default_factory=dict)  # size -> [count, ns of each stage]

    def succeeded(self, taken: float, job: Job, answer: Answer) -> None:
        """A job taken at ``taken`` (its request's arrival, or its step's), answered by a worker."""
        self.success += 1
        self.success_ns += int((time.perf_counter() - taken) * 1e9)
        self.queue_ns += int((answer.compute_started - job.enqueued) * 1e9)
        self.inferences += job.examples
        self.last_inference_ms = int(time.time() * 1000)
        for batch in answer.batches:  # (more than one for a job run as parts: workers.split)
            self.input_ns += batch.input_ns
            self.infer_ns += batch.infer_ns
            self.output_ns += batch.output_ns
            if not batch.counted:  # its first job answered here: the other jobs of the batch share it
                batch.counted = True
                self.executions += 1
                row = self.batches.get(batch.size)
                if row is None:
                    row = self.batches[batch.size] = [0, 0, 0, 0]
                row[0] += 1
                row[1] += batch.input_ns
                row[2] += batch.infer_ns
                row[3] += batch.output_ns

    def pipeline_succeeded(self, taken: float, examples: int, queue_ms: float, stages: list[int]) -> None:
        """A pipeline's request taken at ``taken``: its steps' time in their queues and the stages of
        their batches (``stages``: ns of input, infer, output), summed, as Triton's ensembles report."""
        self.success += 1
        self.success_ns += int((time.perf_counter() - taken) * 1e9)
        self.queue_ns += int(queue_ms * 1e6)
        self.input_ns += stages[0]
        self.infer_ns += stages[1]
        self.output_ns += stages[2]
        self.inferences += examples
        self.executions += 1
        self.last_inference_ms = int(time.time() * 1000)

    def failed(self, taken: float) -> None:
        self.fail += 1
        self.fail_ns += int((time.perf_counter() - taken) * 1e9)

    def describe(self, name: str, version: int) -> dict:
        """Triton's ``ModelStatistics`` of this version, as its HTTP endpoint writes it (numbers, not strings)."""
        pair = lambda count, ns: {"count": count, "ns": ns}
        done = self.success
        return {
            "name": name, "version": str(version), "last_inference": self.last_inference_ms,
            "inference_count": self.inferences, "execution_count": self.executions,
            "inference_stats": {
                "success": pair(done, self.success_ns), "fail": pair(self.fail, self.fail_ns),
                "queue": pair(done, self.queue_ns), "compute_input": pair(done, self.input_ns),
                "compute_infer": pair(done, self.infer_ns), "compute_output": pair(done, self.output_ns),
                "cache_hit": pair(0, 0), "cache_miss": pair(0, 0),  # no response cache
            },
            "batch_stats": [
                {"batch_size": size, "compute_input": pair(count, input_ns), "compute_infer": pair(count, infer_ns),
                 "compute_output": pair(count, output_ns)}
                for size, (count, input_ns, infer_ns, output_ns) in sorted(self.batches.items())],
        }


def timings(taken: float, job: Job, answer: Answer) -> dict[str, float]:
    """Milliseconds of a job taken at ``taken``: preprocessing, in its queue, computing (its batch's
    forward pass and the hop back), in all."""
    done = time.perf_counter()
    return {
        "preprocess_ms": round((job.enqueued - taken) * 1000, 3),
        "queue_ms": round((answer.compute_started - job.enqueued) * 1000, 3),
        "compute_ms": round((done - answer.compute_started) * 1000, 3),
        "total_ms": round((done - taken) * 1000, 3),
    }


def platform(version: Version, backends: list[str]) -> str:
    """The Open Inference Protocol's platform of a version: ``paddle_python`` where Python code of its own
    is its forward (no saved program, or an ``execute`` of its own: a model.py, a PaddleX pipeline's CPU
    step), else what runs its program on its workers (``backends``, each a ``Model.backend``):
    ``paddle_inference`` (a Predictor), ``paddle_jit`` (``paddle.jit.load``), both joined by ``+`` where
    its devices differ."""
    if version.program is None or version.model_class.execute is not Model.execute:
        return "paddle_python"
    found = sorted({"paddle_inference" if b.startswith("inference") else "paddle_jit" for b in backends})
    return "+".join(found) or "paddle_jit"


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


#: How the engine answers a request: ``done(result, None)`` or ``done(None, error)``, once, on the loop thread.
Done = Callable[["Result | None", "BaseException | None"], None]
#: What ``Engine.submit`` gives back to cancel a request: its job, a ticket for the job to come, or its
#: pipeline's run; each has ``cancel()``.
Handle = "Job | Ticket | pipeline.PipelineRun"


def withdrawn(work: Work, error: ServiceError, ran: bool) -> None:
    """Count a request answered ``Timeout`` (whose deadline it was, and whether a worker had begun on it:
    ``ran``) or ``Cancelled`` (where its cancel found it)."""
    if isinstance(error, Cancelled):
        metrics.child(metrics.CANCELLED, work.model, error.stage).inc()
    else:
        metrics.child(metrics.EXPIRED, work.model, "client" if work.own_deadline else "service",
                      "running" if ran else "queued").inc()


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
        # What a poll compares its first look with: the files as they were before they were read.
        seen = control.look(settings) if settings.model_control_mode == "poll" else {}
        found, self.skipped = read_repository(settings)
        # Changed in place by a load or an unload, on the loop: ``pipeline.call`` holds this dict and reads
        # one entry from a worker thread (a single lookup, safe beside a change).
        self.entries, self.pipelines = found.entries, found.pipelines
        # CPU-side instances for preprocessing: they have a context, never a network.
        self.templates: dict[tuple[str, int], Model] = {}
        # The versions whose model.py has a preprocess of its own: only they run code that could make
        # a tensor, so only they need PlaceEnv('cpu') (two Tracer switches) and may go to the pool.
        self.own_preprocess: dict[tuple[str, int], bool] = {}
        self.datatypes: dict[tuple[str, int], dict[str, str]] = {}
        # Written on the event loop thread only: each version's, and each pipeline's.
        self.stats: dict[tuple[str, int], Stats] = {}
        self.load_errors: dict[str, str] = {}  # a model's last load that failed, while what served it serves on
        for entry in list(self.entries.values()):
            self._adopt(entry)
        self.devices = resolve_devices(settings)
        queues = {
            d: DeviceQueue(d, settings.queue_capacity, settings.workers_per_device) for d in self.devices
        }
        cpu_counts = [g.count for e in self.entries.values() for g in e.config.instance_group or () if g.kind == "cpu"]
        listed_only = frozenset()
        if cpu_counts and "cpu" not in queues:
            # A model whose instance_group names the CPU (a pipeline's CPU step) gets CPU workers of its
            # own, whichever devices the service serves, as Triton's KIND_CPU instances do. They are not
            # one of the service's devices: requests are answered by these.
            queues["cpu"] = DeviceQueue("cpu", settings.queue_capacity, max(cpu_counts))
            listed_only = frozenset({"cpu"})
        self.dispatcher = Dispatcher(queues)
        self.pool = WorkerPool(queues, dict(self.entries), settings, functools.partial(pipeline.call, self._run,
                               self.entries), listed_only)
        self.preprocess_pool = ThreadPoolExecutor(settings.preprocess_threads, thread_name_prefix="preprocess")
        self.check_cpu = PlaceChecker("preprocess", "cpu")
        self.plans: dict[str, pipeline.Plan] = {}  # the pipelines served, once their steps are (start)
        self.stats.update({(p, 1): Stats() for p in self.pipelines})
        self.received = self.answered = 0  # requests submitted / answered
        self.pipelines_running = 0  # requests to a pipeline not yet answered (event-loop thread)
        self.stopping = False  # not ready; requests are still served until the dispatcher closes
        # Model control (control.py): the versions out of the catalog that still serve the requests taken
        # before, those requests per version, and the pipeline runs in flight (by their start's number).
        self.control = control.Control(self)
        self.control.seen = seen
        self.retiring: dict[tuple[str, int], tuple[Entry, Version]] = {}
        self.counting = settings.model_control_mode != "none"  # inflight and runs_live are kept
        self.inflight: collections.Counter[tuple[str, int]] = collections.Counter()
        self.runs_started = 0
        self.runs_live: set[int] = set()
        #: Who hears of a new catalog (``catalog()``), in the order added; one may be a coroutine (the
        #: engine process's front ends, which it waits for).
        self.publishers: list[Callable[[Catalog], Any]] = []

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
                failures.setdefault(model, f"model {model!r} did not load on {worker.device} (worker {worker.name}): "
                                           f"{why}")
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
        for name, found in list(self.pipelines.items()):
            lost = next((s for s in found.steps if s.model not in self.entries), None)
            if lost is None:
                self.plans[name] = pipeline.plan(found, self.entries)
                continue
            del self.pipelines[name]
            why = f"pipeline {name!r}: {lost} is not served: {self.skipped[lost.model]}"
            if self.settings.on_model_failure == "fail":  # (its model's failure is fatal before this)
                self.pool.stop(5)
                raise StartupError(why)
            log.error("not serving: %s", why)
            self.skipped[name] = why
        self._hold()

    def _hold(self) -> None:
        """Each queue's models, as its workers hold them (at start, and after each load or unload)."""
        for queue in self.dispatcher.queues.values():
            held = [{k for k in w.held if self._serves(k) or k in self.retiring} for w in self.pool.workers
                    if w.queue is queue]
            queue.models = set().union(*held)
            queue.uniform = all(h == held[0] for h in held)

    def _serves(self, key: tuple[str, int]) -> bool:
        """Whether ``key`` (model, version) is in the catalog's entries."""
        entry = self.entries.get(key[0])
        return entry is not None and key[1] in entry.versions

    def _adopt(self, entry: Entry) -> None:
        """Serve ``entry``'s versions (at start, or a load's swap): its preprocessing templates and tables."""
        self.entries[entry.name] = entry
        for number, version in entry.versions.items():
            key = (entry.name, number)
            template = version.model_class()
            template.context = version.context
            self.templates[key] = template
            self.own_preprocess[key] = type(template).preprocess is not Model.preprocess
            self.datatypes[key] = {s.name: s.datatype for s in version.outputs}
            self.stats.setdefault(key, Stats())
        self.skipped.pop(entry.name, None)
        self.load_errors.pop(entry.name, None)

    def _adopt_pipeline(self, found: Pipeline) -> None:
        self.pipelines[found.name] = found
        self.plans[found.name] = pipeline.plan(found, self.entries)
        self.stats.setdefault((found.name, found.version), Stats())
        self.skipped.pop(found.name, None)

    def _forget(self, key: tuple[str, int]) -> None:
        """A version no longer served, nor draining: its tables go."""
        for table in (self.templates, self.own_preprocess, self.datatypes, self.stats):
            table.pop(key, None)

    async def _publish(self) -> None:
        """Hand the catalog, as it is now, to everyone who answers from it; wait for those who say when
        they have it (the front ends)."""
        catalog = self.catalog()
        for publish in self.publishers:
            done = publish(catalog)
            if asyncio.iscoroutine(done):
                await done

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
        while self.pipelines_running and time.monotonic() < deadline:  # their next steps are still taken
            time.sleep(0.02)
        self.pool.stop(max(0.0, deadline - time.monotonic()))
        self.dispatcher.fail_unstarted()
        self.preprocess_pool.shutdown(wait=True)
        log.info("stopped: %d inference requests received, %d answered", self.received, self.answered)

    def ready(self) -> bool:
        return not self.stopping and self.pool.ready()

    # -- what front ends read ------------------------------------------------------------------

    def catalog(self) -> Catalog:
        """The served models, as front ends check requests against them (after ``start``)."""
        models = {}
        for name, planned in self.plans.items():
            found = planned.pipeline
            config = found.config.model_dump(mode="json", include={"description", "max_batch_size", "pipeline"})
            if found.paddlex is not None:  # what PaddleX serving's API (http/paddlex.py) answers with
                config["paddlex"] = found.paddlex
            models[name] = ModelInfo(name, {found.version: VersionInfo(found.version, found.inputs, found.outputs,
                                                                        "ensemble")},
                                     found.max_batch_size, 0.0, found.config.description, config)
        for entry in self.entries.values():
            versions = {n: VersionInfo(n, v.inputs, v.outputs, platform(v, [
                w.backends[entry.name, n] for w in self.pool.workers if (entry.name, n) in w.backends]))
                        for n, v in entry.versions.items() if (entry.name, n) not in self.retiring}
            # What runs the default version on each device: the backend auto chose, or why it fell back.
            key = (entry.name, entry.default.number)
            backends = {w.device: w.backends[key] for w in self.pool.workers if key in w.backends}
            models[entry.name] = ModelInfo(
                entry.name, versions, entry.max_batch_size, entry.max_batch_delay_ms, entry.config.description,
                {**entry.config.model_dump(mode="json", exclude={"inputs", "outputs"}), "backends": backends})
        return Catalog(models, dict(self.skipped), list(self.devices), self.settings.max_examples_per_request,
                       self.dispatcher.capacity(self.settings.max_batch_size), dict(self.load_errors),
                       self.settings.model_control_mode)

    def status(self) -> dict:
        """Readiness, as ``/readyz`` shows it: each worker started and alive."""
        return {"ready": self.ready(), "stopping": self.stopping,
                "workers": {w.name: w.alive() and w.ready.is_set() for w in self.pool.workers}}

    def statistics(self, model: str | None = None, version: int | None = None) -> list[dict]:
        """Triton's statistics of every served version, of ``model``'s, or of one version."""
        return [stats.describe(name, number) for (name, number), stats in self.stats.items()
                if (name in self.entries or name in self.plans) and model in (None, name)
                and version in (None, number)]

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

    # -- the request path --------------------------------------------------------------------

    def submit(self, work: Work, arrays: Mapping[str, np.ndarray], done: Done) -> Handle | None:
        """The one way in: run a checked request (``Catalog.check``), answered by ``done`` once on the
        loop thread. No task per request: a request preprocessed on the pool's threads takes one.

        Returns its handle: ``cancel()`` (on the loop thread) when its client leaves withdraws it, answered
        ``Cancelled``; None when it is answered already."""
        self.received += 1  # event-loop thread only
        planned = self.plans.get(work.model)
        if planned is not None:
            stats = self.stats[work.model, work.version]

            self.runs_started += 1
            number = self.runs_started
            self.runs_live.add(number)

            def answer(result: Result | None, error: BaseException | None) -> None:
                self.answered += 1
                self.pipelines_running -= 1
                self.runs_live.discard(number)
                if error is None:
                    stats.pipeline_succeeded(work.arrived, work.examples, result.timings["queue_ms"], run.stages)
                else:
                    stats.failed(work.arrived)
                    if isinstance(error, (Timeout, Cancelled)):
                        withdrawn(work, error, run.ran())
                done(result, error)

            self.pipelines_running += 1
            run = pipeline.PipelineRun(self._run, planned, work, arrays, self.settings.inline_preprocess_bytes, answer)
            try:
                self.dispatcher.check_open()  # (its steps are taken while the engine stops: not it)
                run.start()
            except Exception as exc:  # Draining, or a bug of ours: answered, once
                run.fail(exc)
            return run

        stats = self.stats.get((work.model, work.version))

        def settled(job: Job | None, found: Answer | None, error: BaseException | None) -> None:
            self.answered += 1
            if error is None:
                try:
                    result = self._result(job, found, work)
                except Exception as exc:  # a bug of ours: still answered
                    error = exc
                else:
                    stats.succeeded(work.arrived, job, found)
                    done(result, None)
                    return
            if stats is not None:
                stats.failed(work.arrived)
            if isinstance(error, ServiceError):
                if job is not None:
                    error.device = job.device or "none"
                if isinstance(error, (Timeout, Cancelled)):
                    withdrawn(work, error, job is not None and bool(job.started))
            done(None, error)

        return self._run(work, arrays, settled)

    def _run(self, work: Work, arrays: Mapping, settled: pipeline.Settled, ticket=None, **step) -> Handle | None:
        """Admit, preprocess and queue one model's work: a request's, a pipeline's step or a model's call
        (``step``: the job's ``keep``, ``prefer``, ``step`` and ``chain``, which its model's statistics
        count here). ``settled(job, answer, error)`` once, on the loop thread; ``job`` is None when it
        was refused before it had one. Returns its handle (``submit``); ``ticket``: the one it attaches
        its job to (a pipeline's run, for its steps)."""
        key = (work.model, work.version)
        counted = settled
        if self.counting:  # a version retired by a load or unload drains these
            self.inflight[key] += 1

            def settled(job: Job | None, found: Answer | None, error: BaseException | None,
                        answer=settled) -> None:
                self.inflight[key] -= 1
                answer(job, found, error)

            counted = settled
        if step:
            taken, stats = time.perf_counter(), self.stats.get(key)

            def counted(job: Job | None, found: Answer | None, error: BaseException | None) -> None:
                if stats is not None and error is None:
                    stats.succeeded(taken, job, found)
                elif stats is not None:
                    stats.failed(taken)
                settled(job, found, error)

        try:
            entry, version, template = self._served(work)
            self.dispatcher.admit(key, bool(step))  # before spending CPU on preprocessing
            if self._preprocess_inline(key, work):
                return self._enqueue(entry, version, work, self._prepare(key, entry, template, arrays,
                                                                       work.parameters), counted, step, ticket)
            ticket = ticket or Ticket()
            asyncio.ensure_future(self._preprocess_then_enqueue(entry, version, template, work, arrays, counted,
                                                                step, ticket))
            return ticket
        except Exception as exc:  # a ServiceError, or a bug of ours: answered either way
            counted(None, None, exc)
        return None

    def _served(self, work: Work) -> tuple[Entry, Version, Model]:
        """What serves ``work``; ``UnknownModel`` when nothing does (a front end's catalog may be older)."""
        key = (work.model, work.version)
        found = self.retiring.get(key)
        if found is not None:  # out of the catalog, still serving the requests taken before (control.py)
            entry, version = found
        else:
            entry = self.entries.get(work.model)
            version = entry.versions.get(work.version) if entry is not None else None
        template = self.templates.get(key)
        if version is None or template is None:  # (a front end's catalog may be older than ours)
            raise UnknownModel(f"model {work.model!r} version {work.version} is not served")
        return entry, version, template

    def _preprocess_inline(self, key: tuple[str, int], work: Work) -> bool:
        """Where a request is preprocessed: on the event loop thread when the model has no preprocess of
        its own or the request is small (cheaper than two thread hand-offs), else on the pool's threads."""
        return work.inline or not self.own_preprocess[key]

    async def _preprocess_then_enqueue(self, entry: Entry, version: Version, template: Model, work: Work,
                                       arrays, settled: pipeline.Settled, step: dict, ticket) -> None:
        try:
            loop = asyncio.get_running_loop()
            try:
                tensors = await loop.run_in_executor(self.preprocess_pool, self._preprocess, template, arrays,
                                                     work.parameters)
            except Exception as exc:
                raise self._preprocess_error(entry, exc) from None
            self._enqueue(entry, version, work, tensors, settled, step, ticket)
        except Exception as exc:  # a ServiceError (Draining meanwhile, Overloaded), or a bug of ours
            settled(None, None, exc)

    def _prepare(self, key: tuple[str, int], entry: Entry, template: Model, arrays, parameters=None) -> dict:
        """Preprocess on this thread (``_preprocess_inline``); ``parameters``: the request's."""
        try:
            if not self.own_preprocess[key]:
                # Nothing runs that could make a tensor, so no PlaceEnv('cpu'), whose two Tracer
                # switches cost a small request time for nothing.
                return host_inputs(template.context, arrays)
            return self._preprocess(template, arrays, parameters)
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

    def _enqueue(self, entry: Entry, version: Version, work: Work, tensors, settled: pipeline.Settled,
                 step: dict, ticket=None) -> Job:
        """Queue a preprocessed request on a device, with a timer at its deadline; ``settled`` gets the
        job's answer, from a worker or the timer. ``ticket``: told of the job, unless it was cancelled
        meanwhile (``Cancelled``, never queued)."""
        loop = asyncio.get_running_loop()
        if not step:  # a request's (a step's arrival is its pipeline's)
            metrics.ON_LOOP.observe(metrics.ON_LOOP.preprocess, (entry.name,), time.perf_counter() - work.arrived)

        def answered(found: Answer | None, error: BaseException | None) -> None:
            timer.cancel()
            settled(job, found, error)

        limit = entry.max_batch_size
        job = Job(
            model=(entry.name, version.number), inputs=tensors, examples=work.examples,
            batched=limit > 0, loop=loop, future=Settled(answered), arrived=work.arrived,
            deadline=work.deadline, priority=work.priority,
            shape=batch_key(shape_key(tensors, version.context.padding), work.parameters) if limit > 0 else None,
            parameters=work.parameters, **step,
        )
        if ticket is not None and not ticket.attach(job):
            raise Cancelled("the client cancelled the request")
        if 0 < limit < work.examples:  # more rows than a forward pass takes: queued as parts
            self._submit_parts(job, limit)
        else:
            self.dispatcher.submit(job)  # Overloaded or Draining
        # A timer, not asyncio.wait(timeout=): one handle instead of a waiter future and callbacks.
        timer = loop.call_later(max(0.0, job.deadline - time.perf_counter()), job.expire)
        return job

    def _submit_parts(self, job: Job, limit: int) -> None:
        """Queue ``job`` as parts of at most ``limit`` rows (``workers.split``); none of them when one is
        refused (Overloaded or Draining, raised), and ``job`` is then answered by the caller, not its parts."""
        parts = split(job, limit)
        try:
            for part in parts:
                self.dispatcher.submit(part)
        except Exception:
            job.claim()
            for part in parts:
                part.withdraw()
            raise
        job.enqueued = parts[0].enqueued

    def _result(self, job: Job, answer: Answer, work: Work) -> Result:
        datatypes = self.datatypes[work.model, work.version]
        wanted = work.outputs
        return Result(
            model=work.model, version=work.version,
            outputs={name: answer.outputs[name] for name in wanted},
            datatypes={name: datatypes[name] for name in wanted},
            device=answer.device, worker=answer.worker, batch_size=answer.batch_size,
            batched=job.batched, timings=timings(work.arrived, job, answer),
        )

    @PlaceEnv("cpu")
    def _preprocess(self, template: Model, arrays: dict[str, np.ndarray], parameters=None) -> dict:
        """The model's preprocess, in input order: host arrays as they are (the worker makes one host
        tensor per batch of them, not one per request), tensors checked to be on the CPU. ``parameters``:
        the request's, which the preprocess reads as ``request_parameters`` (this thread's, as a worker's)."""
        # Arrays read over a binary body or the link's frames are read-only; a model's preprocess may
        # change its inputs in place.
        arrays = {n: a if a.flags.writeable else a.copy() for n, a in arrays.items()}
        calls = CALLS
        outer, calls.parameters = calls.parameters, parameters
        try:
            prepared = host_inputs(template.context, template.preprocess(arrays))
        except ModelError as exc:
            raise ModelFailed(str(exc)) from None
        finally:
            calls.parameters = outer
        for value in prepared.values():
            if not isinstance(value, np.ndarray):
                self.check_cpu("preprocess", placeenv.device_name(value.place))
        return prepared

