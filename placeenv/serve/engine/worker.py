"""A worker: one thread pinned to one device, holding a replica of each model version it serves, taking
batches from its device's queue and answering each job once.

With isolation on, a worker calls ``paddle.set_device`` once, when it starts;
placeenv keeps that device private to the thread. With isolation off (the
stock-Paddle demonstration) it calls ``set_device`` before every batch, as
naive code does, and the place checks see other workers' devices.
"""

from __future__ import annotations

import collections
import contextlib
import concurrent.futures
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import paddle

import placeenv

from .. import metrics
from .dispatch import DeviceQueue, Job, resolve_all
from ..protocol.errors import Draining, InvalidInput, ModelFailed, Overloaded, ServiceError, Timeout
from ..models.base import CALLS, JIT_LOAD_LOCK, InputError, Model
from ..models import runtimes
from ..models.repository import Entry
from .forward import Answer, Batch, Handed, forward
from .replica import STOCK_BUILDS, Shares, Slot, build, finalize

log = logging.getLogger(__name__)

#: The backends whose exports are converted to ONNX, started in the background as a worker starts.
CONVERTED = ("auto", *runtimes.RUNTIMES)


#: What a model's call to another (``Model.infer``) answers when it fails, as it is: the request the
#: call was made for gets the same answer (a deadline passed, every queue full, the service stopping).
PASSED_ON = (Timeout, Overloaded, Draining)


def failure(model: str, exc: Exception) -> ServiceError:
    """The answer of a request whose model raised ``exc``."""
    if isinstance(exc, PASSED_ON):
        return exc
    if isinstance(exc, InputError):  # the model says the request cannot be run as sent: the client's 400
        return InvalidInput(f"model {model!r}: {exc}")
    return ModelFailed(f"model {model!r} failed on this request: {type(exc).__name__}: {str(exc)[:500]}")


class PlaceChecker:
    """Counts every place check; a mismatch is a leak, counted with its labels and logged."""

    def __init__(self, worker: str, device: str) -> None:
        self.worker, self.device = worker, device

    def __call__(self, stage: str, actual: str, expected: str | None = None) -> bool:
        expected = self.device if expected is None else expected
        metrics.child(metrics.PLACE_CHECKS, stage, self.device).inc()
        if actual == expected:
            return True
        metrics.DEVICE_LEAKS.labels(self.worker, expected, actual, stage).inc()
        log.warning("device leak: worker %s stage %s expected %s got %s", self.worker, stage, expected, actual)
        return False

class Worker:
    """One thread, one device, a replica of each model version it holds."""

    def __init__(self, name: str, device: str, queue: DeviceQueue, entries: list[Entry], settings,
                 accelerators: int = 1, shares: Shares | None = None, call=None) -> None:
        self.name, self.device, self.queue = name, device, queue
        # The engine's way in for a model's call to another (Model.infer), given the generation the
        # batch's request was admitted under; or None.
        self.call = call
        self.entries, self.settings = entries, settings
        self.isolation = settings.isolation == "on"
        self.check = PlaceChecker(name, device)
        # Where its replicas are built: ``accelerators``, the devices of this process that are not the CPU;
        # ``shares``, the weights this device's workers share (None: each loads its own).
        self.slot = Slot(name, device, placeenv.to_place(device), self.check, self.isolation, accelerators, shares)
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.failed: dict[str, str] = {}  # model -> why it did not load here
        self.backends: dict[tuple[str, int], str] = {}  # (model, version) -> what runs it here
        self.choices: dict[tuple[str, int], dict] = {}  # (model, version) -> what backend auto measured here
        self.held: dict[tuple[str, int], tuple[int, float]] = {}  # (model, version) -> batch limits
        self.replicas: dict[tuple[str, int], Model] = {}  # (model, version) -> this worker's replica
        self.current: list[Job] = []  # the jobs it holds (a batch, and those it runs while waiting for a call)
        self.stack: list[tuple[str, int]] = []  # the models whose batches it is running, outermost first
        self._stop = threading.Event()
        # What the engine's control asks of this thread between batches (engine/control.py): build a
        # version's replica, drop one. Each (function, future).
        self.tasks: collections.deque[tuple[Callable[[], Any], concurrent.futures.Future]] = collections.deque()
        self._tasks_lock = threading.Lock()
        self.closed = False  # the thread has ended: a task is refused (``do``)
        self._up = metrics.WORKER_UP.labels(name, device)
        self.thread = threading.Thread(target=self._run, name=f"worker-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self) -> None:
        self._stop.set()

    def do(self, task: Callable[[], Any]) -> concurrent.futures.Future:
        """Run ``task`` on this worker's thread, between two batches: a replica is built, used and
        finalized by the thread of its device (Paddle's per-thread place, and one user at a time)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._tasks_lock:
            if self.closed:  # its thread has ended: nobody would run it
                future.set_exception(RuntimeError(f"worker {self.name} has stopped"))
                return future
            self.tasks.append((task, future))
        self.queue.wake()
        return future

    def _run_tasks(self) -> None:
        while self.tasks:
            task, future = self.tasks.popleft()
            try:
                future.set_result(task())
            except BaseException as exc:  # noqa: BLE001 - the control's answer to give
                future.set_exception(exc)

    def stage(self, entry: Entry, numbers: list[int]) -> dict[tuple[str, int], Model]:
        """Build and warm up replicas of ``entry``'s versions ``numbers`` on this thread, beside those it
        serves (``install`` puts them in service); on a failure, what was built is finalized."""
        built: dict[tuple[str, int], Model] = {}
        try:
            for number in numbers:
                built[entry.name, number] = build(self.slot, entry, entry.versions[number])
        except Exception:
            for replica in built.values():
                finalize(replica, self.name)
            raise
        return built

    def install(self, entry: Entry, built: dict[tuple[str, int], Model]) -> dict[tuple[str, int], Model]:
        """Serve ``built`` (``stage``'s) from the next batch on; the replicas they replace, to drop. New
        dicts, not changed ones: the worker's thread reads them without a lock."""
        replaced = {key: self.replicas[key] for key in built if key in self.replicas}
        delay = entry.max_batch_delay_ms / 1000
        self.replicas = {**self.replicas, **built}
        self.held = {**self.held, **{key: (entry.max_batch_size, delay) for key in built}}
        self.backends.update((key, replica.backend) for key, replica in built.items())
        self.choices = {**{k: c for k, c in self.choices.items() if k not in built},
                        **{key: replica.choice for key, replica in built.items() if replica.choice is not None}}
        return replaced

    def drop(self, keys, replaced: dict[tuple[str, int], Model] | None = None) -> None:
        """On this thread: stop serving ``keys`` and finalize their replicas (and ``replaced``, the ones a
        new build took the place of, or a failed load built); the engine's control then collects them
        and hands the device's memory back."""
        gone = [self.replicas[key] for key in keys if key in self.replicas] + list((replaced or {}).values())
        self.held = {key: held for key, held in self.held.items() if key not in keys}
        self.replicas = {key: replica for key, replica in self.replicas.items() if key not in keys}
        for key in keys:
            self.backends.pop(key, None)
        self.choices = {key: found for key, found in self.choices.items() if key not in keys}
        for replica in gone:
            finalize(replica, self.name)

    def _run(self) -> None:
        try:
            # The thread's first Paddle call, not during another worker's jit.load: stock Paddle (isolation
            # off) gives a new thread the process-wide Tracer of that moment, and jit.load sets it to None
            # hundreds of times (switch_to_static_graph): a thread born then stays in static mode.
            with contextlib.nullcontext() if self.isolation else STOCK_BUILDS, JIT_LOAD_LOCK:
                paddle.set_device(self.device)  # once: placeenv keeps it to this thread
            runtimes.convert_soon([v.program for e in self.entries if e.config.backend in CONVERTED
                                   for v in e.versions.values() if v.program is not None], self.device)
            for entry in self.entries:
                self._load_entry(entry)
            self.ready.set()
            self._up.set(1)
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - recorded; the pool replaces us
            self.error = exc
            log.error("worker %s died: %r", self.name, exc)
        finally:
            for replica in self.replicas.values():
                finalize(replica, self.name)
            self._up.set(0)
            with self._tasks_lock:  # the control waits for each task: none is left unanswered
                self.closed = True
                while self.tasks:
                    self.tasks.popleft()[1].set_exception(RuntimeError(f"worker {self.name} stopped"))
            if self.current:  # every accepted request gets exactly one answer
                for job in self.current:
                    job.fail(ModelFailed(f"the worker serving this request ({self.name}) died"))
                self.queue.done(len(self.current))
                self.current = []

    def _load_entry(self, entry: Entry) -> None:
        """Load and serve every version of ``entry`` (at start), or say why not (``failed``)."""
        try:
            loaded = self.stage(entry, list(entry.versions))
        except Exception as exc:  # noqa: BLE001 - reported by the service, named
            self.failed[entry.name] = f"{type(exc).__name__}: {str(exc)[:500]}"
            log.error("worker %s: model %r did not load on %s: %s", self.name, entry.name, self.device,
                      self.failed[entry.name])
            return
        self.install(entry, loaded)


    def _serve(self) -> None:
        while True:
            if self.tasks:
                self._run_tasks()
            batch = self.queue.take_batch(self.held, wait=0.2)
            if batch is None:
                return
            if not batch:
                if self._stop.is_set():
                    return
                continue
            self.current = batch
            # (``take_batch`` gives only jobs of ``held``, which ``install`` sets after ``replicas``.)
            self._process(self.replicas[batch[0].model], batch)  # answers every job, or raises only if dying
            self.queue.done(len(batch))
            # Nothing of the batch stays referenced while the worker waits: an unloaded replica is freed.
            self.current = batch = []

    def serve_until(self, answered, deadline: float) -> None:
        """While a model on this worker waits for a call (``answered``, a future): run jobs from this
        worker's queue, of every model it holds but those whose batches it is already running (their
        calls wait further down this thread), until the call is answered or the deadline passes. A
        worker that only waited could wait for itself, or for workers that wait for it."""
        limits = {key: held for key, held in self.held.items() if key not in self.stack}
        if not limits:
            return
        answered.add_done_callback(lambda _: self.queue.wake())
        while not answered.done():
            left = deadline - time.perf_counter()
            if left <= 0:
                return
            batch = self.queue.take_batch(limits, wait=min(left, 0.05), only=True)
            if batch is None:  # closed and empty: nothing left to serve
                concurrent.futures.wait([answered], timeout=left)
                return
            if not batch:
                continue
            outer = self.current
            self.current = outer + batch  # a worker that dies answers them all
            try:
                self._process(self.replicas[batch[0].model], batch)
            except Exception as exc:  # answering the batch failed: its jobs still get their one answer
                for job in batch:
                    job.fail(failure(batch[0].model[0], exc))
            self.queue.done(len(batch))
            self.current = outer

    def _process(self, replica: Model, jobs: list[Job]) -> None:
        now = time.perf_counter()
        live = [job for job in jobs if not job.answered and job.deadline > now]
        for job in jobs:
            if job not in live and not job.answered:
                job.expire()  # its deadline passed in the queue
        if not live:
            return
        if not self.isolation:
            paddle.set_device(self.device)  # what naive code does before each batch
        name = replica.context.name
        queue_duration = metrics.child(metrics.QUEUE_DURATION, name, self.device)
        for job in live:
            job.started = now
            queue_duration.observe(now - job.enqueued)
        try:
            outputs = self._forward(replica, live)
        except Exception as exc:  # noqa: BLE001 - a model's failure is the request's answer
            if len(live) > 1:  # one bad request must not fail its batch-mates
                log.warning("model %r: a batch of %d requests failed (%s: %s); running each alone", name,
                            len(live), type(exc).__name__, str(exc)[:200])
                for job in live:
                    if not job.answered:  # (a timer may have answered it meanwhile)
                        self._process_one(replica, job)
                return
            live[0].fail(failure(name, exc))
            return
        self._answer(live, outputs)

    def _process_one(self, replica: Model, job: Job) -> None:
        if job.deadline <= time.perf_counter():
            job.expire()
            return
        try:
            outputs = self._forward(replica, [job])
        except Exception as exc:  # noqa: BLE001
            job.fail(failure(replica.context.name, exc))
            return
        self._answer([job], outputs)

    def _forward(self, replica: Model, jobs: list[Job]):
        started = time.perf_counter()
        context = replica.context
        check = self.check
        steps = {job.step for job in jobs if job.step is not None}
        if steps:  # a pipeline's steps: a leak is counted for each step too
            def check(stage: str, actual: str, expected: str | None = None) -> bool:
                if self.check(stage, actual, expected):
                    return True
                for pipeline, step in steps:
                    metrics.child(metrics.STEP_LEAKS, pipeline, step, stage).inc()
                return False
        check("worker", paddle.get_device())
        examples = sum(job.examples for job in jobs)
        metrics.child(metrics.BATCH_SIZE, context.name).observe(examples)
        keep = frozenset().union(*(job.keep for job in jobs))
        calls = CALLS
        # (a call it serves meanwhile)
        outer = calls.call, calls.loop, calls.deadline, calls.chain, calls.worker, calls.parameters
        # Every job of a batch has the same parameters (dispatch.batch_key): the model reads the first's.
        calls.parameters = jobs[0].parameters
        if self.call is not None:  # what Model.infer reaches from this batch: its strictest deadline
            calls.call = functools.partial(self.call, jobs[0].generation)
            calls.loop, calls.worker = jobs[0].loop, self
            calls.deadline = min(job.deadline for job in jobs)
            calls.chain = (*dict.fromkeys(m for job in jobs for m in job.chain), context.name)
        self.stack.append(jobs[0].model)
        stamps: list[float] = []
        try:
            results = forward(replica, [job.inputs for job in jobs], jobs[0].batched, examples, check, keep, stamps)
        finally:
            self.stack.pop()
            calls.call, calls.loop, calls.deadline, calls.chain, calls.worker, calls.parameters = outer
        metrics.child(metrics.COMPUTE_DURATION, context.name, self.device).observe(time.perf_counter() - started)
        joined, executed, answered = stamps[1] - stamps[0], stamps[2] - stamps[1], stamps[3] - stamps[2]
        return results, Batch(examples, int(joined * 1e9), int(executed * 1e9), int(answered * 1e9))

    def _answer(self, jobs: list[Job], outputs) -> None:
        results, batch = outputs
        examples = batch.size
        # Outputs kept as tensors (forward's ``keep``): a step that hands them on gets them as Handed, a
        # job that wants arrays (a request) as arrays, made once a batch. One on the host goes as an
        # array to all: a job's rows of it cost no Paddle call, and the next step joins arrays as it
        # joins requests'.
        tensors = {name: value for name, value in results.items() if not isinstance(value, np.ndarray)}
        kept: dict[str, str] = {}
        if tensors:
            kept = {name: where for name, value in tensors.items()
                    if (where := placeenv.device_name(value.place)) != "cpu"}
            handed_to_all = kept.keys() & set.intersection(*(set(job.keep) for job in jobs))
            results = {name: value.numpy() if name in tensors else value
                       for name, value in results.items() if name not in handed_to_all}
        if len(jobs) == 1:
            job = jobs[0]
            part = results if not kept else {
                **results, **{name: Handed(tensors[name], kept[name]) for name in job.keep & kept.keys()}}
            job.resolve(Answer(part, self.device, self.name, examples, job.started, batch))
            return
        answers, offset = [], 0
        for job in jobs:
            rows = (offset, offset + job.examples)
            handed = job.keep & kept.keys()
            part = {name: value[offset:rows[1]] for name, value in results.items() if name not in handed}
            part.update((name, Handed(tensors[name], kept[name], rows)) for name in handed)
            answers.append((job, Answer(part, self.device, self.name, examples, job.started, batch)))
            offset += job.examples
        resolve_all(answers)
