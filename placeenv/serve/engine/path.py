"""The request path: a checked request from ``Engine.submit`` to its one answer.

``RequestPath.submit`` admits a request under the generation of its moment (generation.py) and runs
it: a pipeline's request as a ``PipelineRun`` (pipeline.py), whose every step comes back here; any
other as one job of its model (``run``): the dispatcher admits it (dispatch.py; 503), it is
preprocessed on the CPU under ``PlaceEnv('cpu')`` (on the loop, or on the pool's threads for a large
request to a model with a preprocess of its own), queued on a device (a job of more rows than its model
takes queued as parts), with a timer at its deadline (504). A model's call to another (pipeline.py's
``call``) comes back to ``run`` too, under the generation of the request it serves.

Each job's answer, from a worker, its timer or a cancel, settles its ``Completion`` once, on the loop
thread: the timer stopped, the statistics counted, the generation's count let go of, then the one
``then(job, answer, error)`` its owner gave: the request's reply (``_reply``: a ``Result``), a pipeline
step's (``PipelineRun``) or a call's (``pipeline.call``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np

import placeenv
from placeenv import PlaceEnv

from .. import metrics
from ..models.base import NOT_SERVING, SERVING, InputError, ModelError, Serving, host_inputs
from ..protocol.errors import Cancelled, InvalidInput, ModelFailed, ServiceError, Timeout, UnknownModel
from ..protocol.request import Result, Work
from .dispatch import Dispatcher
from .job import REQUEST, Job, StepOptions, batch_key, shape_key
from .forward import Answer, split
from .generation import Generation, Served, ServedPipeline, ServedVersion
from .pipeline import PipelineRun
from .stats import Stats, timings, withdrawn
from .batch import PlaceChecker

log = logging.getLogger(__name__)

#: How the engine answers a request: ``done(result, None)`` or ``done(None, error)``, once, on the loop thread.
Done = Callable[["Result | None", "BaseException | None"], None]
#: What the owner of a job is given: ``then(job, answer, error)``; ``job`` is None when it was refused
#: before it had one.
Then = Callable[["Job | None", "Answer | None", "BaseException | None"], None]


class Handle(Protocol):
    """What ``Engine.submit`` gives back to cancel a request: its job, a ``Ticket`` for the job to come, or
    its pipeline's run. ``cancel()`` on the loop thread; False when it has its answer already."""

    def cancel(self) -> bool: ...


class Completion:
    """One job's answer: the job's future (``Job.future``), settled once on the loop thread by a worker, the
    timer or a cancel, or at once when the job is refused. Counted in its generation from its
    admission to its answer."""

    __slots__ = ("generation", "then", "stats", "taken", "job", "timer")

    def __init__(self, generation: Generation, then: Then, stats: Stats | None, taken: float) -> None:
        self.generation, self.then, self.stats, self.taken = generation, then, stats, taken
        self.job: Job | None = None  # once queued
        self.timer: asyncio.TimerHandle | None = None  # at the job's deadline
        generation.admit()

    def settle(self, answer: Answer | None, error: BaseException | None) -> None:
        then, self.then = self.then, None
        if then is None:
            return
        # Let go of the job and the timer once answered: the job holds this as its future, and the timer
        # the job's expire. Left as a cycle, each answered job and its inputs wait for the collector's
        # rare full pass, and a server holds hundreds of its last pages (docs/benchmarks.md).
        job, timer, self.job, self.timer = self.job, self.timer, None, None
        if timer is not None:
            timer.cancel()
        self.generation.release()
        if self.stats is not None:
            if error is None:
                self.stats.succeeded(self.taken, job, answer)
            else:
                self.stats.failed(self.taken)
        then(job, answer, error)


class Ticket:
    """A request's handle while its job is not made yet (preprocessing on the pool's threads): what
    ``Engine.submit`` gives back to cancel it. A request preprocessed at once is handed its ``Job``."""

    __slots__ = ("job", "cancelled")

    def __init__(self) -> None:
        self.job: Job | None = None
        self.cancelled = False

    def attach(self, job: Job) -> bool:
        """Its job, once made; False when the request was cancelled meanwhile (not to be queued)."""
        if self.cancelled:
            return False
        self.job = job
        return True

    def cancel(self) -> bool:
        if self.job is not None:
            return self.job.cancel()
        if self.cancelled:
            return False
        self.cancelled = True
        return True


class RequestPath:
    """From ``submit`` to each answer, on the event loop thread (the pool's threads only preprocess)."""

    def __init__(self, served: Served, dispatcher: Dispatcher, settings) -> None:
        self.served, self.dispatcher = served, dispatcher
        self.inline_bytes = settings.inline_preprocess_bytes
        self.preprocess_pool = ThreadPoolExecutor(settings.preprocess_threads, thread_name_prefix="preprocess")
        self.check_cpu = PlaceChecker("preprocess", "cpu")
        self.received = self.answered = 0  # requests submitted / answered
        self.pipelines_running = 0  # requests to a pipeline not yet answered

    def submit(self, work: Work, arrays: Mapping[str, np.ndarray], done: Done) -> Handle | None:
        """Run a checked request under the generation served now; ``done`` once, on the loop thread.
        Returns its handle (``cancel()`` withdraws it, answered ``Cancelled``), None when answered already."""
        self.received += 1
        generation = self.served.generation
        found = generation.pipelines.get(work.model)
        if found is not None:
            return self._start_pipeline(generation, found, work, arrays, done)
        return self.run(generation, work, arrays, functools.partial(self._reply, work, done))

    def _start_pipeline(self, generation: Generation, found: ServedPipeline, work: Work, arrays, done: Done):
        self.pipelines_running += 1
        run = PipelineRun(self.run, generation, found.plan, work, arrays, self.inline_bytes,
                          functools.partial(self._pipeline_reply, found.stats, done))
        try:
            self.dispatcher.check_open()  # (its steps are taken while the engine stops: not it)
            run.start()
        except Exception as exc:  # Draining, or a bug of ours: answered, once
            run.fail(exc)
        return run

    def _pipeline_reply(self, stats: Stats, done: Done, run: PipelineRun, result: Result | None,
                        error: BaseException | None) -> None:
        self.answered += 1
        self.pipelines_running -= 1
        work = run.work
        if error is None:
            stats.pipeline_succeeded(work.arrived, work.examples, result.timings["queue_ms"], run.stages)
        else:
            stats.failed(work.arrived)
            if isinstance(error, (Timeout, Cancelled)):
                withdrawn(work, error, run.ran())
        done(result, error)

    def _reply(self, work: Work, done: Done, job: Job | None, answer: Answer | None,
               error: BaseException | None) -> None:
        """A request's own job answered: its ``Result``, or its error, to ``done``."""
        self.answered += 1
        if error is None:
            try:
                result = self._result(job, answer, work)
            except Exception as exc:  # a bug of ours: still answered
                error = exc
            else:
                done(result, None)
                return
        if isinstance(error, ServiceError):
            if job is not None:
                error.device = job.device or "none"
            if isinstance(error, (Timeout, Cancelled)):
                withdrawn(work, error, job is not None and bool(job.started))
        done(None, error)

    def _result(self, job: Job, answer: Answer, work: Work) -> Result:
        datatypes = job.generation.versions[job.model].datatypes  # (the generation it was admitted under)
        wanted = work.outputs
        return Result(
            model=work.model, version=work.version,
            outputs={name: answer.outputs[name] for name in wanted},
            datatypes={name: datatypes[name] for name in wanted},
            device=answer.device, worker=answer.worker, batch_size=answer.batch_size,
            batched=job.batched, timings=timings(work.arrived, job, answer),
        )

    def run(self, generation: Generation, work: Work, arrays: Mapping, then: Then,
            options: StepOptions = REQUEST, ticket=None) -> Handle | None:
        """Admit, preprocess and queue one model's work under ``generation``: a request's, a pipeline's step
        or a model's call (``options``). ``then(job, answer, error)`` once, on the loop thread. Returns its
        handle; ``ticket``: the one it attaches its job to (a pipeline's run, for its steps)."""
        key = (work.model, work.version)
        served = generation.versions.get(key)
        step = options.step is not None
        if served is None and not step and self.served.retiring:  # out of the catalog, still served
            generation = self.served.admitting(key) or generation
            served = generation.versions.get(key)
        completion = Completion(generation, then, served.stats if served is not None else None,
                                time.perf_counter() if step else work.arrived)
        try:
            if served is None:  # (a front end's catalog may be older than ours)
                raise UnknownModel(f"model {work.model!r} version {work.version} is not served")
            self.dispatcher.admit(served, step)  # before spending CPU on preprocessing
            if work.inline or not served.own_preprocess:
                tensors = self._prepare(served, arrays, work.parameters)
                return self._enqueue(served, work, tensors, completion, options, ticket)
            ticket = ticket or Ticket()
            asyncio.ensure_future(self._preprocess_then_enqueue(served, work, arrays, completion, options, ticket))
            return ticket
        except Exception as exc:  # a ServiceError, or a bug of ours: answered either way
            completion.settle(None, exc)
        return None

    async def _preprocess_then_enqueue(self, served: ServedVersion, work: Work, arrays, completion: Completion,
                                       options: StepOptions, ticket) -> None:
        try:
            loop = asyncio.get_running_loop()
            try:
                tensors = await loop.run_in_executor(self.preprocess_pool, self._preprocess, served, arrays,
                                                     work.parameters)
            except Exception as exc:
                raise _preprocess_error(served, exc) from None
            self._enqueue(served, work, tensors, completion, options, ticket)
        except Exception as exc:  # a ServiceError (Draining meanwhile, Overloaded), or a bug of ours
            completion.settle(None, exc)

    def _prepare(self, served: ServedVersion, arrays, parameters=None) -> dict:
        """Preprocess on this thread (the loop's); ``parameters``: the request's."""
        try:
            if not served.own_preprocess:
                # Nothing runs that could make a tensor, so no PlaceEnv('cpu'), whose two Tracer
                # switches cost a small request time for nothing.
                return host_inputs(served.template.context, arrays)
            return self._preprocess(served, arrays, parameters)
        except Exception as exc:
            raise _preprocess_error(served, exc) from None

    @PlaceEnv("cpu")
    def _preprocess(self, served: ServedVersion, arrays: dict[str, np.ndarray], parameters=None) -> dict:
        """The model's preprocess, in input order: host arrays as they are (the worker makes one host
        tensor per batch of them, not one per request), tensors checked to be on the CPU. ``parameters``:
        the request's, which the preprocess reads as ``request_parameters`` (``serving``, a token pair)."""
        template = served.template
        # Arrays read over a binary body or the link's frames are read-only; a model's preprocess may
        # change its inputs in place.
        arrays = {n: a if a.flags.writeable else a.copy() for n, a in arrays.items()}
        token = SERVING.set(NOT_SERVING if parameters is None else Serving(parameters))
        try:
            prepared = host_inputs(template.context, template.preprocess(arrays))
        except ModelError as exc:
            raise ModelFailed(str(exc)) from None
        finally:
            SERVING.reset(token)
        for value in prepared.values():
            if not isinstance(value, np.ndarray):
                self.check_cpu("preprocess", placeenv.device_name(value.place))
        return prepared

    def _enqueue(self, served: ServedVersion, work: Work, tensors, completion: Completion, options: StepOptions,
                 ticket=None) -> Job:
        """Queue a preprocessed request on a device, with a timer at its deadline. ``ticket``: told of the
        job, unless it was cancelled meanwhile (``Cancelled``, never queued)."""
        loop = asyncio.get_running_loop()
        if options.step is None:  # a request's (a step's arrival is its pipeline's)
            metrics.ON_LOOP.observe(metrics.ON_LOOP.preprocess, (work.model,), time.perf_counter() - work.arrived)
        limit = served.entry.max_batch_size
        job = Job(
            model=served.key, request=work, inputs=tensors, batched=limit > 0, loop=loop, future=completion,
            options=options, generation=completion.generation, served=served,
            shape=batch_key(shape_key(tensors, served.version.context.padding), work.parameters) if limit > 0 else None,
        )
        if ticket is not None and not ticket.attach(job):
            raise Cancelled("the client cancelled the request")
        if 0 < limit < work.examples:  # more rows than a forward pass takes: queued as parts
            self._submit_parts(job, limit)
        else:
            self.dispatcher.submit(job)  # Overloaded or Draining
        completion.job = job
        # A timer, not asyncio.wait(timeout=): one handle instead of a waiter future and callbacks.
        completion.timer = loop.call_later(max(0.0, work.deadline - time.perf_counter()), job.expire)
        return job

    def _submit_parts(self, job: Job, limit: int) -> None:
        """Queue ``job`` as parts of at most ``limit`` rows (``forward.split``); none of them when one is
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


def _preprocess_error(served: ServedVersion, exc: Exception) -> ServiceError:
    if isinstance(exc, InputError):
        return InvalidInput(str(exc))
    if isinstance(exc, ServiceError):
        return exc
    log.error("model %r: preprocess failed", served.entry.name, exc_info=exc)
    return ModelFailed(f"model {served.entry.name!r}: preprocess failed: {type(exc).__name__}: {str(exc)[:300]}")
