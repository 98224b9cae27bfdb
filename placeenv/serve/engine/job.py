"""A job: one accepted request's work on one model, answered once (``resolve``, ``fail``, ``expire``,
``cancel``), whichever of a worker, its timer, its client or shutdown comes first; and what a batch
joins it by (``shape_key``, ``batch_key``). Answers reach the event loop thread by ``on_loop``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..protocol.errors import Cancelled, Timeout
from ..protocol.request import Work

log = logging.getLogger(__name__)


def on_loop(loop: asyncio.AbstractEventLoop, callback, *args) -> None:
    """``callback(*args)`` on ``loop``'s thread, from a worker's, in a context of its own: asyncio would run
    it in a copy of the worker's, whose placeenv scope (the worker's device) the loop thread would then
    take up, and keep on its Tracer once a scope opened in the callback (a preprocess's
    ``PlaceEnv('cpu')``) closed back onto it."""
    loop.call_soon_threadsafe(callback, *args, context=contextvars.Context())


class Future(Protocol):
    """What a job's answer settles, once, on the event loop thread: ``settle(answer, None)`` or
    ``settle(None, error)``; a second settle does nothing. The engine's ``Completion`` (path.py), or a
    ``Settled`` callback."""

    def settle(self, answer: Any, error: BaseException | None) -> None: ...


class Settled:
    """A job's answer handed to a callback (a part of a job run as parts: ``split``; a test's job).

    It calls ``callback(answer, error)`` at once: no waiting task to wake, and no turn of the loop
    between the answer and its reply. The callback usually holds the job, which holds this: it is let
    go once called, so the request's objects are freed by their reference counts, not left for the
    cyclic garbage collector."""

    __slots__ = ("callback",)

    def __init__(self, callback) -> None:
        self.callback = callback

    def settle(self, answer: Any, error: BaseException | None) -> None:
        callback, self.callback = self.callback, None
        if callback is not None:
            callback(answer, error)


@dataclass(frozen=True, slots=True)
class StepOptions:
    """What a pipeline's step or a model's call adds to its job (pipeline.py): the outputs a next step
    takes as tensors (``Handed``), the device its tensors are on, (pipeline or calling model, step) for
    the metrics, and the models its request is inside of, outermost first (a call: no cycle). A
    request's own job has none of them (``REQUEST``)."""

    keep: frozenset[str] = frozenset()
    prefer: str = ""
    step: tuple[str, str] | None = None
    chain: tuple[str, ...] = ()


REQUEST = StepOptions()


@dataclass(eq=False)
class Job:
    """One accepted request in the engine. ``resolve``/``fail`` answer it; the first answer wins.

    ``request`` is the request as the gateway admitted it (``Work``: its model, rows, arrival, deadline,
    priority and parameters), the same object from admission to answer; ``options`` is what a pipeline's
    step or a model's call adds to it. A step's job holds its step's request, derived from its pipeline's
    by ``msgspec.structs.replace``; the parts of a job queued as parts are derived from it by
    ``dataclasses.replace`` (forward.split: each part's request the request with its rows), so a new field
    reaches them. Its state in the engine (where it was queued, when it started, whether it is answered) is
    not: each part has its own."""

    model: tuple[str, int]  # (name, version): what a batch may share, with ``shape``
    request: Work  # its rows (``examples``: 1 for a model that does not batch), deadline, priority, parameters
    inputs: dict[str, Any]  # preprocessed host arrays or CPU tensors [n, ...], in the model's input order
    batched: bool  # the model batches along the first dimension (its outputs are split by rows)
    loop: asyncio.AbstractEventLoop
    future: Future | None  # settled once, on the loop thread: the engine's ``Completion``, or a ``Settled``
    options: StepOptions = REQUEST  # a pipeline's step's or a model's call's
    # Each input's dims after the first (``shape_key``), and its request's parameters if it sent any
    # (``batch_key``): a batch joins only jobs of one model, one shape and the same parameters.
    shape: Any = None
    generation: Any = None  # what it was admitted under (engine/generation.py): what its calls are looked up in
    # The ServedVersion of ``model`` in ``generation``: the devices that may take it, its batch limits, and
    # its replicas, one a worker that holds it (what a worker runs it on).
    served: Any = None
    parts: tuple[Job, ...] = field(default=(), init=False)  # its rows queued as jobs, past max_batch_size (split)
    device: str = field(default="", init=False)
    queue: Any = field(default=None, init=False)  # the DeviceQueue it was queued on; a cancelled job leaves it
    enqueued: float = field(default=0.0, init=False)
    started: float = field(default=0.0, init=False)
    _answered: bool = field(default=False, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def claim(self) -> bool:
        """True once: whoever gets it answers the job."""
        with self._lock:
            if self._answered:
                return False
            self._answered = True
            return True

    def _answer(self, answer, error: BaseException | None) -> bool:
        if not self.claim():
            return False
        self.loop.call_soon_threadsafe(self.future.settle, answer, error, context=contextvars.Context())  # (on_loop)
        return True

    def resolve(self, answer) -> bool:
        return self._answer(answer, None)

    def fail(self, error: BaseException) -> bool:
        if not self._answer(None, error):
            return False
        for part in self.parts:  # the rest of a split job's rows are not run for nothing
            part.withdraw()
        return True

    def withdraw(self) -> None:
        """Leave the queue unanswered (a part of a job answered already): claimed, so a worker that took it
        into a batch drops it."""
        if self.claim() and self.queue is not None:
            self.queue.discard(self)

    def expire(self) -> bool:
        """Answer ``Timeout`` (the request's deadline passed)."""
        return self.fail(Timeout(f"no answer within {self.request.deadline - self.request.arrived:.3g} s"))

    def cancel(self) -> bool:
        """The client left: answer ``Cancelled`` and leave the queue, so no worker runs it (one that took
        it into a batch drops it: it is answered); a worker running it has its answer dropped. Past the
        deadline it is the deadline's answer instead, whoever saw it first. On the loop thread."""
        if self.request.deadline <= time.perf_counter():
            return self.expire()
        error = Cancelled("the client cancelled the request")
        if self.started or any(part.started for part in self.parts):
            error.stage = "running"
        if not self.fail(error):
            return False
        if self.queue is not None:
            self.queue.discard(self)
        return True

    @property
    def answered(self) -> bool:
        return self._answered


def shape_key(inputs: dict[str, Any], padded: dict[str, tuple[tuple[int, ...], float]]) -> tuple:
    """What jobs must share to be joined into one batch: each input's dims after the first (host arrays,
    tensors and ``Handed`` step tensors all have a ``shape``), with the dims its model pads
    (``ModelContext.padding``) left out as -1."""
    if not padded:
        if len(inputs) == 1:  # (most models: one input's dims, with no tuple to make for an array's)
            for value in inputs.values():
                dims = value.shape[1:]
                return dims if type(dims) is tuple else tuple(dims)
        return tuple([tuple(value.shape[1:]) for value in inputs.values()])
    key = []
    for name, value in inputs.items():
        dims = tuple(value.shape[1:])
        if name in padded:
            pads = padded[name][0]
            dims = tuple([-1 if i in pads else d for i, d in enumerate(dims, 1)])
        key.append(dims)
    return tuple(key)


@dataclass(frozen=True, slots=True)
class WithParameters:
    """The batching key of a job whose request sent parameters: its shape and its parameters (each with
    its type: 1, 1.0 and true are different parameters). Equal only to another such key, never to a
    plain shape, so a batch never mixes requests of different parameters, nor with and without."""

    shape: Any
    parameters: tuple


def batch_key(shape: Any, parameters: dict[str, Any] | None) -> Any:
    """What jobs must share to be joined into one batch: ``shape`` (``shape_key``) as it is for a request
    without parameters (no object made), else with its parameters (``WithParameters``)."""
    if parameters is None:
        return shape
    return WithParameters(shape, tuple([(key, type(value), value) for key, value in sorted(parameters.items())]))


def resolve_all(answers: list[tuple[Job, Any]]) -> None:
    """``job.resolve(value)`` for each pair, with one wake-up of each event loop for the lot:
    a batch of 16 answers costs the loop one hand-off, not 16."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for job, value in answers:
        if job.claim():
            by_loop.setdefault(job.loop, []).append((job.future, value))
    for loop, settled in by_loop.items():
        loop.call_soon_threadsafe(_settle_all, settled, context=contextvars.Context())  # (on_loop)


def _settle_all(settled: list) -> None:
    for future, answer in settled:
        try:
            future.settle(answer, None)
        except Exception:  # one answer's failure must not leave its batch-mates unanswered
            log.exception("answering a request failed")
