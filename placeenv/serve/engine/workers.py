"""Worker threads: each pins one device once, owns model replicas there, serves batches.

With isolation on, a worker calls ``paddle.set_device`` once, when it starts;
placeenv keeps that device private to the thread. With isolation off (the
stock-Paddle demonstration) it calls ``set_device`` before every batch, as
naive code does, and the place checks see other workers' devices.
"""

from __future__ import annotations

import collections
import contextlib
import concurrent.futures
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import paddle

import placeenv
import placeenv.sim
from placeenv import PlaceEnv

from .. import metrics
from .dispatch import DeviceQueue, Job, Settled, resolve_all
from ..protocol.errors import Draining, ModelFailed, Overloaded, ServiceError, StartupError, Timeout
from ..models.base import CALLS, JIT_LOAD_LOCK, DeviceShare, Model, batch_tensor, host_inputs, host_tensor, move_to
from ..models.repository import Entry

log = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class Batch:
    """One forward pass, as Triton's statistics count it: its examples and the nanoseconds of its stages
    (joining the inputs and moving them to the device, ``execute``, postprocess and host arrays). Its
    jobs' answers share it; the engine counts it once (``counted``), on the event loop thread, after
    the worker has let go of it."""

    size: int
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    counted: bool = False


@dataclasses.dataclass(frozen=True)
class Answer:
    """What a worker returns for one job: the job's slice of the batch's outputs, as host arrays."""

    outputs: dict[str, np.ndarray]
    device: str
    worker: str
    batch_size: int  # examples in the forward pass this job shared
    compute_started: float
    batch: Batch | None = None  # the forward pass this job shared, for the statistics
    more: tuple[Batch, ...] = ()  # the other forward passes of a job run as parts (``split``)

    @property
    def batches(self) -> tuple[Batch, ...]:
        return (self.batch, *self.more) if self.more else (self.batch,)


@dataclasses.dataclass(frozen=True, slots=True)
class Handed:
    """A step's output handed to the next step as the tensor ``execute`` made, not as a host array; with
    the device it is on, so the next step moves it only when it runs elsewhere. The jobs of one batch
    share its tensor, each its ``rows`` (start, stop; None: all of it): slicing a tensor costs a Paddle
    call a job, and a next step that batches the same jobs in the same order takes it whole."""

    tensor: paddle.Tensor
    device: str
    rows: tuple[int, int] | None = None

    @property
    def shape(self) -> list[int]:
        shape = self.tensor.shape
        return shape if self.rows is None else [self.rows[1] - self.rows[0], *shape[1:]]


#: What a model's call to another (``Model.infer``) answers when it fails, as it is: the request the
#: call was made for gets the same answer (a deadline passed, every queue full, the service stopping).
PASSED_ON = (Timeout, Overloaded, Draining)


def failure(model: str, exc: Exception) -> ServiceError:
    """The answer of a request whose model raised ``exc``."""
    if isinstance(exc, PASSED_ON):
        return exc
    return ModelFailed(f"model {model!r} failed on this request: {type(exc).__name__}: {str(exc)[:500]}")


#: Held around each replica's build and warm-up with isolation off (``Worker._load``).
STOCK_BUILDS = threading.Lock()


class WarmUpFailed(RuntimeError):
    """A warm-up request failed: which (``label``), and the ``problem`` as the model raised it."""

    def __init__(self, label: str, problem: str) -> None:
        super().__init__(f"{label} failed: {problem}")
        self.problem = problem


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
        self.call = call  # the engine's way in for a model's call to another (Model.infer), or None
        self.accelerators = accelerators  # the devices of this process that are not the CPU
        self.shares = shares  # the weights this device's workers share; None: each loads its own
        self.entries, self.settings = entries, settings
        self.isolation = settings.isolation == "on"
        self.place = placeenv.to_place(device)
        self.check = PlaceChecker(name, device)
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.failed: dict[str, str] = {}  # model -> why it did not load here
        self.backends: dict[tuple[str, int], str] = {}  # (model, version) -> what runs it here
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
                built[entry.name, number] = self._load(entry, entry.versions[number])
        except Exception:
            for replica in built.values():
                _finalize(replica, self.name)
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
        for replica in gone:
            _finalize(replica, self.name)

    def _run(self) -> None:
        try:
            # The thread's first Paddle call, not during another worker's jit.load: stock Paddle (isolation
            # off) gives a new thread the process-wide Tracer of that moment, and jit.load sets it to None
            # hundreds of times (switch_to_static_graph): a thread born then stays in static mode.
            with contextlib.nullcontext() if self.isolation else STOCK_BUILDS, JIT_LOAD_LOCK:
                paddle.set_device(self.device)  # once: placeenv keeps it to this thread
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
                _finalize(replica, self.name)
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

    def _load(self, entry: Entry, version) -> Model:
        if self.isolation:
            return self._build(entry, version)
        # Stock Paddle (isolation off) has one Tracer for all threads, which jit.load switches to static
        # mode while it builds: another worker's warm-up forward then breaks the load. One at a time.
        with STOCK_BUILDS:
            return self._build(entry, version)

    def _build(self, entry: Entry, version) -> Model:
        replica = version.model_class()
        # The replica decides whether it takes the share (its config's share_weights, its own code).
        share = (self.shares.get(self.device, entry.name, version.number, version.fingerprint)
                 if self.shares is not None else None)
        replica.initialize(self.place, dataclasses.replace(
            version.context, accelerators=self.accelerators, share=share))
        stray = {k: d for k, d in replica.parameter_devices().items() if d != self.device}
        self.check("load", next(iter(stray.values()), self.device))
        if stray and self.isolation:
            _finalize(replica, self.name)
            raise RuntimeError(f"weights not on {self.device} after initialize: {dict(list(stray.items())[:3])}")
        try:
            warm_up(replica, entry, version, self.check)
        except Exception:
            _finalize(replica, self.name)
            raise
        return replica

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
            calls.call, calls.loop, calls.worker = self.call, jobs[0].loop, self
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


def warm_up(replica: Model, entry: Entry, version, check=None) -> None:
    """Run the version's warm-up requests (its config's ``warmup``, or the default one) through ``replica``
    as a batch runs: preprocess on the host, forward, postprocess. A Predictor builds and allocates at its
    first run: this is that run, before the worker (or a load) says the version is ready. A Predictor that
    built but fails it is rebuilt as it can be (``Model.rebuild``: oneDNN off, or jit) and warmed again."""
    while True:
        try:
            for label, arrays in version.warmup:
                try:
                    with PlaceEnv("cpu"):
                        prepared = host_inputs(replica.context, replica.preprocess(
                            {name: array.copy() for name, array in arrays.items()}))
                    examples = rows_of(next(iter(arrays.values()))) if entry.max_batch_size > 0 else 1
                    forward(replica, [prepared], entry.max_batch_size > 0, examples, check or _unchecked)
                except Exception as exc:
                    raise WarmUpFailed(label, f"{type(exc).__name__}: {str(exc)[:400]}") from None
            return
        except WarmUpFailed as exc:
            if not replica.rebuild(exc.problem):
                raise


def _finalize(replica: Model, worker: str) -> None:
    try:
        replica.finalize()
    except Exception:
        log.exception("worker %s: finalize failed", worker)


def _unchecked(stage: str, actual: str, expected: str | None = None) -> bool:
    return True


def forward(replica: Model, inputs: list[dict], batched: bool, examples: int, check=_unchecked,
            keep: frozenset[str] = frozenset(), stamps: list[float] | None = None) -> dict:
    """One forward pass of ``replica`` over some requests' preprocessed inputs, as every worker runs it:
    one host tensor per input for them all, moved to the replica's place, ``execute``, ``postprocess``;
    the declared outputs as host arrays, of ``examples`` rows each when ``batched``. ``check`` is the
    worker's ``PlaceChecker``: where each tensor is, at each stage.

    A pipeline's steps: an input may be a step's ``Handed`` tensor, joined where it is and moved only
    when it is elsewhere; the outputs in ``keep`` (the model's postprocess is the default, ``numpy()``)
    stay the tensors ``execute`` made, for the next step.

    ``stamps``, when given, gets ``time.perf_counter()`` at the start, once the inputs are on the device,
    once ``execute`` has returned and once the outputs are host arrays: Triton's compute_input,
    compute_infer and compute_output of the batch."""
    if stamps is not None:
        stamps.append(time.perf_counter())
    context = replica.context
    on_host = placeenv.device_name(replica.place) == "cpu"  # a CPU worker: its host tensors are in place
    moved = {}
    padding = context.padding
    for spec in context.inputs:
        parts = [request[spec.name] for request in inputs]
        handed = any(isinstance(part, Handed) for part in parts)  # (a padded one is a tensor where it was)
        if padding and len(parts) > 1 and spec.name in padding:
            parts = padded(parts, *padding[spec.name])
        if handed:
            tensor = _joined(parts, replica.place)
        else:
            host = batch_tensor(parts)
            check("preprocess", placeenv.device_name(host.place), "cpu")
            tensor = host if on_host else move_to(host, replica.place)
        moved[spec.name] = tensor
        check("batch", placeenv.device_name(tensor.place))
    if stamps is not None:
        stamps.append(time.perf_counter())
    out = replica.execute(moved)
    # The thread's device after the forward: the one check that sees a leak for a saved program
    # on sim, whose outputs are CPU tensors whatever device it ran on (docs/service.md).
    check("execute", paddle.get_device())
    expected = replica.output_device()
    for tensor in out.values():
        if not isinstance(tensor, np.ndarray):  # (an execute that works on the host may give arrays)
            check("output", placeenv.device_name(tensor.place), expected)
    if stamps is not None:
        stamps.append(time.perf_counter())
    results = replica.postprocess({n: t for n, t in out.items() if n not in keep} if keep else out)
    # A Predictor's outputs are its output variables, which its next run writes over: a kept one is copied.
    results.update((name, out[name] if replica.predictor is None else out[name].clone()) for name in keep)
    missing = [spec.name for spec in context.outputs if spec.name not in results]
    if missing:
        raise RuntimeError(f"postprocess returned no {', '.join(missing)} (declared outputs)")
    if batched:  # (requests share a forward pass only when their model batches)
        short = [n for n, a in results.items() if rows_of(a) != examples]
        if short:
            raise RuntimeError(f"outputs {short} do not have the batch's {examples} rows")
    found = {spec.name: results[spec.name] if spec.name in keep else np.asarray(results[spec.name])
             for spec in context.outputs}
    if stamps is not None:
        stamps.append(time.perf_counter())
    return found


def rows_of(value) -> int | None:
    """The first dimension of an array, a tensor or a ``Handed`` one (anything with a shape, or a list);
    None for a scalar."""
    shape = value.shape if hasattr(value, "shape") else np.shape(value)
    return int(shape[0]) if len(shape) else None


def sliced(value, start: int, stop: int):
    """Rows ``start:stop`` of a job's input: an array's or a tensor's slice, or a ``Handed`` tensor's rows."""
    if not isinstance(value, Handed):
        return value[start:stop]
    base = value.rows[0] if value.rows is not None else 0
    return Handed(value.tensor, value.device, (base + start, base + stop))


def padded(parts: list, dims: tuple[int, ...], value: float) -> list:
    """A batch's parts of one input, each padded at the end of ``dims`` with ``value`` up to the batch's
    largest (the config's ``batch_padding``): the jobs were joined by a shape that leaves those dims out."""
    shapes = [list(part.shape) for part in parts]
    largest = {d: max(shape[d] for shape in shapes) for d in dims}
    found = []
    for part, shape in zip(parts, shapes):
        widths = [(0, largest[d] - size if d in largest else 0) for d, size in enumerate(shape)]
        if not any(after for _, after in widths):
            found.append(part)
        elif isinstance(part, np.ndarray):
            found.append(np.pad(part, widths, constant_values=value))
        else:  # a tensor: padded where it is (a step's Handed rows taken out first)
            tensor = part.tensor if isinstance(part, Handed) else part
            if isinstance(part, Handed) and part.rows is not None:
                tensor = tensor[part.rows[0]:part.rows[1]]
            found.append(paddle.nn.functional.pad(tensor, [w for pair in widths for w in pair], value=value))
    return found


def split(job: Job, limit: int) -> list[Job]:
    """``job``'s rows as jobs of at most ``limit`` examples (its model's max_batch_size), to queue in its
    place: no forward pass takes more than its model's limit, and the parts may share batches with other
    jobs, on any device. Each part answers ``job``: once every part has, with their outputs joined in order
    (``joined_answer``); at a part's failure, with that failure, once (``Job.fail`` withdraws the rest)."""
    starts = range(0, job.examples, limit)
    answers: list[Answer | None] = [None] * len(starts)
    left = [len(starts)]

    def settled(i: int, part: Job, answer: Answer | None, error: BaseException | None) -> None:
        job.device, job.started = job.device or part.device, job.started or part.started
        if error is not None:
            job.fail(error)
            return
        answers[i] = answer
        left[0] -= 1
        if not left[0]:
            job.resolve(joined_answer(answers))

    parts = []
    for i, start in enumerate(starts):
        stop = min(start + limit, job.examples)
        inputs = {name: sliced(value, start, stop) for name, value in job.inputs.items()}
        part = Job(model=job.model, inputs=inputs, examples=stop - start, batched=True, loop=job.loop,
                   future=None, arrived=job.arrived, deadline=job.deadline, prefer=job.prefer, step=job.step,
                   chain=job.chain, priority=job.priority, shape=job.shape, parameters=job.parameters)
        part.future = Settled(functools.partial(settled, i, part))  # (it names the part: made first)
        parts.append(part)
    job.parts = tuple(parts)
    return parts


def joined_answer(answers: list[Answer]) -> Answer:
    """The answer of a job run as parts (``split``), of its parts' answers in order: their outputs joined by
    rows (host arrays: a part keeps no tensor), and every forward pass they ran, for the statistics."""
    first = answers[0]
    return Answer({name: np.concatenate([answer.outputs[name] for answer in answers]) for name in first.outputs},
                  first.device, first.worker, max(answer.batch_size for answer in answers),
                  min(answer.compute_started for answer in answers), first.batch,
                  tuple(batch for answer in answers[1:] for batch in answer.batches))


def _joined(parts: list, place) -> paddle.Tensor:
    """One tensor on ``place`` of a batch's parts of one input, some of them a step's ``Handed`` tensors:
    the parts that are consecutive rows of one tensor taken as one piece (the whole tensor when they
    are all of it), each piece moved only when it is elsewhere, then joined on ``place``."""
    device = placeenv.device_name(place)
    pieces: list[list] = []  # [tensor, its device, start, stop (None: the whole tensor)]
    for part in parts:
        if isinstance(part, Handed):
            last = pieces[-1] if pieces else None
            if part.rows is not None and last is not None and last[0] is part.tensor and last[3] == part.rows[0]:
                last[3] = part.rows[1]  # the next rows of the same batch's tensor
            else:
                pieces.append([part.tensor, part.device, *(part.rows or (None, None))])
        else:  # a batch-mate's host array (or its preprocess's CPU tensor)
            tensor = host_tensor(part) if isinstance(part, np.ndarray) else part
            pieces.append([tensor, placeenv.device_name(tensor.place), None, None])
    tensors = []
    for tensor, where, start, stop in pieces:
        if start is not None and not (start == 0 and stop == tensor.shape[0]):
            tensor = tensor[start:stop]
        tensors.append(tensor if where == device else move_to(tensor, place))
    return tensors[0] if len(tensors) == 1 else paddle.concat(tensors)


_memory_failed: set[str] = set()


def device_memory(device: str) -> float:
    """Bytes ``device`` has given Paddle's allocator: the sim plugin's own count on sim devices, Paddle's
    allocator statistics elsewhere (which miss a Predictor's weights: docs/observability.md). NaN, said
    once, where they cannot be read: a scrape must not fail for one gauge."""
    try:
        if device.startswith("sim:"):
            return placeenv.sim.stats(int(device.split(":")[1])).memory_used
        return paddle.device.memory_reserved(device)
    except Exception as exc:  # noqa: BLE001 - reported once, the gauge reads NaN
        if device not in _memory_failed:
            _memory_failed.add(device)
            log.warning("device_memory_used_bytes{device=%r}: cannot read it: %s", device, exc)
        return float("nan")


class Shares:
    """One ``DeviceShare`` for each (device, model, version, its files' fingerprint): what its workers
    share while it is served, so a replacement worker takes the same copy of the weights, and a version
    loaded again from changed files does not."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shares: dict[tuple[str, str, int, str], DeviceShare] = {}

    def get(self, device: str, model: str, version: int, fingerprint: str = "") -> DeviceShare:
        with self._lock:
            return self._shares.setdefault((device, model, version, fingerprint), DeviceShare())

    def forget(self, model: str, version: int, fingerprint: str) -> None:
        """Let go of a version's weights (unloaded, or loaded again from changed files)."""
        with self._lock:
            for key in [k for k in self._shares if k[1:] == (model, version, fingerprint)]:
                del self._shares[key]


class WorkerPool:
    """All workers, and a thread that replaces dead ones."""

    def __init__(self, queues: dict[str, DeviceQueue], entries: dict[str, Entry], settings, call=None,
                 listed_only: frozenset[str] = frozenset()) -> None:
        """``call``: the engine's way in for a model's call to another; ``listed_only``: devices whose workers
        load only the models whose instance_group names their kind (the CPU, added for such models)."""
        self.queues, self.entries, self.settings, self.call = queues, entries, settings, call
        self.listed_only = listed_only
        self.workers: list[Worker] = []
        self._stopping = threading.Event()
        self._replacer = threading.Thread(target=self._replace_dead, name="worker-replacer", daemon=True)
        self.shares = Shares()
        self.accelerator_devices = [device for device in queues if device != "cpu"]
        for device, queue in queues.items():
            for i in range(queue.workers):
                self.workers.append(self._new(f"{device}/{i}", device, queue))

    @property
    def accelerators(self) -> int:
        return len(self.accelerator_devices)

    def _new(self, name: str, device: str, queue: DeviceQueue) -> Worker:
        index = int(name.rsplit("/", 1)[1])
        held = [e for e in self.entries.values()
                if index < e.instances(device, queue.workers, listed_only=device in self.listed_only)]
        return Worker(name, device, queue, held, self.settings, self.accelerators, self.shares, self.call)

    def start(self, timeout: float = 300) -> None:
        for device in self.accelerator_devices:
            metrics.DEVICE_MEMORY.labels(device).set_function(functools.partial(device_memory, device))
        for worker in self.workers:
            worker.start()
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            while not worker.ready.wait(0.1):
                if not worker.alive():
                    raise StartupError(f"worker {worker.name} failed to start: {worker.error!r}")
                if time.monotonic() > deadline:
                    raise StartupError(f"worker {worker.name} did not load its models in {timeout}s")
        self._replacer.start()

    def ready(self) -> bool:
        return all(w.ready.is_set() and w.alive() for w in self.workers)

    def _replace_dead(self) -> None:
        while not self._stopping.wait(0.2):
            for i, worker in enumerate(self.workers):
                if worker.alive() or self._stopping.is_set():
                    continue
                log.error("replacing dead worker %s", worker.name)
                metrics.WORKER_RESTARTS.labels(worker.device).inc()
                fresh = self._new(worker.name, worker.device, worker.queue)
                self.workers[i] = fresh
                fresh.start()

    def stop(self, timeout: float = 30) -> None:
        """Let workers finish what they hold, then join them. The queues stay open until they are idle
        (or the time is up): a batch running may call another model, through them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(len(q) or q.busy for q in self.queues.values()):
            time.sleep(0.02)
        timeout = max(0.0, deadline - time.monotonic())
        self._stopping.set()
        for queue in self.queues.values():
            queue.close()
        for worker in self.workers:
            worker.stop()
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            worker.thread.join(max(0.0, deadline - time.monotonic()))
        if self._replacer.is_alive():
            self._replacer.join(1)
