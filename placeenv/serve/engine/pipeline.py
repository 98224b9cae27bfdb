"""Pipelines: one request through a chain of the repository's models in this process (Triton's
ensembles), and a model's call to another from its ``execute`` (Triton's BLS), both as steps of the
request they serve.

A pipeline (``models.repository.Pipeline``) is a graph of steps, each a model of the repository,
linked by named tensors. ``PipelineRun`` carries one request through it on the event loop thread: a
step starts as soon as the tensors it reads are there, as a job of its model through the engine's
one path (path.py's ``RequestPath.run``), under the generation its request was admitted under: the
dispatcher, that model's batches with its other jobs, a worker on a device, or on the CPU under
``PlaceEnv('cpu')`` for a model whose instance_group is the CPU. Every step keeps the request's
deadline, and each worker's place checks count a leak for the step too.

Between two steps a tensor stays the one ``execute`` made (``Handed``), on the device that made it,
when its model's postprocess is the default and every step that reads it takes tensors (its model
has no preprocess of its own and runs on an accelerator) (``plan``): the next step is queued on that
device when it serves the model, so the tensor is neither downloaded nor uploaded between them.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import numpy as np
import paddle

import placeenv

from .. import metrics
from ..models.base import Model, Serving
from ..models.repository import Entry, Pipeline, PipelineStep
from ..protocol.errors import Cancelled, InvalidInput, ModelFailed, ServiceError, Timeout, UnknownModel
from ..protocol.request import InputError, Result, TensorSpec, Work, check_parameters
from ..protocol.wire import datatype_of
from .job import Job, StepOptions, on_loop
from .forward import Answer, Handed, rows_of

#: ``RequestPath.run`` (path.py): ``run(generation, work, arrays, then, options, ticket)`` queues one model's
#: work under ``generation``; ``then(job, answer, error)`` once, on the loop thread.
Run = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """How a pipeline runs one of its steps."""

    step: PipelineStep
    inputs: tuple[TensorSpec, ...]  # its model's, checked at run time as each tensor arrives
    batched: bool  # its model batches along the first dimension: its job has that many examples
    keep: frozenset[str]  # its outputs it hands on as tensors (Handed)
    reads_steps: frozenset[str]  # its inputs read from another step's output (the metrics' handoffs)
    after: frozenset[int]  # the steps (by index) whose outputs it reads: it starts once they are done


@dataclasses.dataclass(frozen=True)
class Plan:
    pipeline: Pipeline
    steps: tuple[StepPlan, ...]
    datatypes: dict[str, str]  # each output's


def plan(pipeline: Pipeline, entries: Mapping[str, Entry]) -> Plan:
    """How ``pipeline`` runs on ``entries``: which outputs each step hands on as tensors."""
    versions = {s.index: entries[s.model].versions[s.version] for s in pipeline.steps}
    # A step that takes host arrays: its model has a preprocess of its own, or runs on CPU workers only
    # (the producer's worker then makes its tensor an array once a batch, not each job's rows apart).
    takes_arrays = {s.index: versions[s.index].model_class.preprocess is not Model.preprocess
                    or on_host_only(entries[s.model]) for s in pipeline.steps}
    readers: dict[str, list[int]] = {}
    for step in pipeline.steps:
        for tensor in step.inputs.values():
            readers.setdefault(tensor, []).append(step.index)
    outputs = {spec.name for spec in pipeline.outputs}
    maker = {tensor: step.index for step in pipeline.steps for tensor in step.outputs.values()}
    steps = []
    for step in pipeline.steps:
        version = versions[step.index]
        default_post = version.model_class.postprocess is Model.postprocess
        keep = frozenset(out for out, tensor in step.outputs.items() if default_post and tensor not in outputs
                         and not any(takes_arrays[r] for r in readers.get(tensor, ())))
        steps.append(StepPlan(step, version.inputs, entries[step.model].max_batch_size > 0, keep,
                              frozenset(k for k, t in step.inputs.items() if t in maker),
                              frozenset(maker[t] for t in step.inputs.values() if t in maker)))
    return Plan(pipeline, tuple(steps), {spec.name: spec.datatype for spec in pipeline.outputs})


def on_host_only(entry: Entry) -> bool:
    """Whether only CPU workers serve ``entry`` (its instance_group names the CPU alone)."""
    groups = entry.config.instance_group
    return groups is not None and all(g.kind == "cpu" for g in groups)


def _size(value) -> int:
    """Bytes a step's preprocess would read of ``value``: a small input is preprocessed on the loop."""
    if isinstance(value, np.ndarray):
        return sum(len(v) for v in value.flat) if value.dtype == object else value.nbytes
    return 0


def _examples(arrays: Mapping[str, Any], batched: bool) -> int:
    """The examples of a step's (or a call's) job: its inputs' one first dimension when its model batches,
    else 1; ``InputError`` when they differ."""
    rows = {rows_of(v) for v in arrays.values()} if batched else {1}
    if len(rows) != 1:
        raise InputError(f"its inputs differ in their first (batch) dimension: "
                         f"{ {n: rows_of(v) for n, v in arrays.items()} }")
    return rows.pop()


def _check(spec: TensorSpec, value) -> None:
    """``InputError`` unless ``value`` (an array, or a step's tensor) is what ``spec`` reads."""
    if not isinstance(value, Handed):
        spec.check(value)
        return
    datatype = datatype_of(value.tensor.dtype)
    if datatype != spec.datatype:
        raise InputError(f"input {spec.name!r} has datatype {datatype}; expected {spec.datatype}")
    spec.check_shape(value.shape)


def step_metrics(pipeline: str, step: str, job: Job, answer: Answer, handed: list) -> None:
    """A step's (or a call's) queue and compute time, the examples of the forward pass it shared, and
    how each of ``handed`` (the tensors it read from another step, or its caller) reached it."""
    metrics.child(metrics.STEP_QUEUE_DURATION, pipeline, step, answer.device).observe(
        answer.compute_started - job.enqueued)
    metrics.child(metrics.STEP_COMPUTE_DURATION, pipeline, step, answer.device).observe(
        time.perf_counter() - answer.compute_started)
    metrics.child(metrics.STEP_BATCH_SIZE, pipeline, step).observe(answer.batch_size)
    for value in handed:
        way = "host" if not isinstance(value, Handed) else "device" if value.device == answer.device else "moved"
        metrics.child(metrics.STEP_HANDOFFS, pipeline, step, way).inc()


class PipelineRun:
    """One request through a pipeline, on the event loop thread; ``answer(run, result, error)`` once.
    Counted in its ``generation`` (``Generation.admit``) until answered; its steps are run under it."""

    def __init__(self, run: Run, generation, plan_: Plan, work: Work, arrays: Mapping[str, np.ndarray],
                 inline_bytes: int, answer: Callable[[PipelineRun, Result | None, BaseException | None], None]) -> None:
        self.run, self.generation, self.plan, self.work, self.answer = run, generation, plan_, work, answer
        generation.admit()
        self.inline_bytes = inline_bytes
        self.values: dict[str, Any] = dict(arrays)  # tensor name -> host array or Handed
        self.pending = list(plan_.steps)  # steps not started yet
        self.finished: set[int] = set()  # steps answered (by index)
        self.started: dict[int, float] = {}  # when each step was handed to the engine
        self.running = 0
        self.done = False  # no more steps start: the run has ended (answered, or answering)
        self.answered = False
        self.times = {"preprocess_ms": 0.0, "queue_ms": 0.0, "compute_ms": 0.0}
        self.stages = [0, 0, 0]  # its steps' batches' ns of input, infer and output (Triton's statistics)
        self.shown: Answer | None = None  # the answer the result reports: the last on an accelerator
        self.jobs: list[Job] = []  # its steps' jobs, as they are made (cancel withdraws those unanswered)

    def start(self) -> None:
        self._advance()

    # -- as its request's handle (Engine.submit), and its steps' ticket (RequestPath.run) -------------

    def attach(self, job: Job) -> bool:
        """A step's job, once made; False once the run has ended (the step is not queued)."""
        if self.done:
            return False
        self.jobs.append(job)
        return True

    def cancel(self) -> bool:
        """The client left: no more steps start, those queued are withdrawn (``Job.cancel``), and the
        request is answered ``Cancelled`` (or ``Timeout`` past its deadline)."""
        if self.done:
            return False
        if self.work.deadline <= time.perf_counter():
            error: ServiceError = Timeout(f"pipeline {self.plan.pipeline.name!r}: no answer within "
                                          f"{self.work.deadline - self.work.arrived:.3g} s")
        else:
            error = Cancelled("the client cancelled the request")
            error.stage = "running" if self.ran() else "queued"
        self.done = True
        for job in self.jobs:
            job.cancel()
        self._reply(None, error)
        return True

    def ran(self) -> bool:
        """Whether a worker has begun on any of its steps."""
        return bool(self.finished) or any(job.started for job in self.jobs)

    def _advance(self) -> None:
        while not self.done:
            ready = next((s for s in self.pending if s.after <= self.finished), None)
            if ready is None:
                break
            self.pending.remove(ready)
            self.running += 1
            self._start(ready)  # a step refused at once settles here, and may end the run
        if not self.done and not self.pending and not self.running:
            self._finish()

    def _start(self, planned: StepPlan) -> None:
        step = planned.step
        arrays, prefer = {}, ""
        try:
            for spec in planned.inputs:
                value = self.values[step.inputs[spec.name]]
                _check(spec, value)
                if isinstance(value, Handed):
                    prefer = prefer or value.device
                arrays[spec.name] = value
            examples = _examples(arrays, planned.batched)
        except InputError as exc:
            self._settled(planned, None, None, ModelFailed(str(exc)))
            return
        # The request's work, as this step's model takes it (its deadline, priority and arrival are the request's).
        work = msgspec.structs.replace(self.work, model=step.model, version=step.version, examples=examples,
                                       outputs=list(step.outputs),
                                       inline=sum(_size(v) for v in arrays.values()) <= self.inline_bytes,
                                       parameters=self.work.parameters if step.parameters else None)
        self.started[step.index] = time.perf_counter()
        options = StepOptions(planned.keep, prefer, (self.plan.pipeline.name, step.label), (self.plan.pipeline.name,))
        self.run(self.generation, work, arrays, functools.partial(self._settled, planned), options, self)

    def _settled(self, planned: StepPlan, job: Job | None, answer: Answer | None,
                 error: BaseException | None) -> None:
        try:
            self._take(planned, job, answer, error)
        except Exception as exc:  # a bug of ours: the request is still answered, once
            self.fail(exc)

    def fail(self, error: BaseException) -> None:
        """Answer ``error``, unless the request has its answer."""
        self._reply(None, error)

    def _reply(self, result: Result | None, error: BaseException | None) -> None:
        if self.answered:
            return
        self.answered = self.done = True
        self.generation.release()
        self.answer(self, result, error)

    def _take(self, planned: StepPlan, job: Job | None, answer: Answer | None, error: BaseException | None) -> None:
        """A step's answer: the tensors it made, and the steps they let start; or the request's error."""
        self.running -= 1
        if self.done:
            return
        step, name = planned.step, self.plan.pipeline.name
        if error is not None:
            self.done = True
            if isinstance(error, ServiceError):
                found = type(error)(f"pipeline {name!r}, {step}: {error}")
                found.device = error.device if job is None else (job.device or "none")
                error = found
            self._reply(None, error)
            return
        step_metrics(name, step.label, job, answer, [self.values[step.inputs[key]] for key in planned.reads_steps])
        now = time.perf_counter()
        self.times["preprocess_ms"] += (job.enqueued - self.started[step.index]) * 1000
        self.times["queue_ms"] += (answer.compute_started - job.enqueued) * 1000
        self.times["compute_ms"] += (now - answer.compute_started) * 1000
        stages = self.stages
        for batch in answer.batches:
            stages[0] += batch.input_ns
            stages[1] += batch.infer_ns
            stages[2] += batch.output_ns
        if self.shown is None or answer.device != "cpu":
            self.shown = answer
        for output, tensor in step.outputs.items():
            self.values[tensor] = answer.outputs[output]
        self.finished.add(step.index)
        self._advance()

    def _finish(self) -> None:
        self.done = True
        work, pipeline = self.work, self.plan.pipeline
        outputs = {name: self.values[name] for name in work.outputs}
        if pipeline.max_batch_size > 0:
            short = [n for n, a in outputs.items() if np.ndim(a) == 0 or len(a) != work.examples]
            if short:
                self._reply(None, ModelFailed(f"pipeline {pipeline.name!r}: outputs {short} do not have the "
                                              f"request's {work.examples} rows"))
                return
        shown, now = self.shown, time.perf_counter()
        self._reply(Result(
            model=pipeline.name, version=pipeline.version, outputs=outputs,
            datatypes={name: self.plan.datatypes[name] for name in work.outputs},
            device=shown.device, worker=shown.worker, batch_size=shown.batch_size,
            batched=pipeline.max_batch_size > 0,
            timings={**{k: round(v, 3) for k, v in self.times.items()},
                     "total_ms": round((now - work.arrived) * 1000, 3)},
        ), None)


def call(run: Run, generation, name: str, version: int | None, requests: list[dict], outputs, calls: Serving,
         parameters: Mapping[str, Any] | None = None, anywhere: bool = False) -> list[dict[str, np.ndarray]]:
    """A model's calls to another (``Model.infer``, ``Model.infer_all``), on the caller's worker thread: each
    request queued through the event loop as a step of the caller's request, under the ``generation`` that
    request was admitted under, all at once (they may run on several workers and share forward passes),
    and waited for within that request's deadline. Each call has the caller's request's parameters,
    unless ``parameters`` (its own; {}: none) is given. ``anywhere``: each call goes to the least loaded device
    serving the model, not to the caller's own device first."""
    caller = calls.chain[-1]
    where = f"model {caller!r} calling {name!r}"
    parameters = calls.parameters if parameters is None else _call_parameters(where, parameters)
    if name in calls.chain:
        raise ModelFailed(f"{where}: a call cycle ({' -> '.join((*calls.chain, name))}): a model cannot call "
                          "one its request is already inside of")
    entry, chosen, wanted = _called(where, generation.entries, name, version, outputs)
    checked = [_call_arrays(where, entry, chosen, inputs) for inputs in requests]
    futures = [_queue_call(run, generation, calls, caller, Work(name, chosen.number, examples, wanted,
                                                                time.perf_counter(), calls.deadline, False,
                                                                parameters=parameters), arrays, anywhere)
               for arrays, examples in checked]
    calls.worker.serve_until(_last_of(futures), calls.deadline)
    answers = []
    for future in futures:
        try:
            answer = future.result(timeout=max(0.0, calls.deadline - time.perf_counter()))
        except concurrent.futures.TimeoutError:
            raise Timeout(f"{where}: no answer within the request's deadline") from None
        answers.append({n: answer.outputs[n] for n in wanted})
    return answers


def _call_parameters(where: str, parameters: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        return check_parameters(parameters)
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc}") from None


def _called(where: str, entries: Mapping[str, Entry], name: str, version: int | None, outputs):
    """The called model's entry, version and the outputs wanted of it; ``UnknownModel`` or ``InvalidInput``."""
    entry = entries.get(name)
    if entry is None:
        raise UnknownModel(f"{where}: no such model; calls run the models served: {', '.join(entries)}")
    chosen = entry.default if version is None else entry.versions.get(version)
    if chosen is None:
        raise UnknownModel(f"{where}: no version {version}; it has {', '.join(map(str, sorted(entry.versions)))}")
    names = [spec.name for spec in chosen.outputs]
    wanted = names if outputs is None else list(outputs)
    if any(n not in names for n in wanted):
        raise InvalidInput(f"{where}: no output {next(n for n in wanted if n not in names)!r}; it gives "
                           f"{', '.join(names)}")
    return entry, chosen, wanted


def _last_of(futures: list[concurrent.futures.Future]) -> concurrent.futures.Future:
    """A future done once each of ``futures`` is: the calling worker serves its queue until then."""
    answered: concurrent.futures.Future = concurrent.futures.Future()
    left = [len(futures)]

    def one_done(_) -> None:
        left[0] -= 1
        if left[0] == 0:
            answered.set_result(None)

    for future in futures:
        future.add_done_callback(one_done)
    return answered


def _call_arrays(where: str, entry: Entry, chosen, inputs: Mapping) -> tuple[dict, int]:
    """One call's inputs checked against the called version's, as arrays (or ``Handed`` tensors), and
    its examples."""
    unknown = [key for key in inputs if key not in {s.name for s in chosen.inputs}]
    if unknown:
        raise InvalidInput(f"{where}: no input {unknown[0]!r}; it takes {', '.join(s.name for s in chosen.inputs)}")
    # A model with a preprocess of its own, or on CPU workers only, takes host arrays (as a step does).
    takes_arrays = chosen.model_class.preprocess is not Model.preprocess or on_host_only(entry)
    arrays = {}
    for spec in chosen.inputs:
        if spec.name not in inputs:
            raise InvalidInput(f"{where}: missing input {spec.name!r} ({spec.datatype} {list(spec.shape)})")
        value = inputs[spec.name]
        if isinstance(value, paddle.Tensor):
            value = value.numpy() if takes_arrays else Handed(value, placeenv.device_name(value.place))
        else:
            value = np.asarray(value)
        try:
            _check(spec, value)
        except InputError as exc:
            raise InvalidInput(f"{where}: {exc}") from None
        arrays[spec.name] = value
    try:
        return arrays, _examples(arrays, entry.max_batch_size > 0)
    except InputError as exc:
        raise InvalidInput(f"{where}: {exc}") from None


def _queue_call(run: Run, generation, calls: Serving, caller: str, work: Work,
                arrays: dict, anywhere: bool = False) -> concurrent.futures.Future:
    """One call (``work``) queued from the event loop; its future gets the worker's ``Answer``."""
    name, number = work.model, work.version
    future: concurrent.futures.Future = concurrent.futures.Future()

    def settled(job: Job | None, answer: Answer | None, error: BaseException | None) -> None:
        if error is None:
            future.set_result(answer)
            step_metrics(caller, name, job, answer, list(arrays.values()))
        else:
            future.set_exception(error)

    worker = calls.worker
    # Where its tensors are; else on the caller's own device, which serves it while it waits.
    prefer = next((v.device for v in arrays.values() if isinstance(v, Handed)),
                  worker.device if worker.holds(generation.versions.get((name, number))) and not anywhere else "")
    options = StepOptions(prefer=prefer, step=(caller, name), chain=calls.chain)
    on_loop(calls.loop, functools.partial(run, generation, work, arrays, settled, options))
    return future
