"""Requests in flight: jobs, per-device bounded queues, least-loaded dispatch, batching.

The event loop thread submits jobs; worker threads take batches. Every job is
answered exactly once, whichever of worker, timeout or shutdown comes first.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from .. import metrics
from ..protocol.errors import Cancelled, Draining, Overloaded, Timeout

log = logging.getLogger(__name__)


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
    """One accepted request. ``resolve``/``fail`` answer it; the first answer wins.

    What it was admitted as are its fields; the parts of a job queued as parts are derived from it by
    ``dataclasses.replace`` (forward.split), so a new field reaches them. Its state in the engine (where
    it was queued, when it started, whether it is answered) is not: each part has its own."""

    model: tuple[str, int]  # (name, version): what a batch may share, with ``shape``
    inputs: dict[str, Any]  # preprocessed host arrays or CPU tensors [n, ...], in the model's input order
    examples: int  # n; 1 for a model that does not batch
    batched: bool  # the model batches along the first dimension (its outputs are split by rows)
    loop: asyncio.AbstractEventLoop
    future: Future | None  # settled once, on the loop thread: the engine's ``Completion``, or a ``Settled``
    arrived: float
    deadline: float
    # A pipeline's step or a model's call: its ``StepOptions``, one by one.
    keep: frozenset[str] = frozenset()
    prefer: str = ""
    step: tuple[str, str] | None = None
    chain: tuple[str, ...] = ()  # the models this request is inside of, outermost first (calls: no cycle)
    priority: int = 0  # 1: ahead of every normal job in its queue
    # Each input's dims after the first (``shape_key``), and its request's parameters if it sent any
    # (``batch_key``): a batch joins only jobs of one model, one shape and the same parameters.
    shape: Any = None
    parameters: dict[str, Any] | None = None  # its request's parameters for the model (Work.parameters)
    generation: Any = None  # what it was admitted under (engine/generation.py): what its calls are looked up in
    parts: tuple[Job, ...] = field(default=(), init=False)  # its rows queued as jobs, past max_batch_size (split)
    device: str = field(default="", init=False)
    queue: DeviceQueue | None = field(default=None, init=False)  # where it was queued (a cancelled job leaves it)
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
        self.loop.call_soon_threadsafe(self.future.settle, answer, error)
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
        return self.fail(Timeout(f"no answer within {self.deadline - self.arrived:.3g} s"))

    def cancel(self) -> bool:
        """The client left: answer ``Cancelled`` and leave the queue, so no worker runs it (one that took
        it into a batch drops it: it is answered); a worker running it has its answer dropped. Past the
        deadline it is the deadline's answer instead, whoever saw it first. On the loop thread."""
        if self.deadline <= time.perf_counter():
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
        loop.call_soon_threadsafe(_settle_all, settled)


def _settle_all(settled: list) -> None:
    for future, answer in settled:
        try:
            future.settle(answer, None)
        except Exception:  # one answer's failure must not leave its batch-mates unanswered
            log.exception("answering a request failed")


#: A gathering worker looks at the queue this many times over a batch's delay, and sends the batch
#: as soon as a look finds that no job of its model joined since the last (or when full, or at the
#: delay). A short look does not cut a burst short: while the event loop is still handing in
#: requests it holds the GIL, and the worker cannot look until the loop lets go of it.
QUIET_STEPS = 20


class Clock:
    """The time a queue reads and waits by: ``time.perf_counter`` and a condition's own timed wait.

    A test passes its own (same two methods) to drive a batch's delay and looks by hand instead of
    racing the scheduler."""

    @staticmethod
    def now() -> float:
        return time.perf_counter()

    @staticmethod
    def wait(condition: threading.Condition, timeout: float) -> bool:
        """``condition.wait(timeout)``: called with ``condition`` held; True if notified."""
        return condition.wait(timeout)


REAL_CLOCK = Clock()


class Gathering:
    """A worker waiting for more of a batch: the model and shape it takes, the queue length that may fill
    the batch, and the jobs it could take offered meanwhile (another model's or shape's arrivals do not
    keep it waiting). Compared by identity: each worker removes its own."""

    __slots__ = ("kind", "fill_at", "arrived")

    def __init__(self, kind: tuple, fill_at: int) -> None:
        self.kind, self.fill_at, self.arrived = kind, fill_at, 0


class DeviceQueue:
    """Bounded FIFO of jobs for one device, shared by that device's workers; high-priority jobs first.

    The high-priority jobs are the first ``_high`` of the queue, in their arrival order: a job of
    priority 1 goes in after them, ahead of every normal job (two levels, as Triton's). A batch is
    still one model's jobs, taken in queue order."""

    def __init__(self, device: str, capacity: int, workers: int, clock: Clock = REAL_CLOCK) -> None:
        self.device, self.capacity, self.workers = device, capacity, workers
        self.clock = clock  # what a batch's delay and an idle worker's wait are timed by
        self.models: set[tuple[str, int]] = set()  # what some worker of this device holds
        self.uniform = True  # every worker holds every model: one wake-up per job is enough
        self._jobs: collections.deque[Job] = collections.deque()
        self._high = 0  # the high-priority jobs, at the head of _jobs
        # One lock, two kinds of waiter: workers with nothing to do (woken by each job) and workers
        # holding a part-full batch for its delay (woken only once enough is queued to fill it): waking
        # it for every job costs the event loop a wake-up per request (docs/benchmarks.md, Front-end ceiling).
        self._cond = threading.Condition()
        self._more = threading.Condition(self._cond._lock)  # type: ignore[attr-defined]
        self._idle = 0  # workers waiting on _cond
        self._helping = 0  # of them, workers waiting for a call, serving only some models meanwhile
        self._gathering: list[Gathering] = []  # the workers waiting for more of a batch
        self.busy = 0  # jobs taken by workers, not yet answered
        self.closed = False
        metrics.QUEUE_DEPTH.labels(device).set_function(self.__len__)  # read at each scrape

    def load(self) -> float:
        return (len(self._jobs) + self.busy) / self.workers

    def __len__(self) -> int:
        return len(self._jobs)

    def offer(self, job: Job) -> bool:
        with self._cond:
            if self.closed or len(self._jobs) >= self.capacity:
                return False
            job.device, job.queue, job.enqueued = self.device, self, time.perf_counter()
            if job.priority:
                self._jobs.insert(self._high, job)
                self._high += 1
            else:
                self._jobs.append(job)
            fill_at = None
            if self._gathering:
                kind = (job.model, job.shape)
                for gathering in self._gathering:
                    if gathering.kind == kind:
                        gathering.arrived += 1
                        fill_at = gathering.fill_at if fill_at is None else min(fill_at, gathering.fill_at)
            if fill_at is not None:
                # A worker gathering a batch of this model and shape takes the job when its delay ends: no
                # one to wake, unless the queue may now fill that batch.
                if len(self._jobs) >= fill_at:
                    self._more.notify_all()
            elif self._idle:
                if self.uniform and not self._helping:
                    self._cond.notify()
                else:
                    self._cond.notify_all()  # the one woken might not take this model
            return True

    def take_batch(self, limits: dict[tuple[str, int], tuple[int, float]], wait: float,
                   only: bool = False) -> list[Job] | None:
        """The first job of a model in ``limits``, and more of that model and shape (``Job.shape``) up to its
        (max examples, max delay): a batch waits for more until it is full, its delay is up, or
        ``max delay / QUIET_STEPS`` passes with no job it could take joining the queue; max examples 0
        takes one job. Jobs of another shape keep their place in line and form batches of their own.
        ``only``: ``limits`` are some of the worker's models (a worker waiting for a model's call), not all
        of them.

        Returns None when closed and empty (the worker should exit), [] on an idle ``wait``.
        """
        first_of = self._first_of if not only else lambda held: self._take(lambda job: job.model in held)
        with self._cond:
            first = first_of(limits)
            if first is None:
                if self.closed and not self._jobs:
                    return None
                self._idle += 1
                self._helping += only
                try:
                    self.clock.wait(self._cond, wait)
                finally:
                    self._idle -= 1
                    self._helping -= only
                first = first_of(limits)
                if first is None:
                    return None if self.closed and not self._jobs else []
            max_examples, max_delay = limits[first.model]
            batch, examples = [first], first.examples
            # Wait for more only under load (others were queued too): an idle
            # service answers a lone request at once instead of paying the delay.
            until = self.clock.now() + (max_delay if self._jobs else 0.0)
            arrived = None  # jobs it could take offered during its last wait; None before the first
            kind = (first.model, first.shape)
            while examples < max_examples:
                nxt = self._next_of(first, max_examples - examples)
                if nxt is not None:
                    batch.append(nxt)
                    examples += nxt.examples
                    continue
                left = until - self.clock.now()
                if left <= 0 or self.closed:
                    break
                if arrived == 0:
                    # No job it could take joined during the last wait: the burst is over, and holding
                    # the batch longer would leave the device idle (docs/benchmarks.md, "Batch delay").
                    break
                # Jobs are 1+ examples each: this many queued may fill the batch.
                gathering = Gathering(kind, len(self._jobs) + max_examples - examples)
                self._gathering.append(gathering)
                try:
                    self.clock.wait(self._more, min(left, max_delay / QUIET_STEPS))
                finally:
                    self._gathering.remove(gathering)
                arrived = gathering.arrived
            self.busy += len(batch)
            return batch

    def _first_of(self, held) -> Job | None:
        if self.uniform:
            # A worker's ``held`` may be older than the queue's models for a moment (a load swaps both,
            # while the worker waits here with the dict it read before): it takes nothing it cannot run.
            if not self._jobs or self._jobs[0].model not in held:
                return None
            if self._high:
                self._high -= 1
            return self._jobs.popleft()
        return self._take(lambda job: job.model in held)

    def withdraw(self, models: set[tuple[str, int]]) -> list[Job]:
        """Take every job of ``models`` out of the queue: versions no worker serves any more (an unload
        that stopped waiting, a job answered at its deadline but still queued). Their owner answers them."""
        with self._cond:
            gone = [job for job in self._jobs if job.model in models]
            if gone:
                high = list(self._jobs)[:self._high]
                self._jobs = collections.deque(job for job in self._jobs if job.model not in models)
                self._high -= sum(1 for job in high if job.model in models)
            return gone

    def _next_of(self, first: Job, room: int) -> Job | None:
        # Same model and shape only, in arrival order; other models and shapes keep their place in line.
        model, shape = first.model, first.shape
        return self._take(lambda job: job.model == model and job.shape == shape and job.examples <= room,
                          within=64)

    def _take(self, wanted, within: int | None = None) -> Job | None:
        """The first job ``wanted`` accepts, among the first ``within`` (all when None), out of the queue."""
        for i, job in enumerate(self._jobs):
            if within is not None and i > within:
                break
            if wanted(job):
                del self._jobs[i]
                if i < self._high:
                    self._high -= 1
                return job
        return None

    def discard(self, job: Job) -> None:
        """Take ``job`` out of the queue, if it is still there (a cancelled job)."""
        with self._cond:
            for i, queued in enumerate(self._jobs):
                if queued is job:
                    del self._jobs[i]
                    if i < self._high:
                        self._high -= 1
                    return

    def done(self, count: int) -> None:
        with self._cond:
            self.busy -= count

    def wake(self) -> None:
        """Wake the workers waiting for a job: one waiting for a call (``Calls.serve_until``) looks again."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()
            self._more.notify_all()

    def take_unstarted(self) -> list[Job]:
        with self._cond:
            jobs, self._jobs, self._high = list(self._jobs), collections.deque(), 0
            return jobs


#: The answers of a request the engine does not take.
STOPPING = "the service is shutting down"
FULL = "every device queue serving this model is full; retry later"


class Dispatcher:
    """The one place that decides whether the engine takes a request: refused once closed (503
    Draining) or when no queue serving its model has room (503 Overloaded); else sent to the
    least-loaded device's queue."""

    def __init__(self, queues: dict[str, DeviceQueue]) -> None:
        self.queues = queues
        self._turns: dict[tuple[str, int], int] = {}  # each model's last turn (least-loaded ties)
        self.closed = False  # the engine is stopping: no new requests (their steps and calls still run)

    def check_open(self) -> None:
        """Draining once closed: a request to a pipeline meets this before its first step."""
        if self.closed:
            raise Draining(STOPPING)

    def admit(self, model: tuple[str, int], step: bool = False) -> None:
        """Refuse now what ``submit`` would refuse, before CPU is spent on preprocessing. ``step``: a
        pipeline's step or a model's call, work of a request already taken, which stopping does not refuse."""
        if not step:
            self.check_open()
        if not any(len(q) < q.capacity and not q.closed and model in q.models for q in self.queues.values()):
            raise Overloaded(FULL)

    def submit(self, job: Job) -> DeviceQueue:
        if self.closed and job.step is None:
            raise Draining(STOPPING)
        preferred = self.queues.get(job.prefer)
        # A step whose tensors are on a device runs there if it can: moving them costs copies.
        if preferred is not None and job.model in preferred.models and preferred.offer(job):
            return preferred
        # Each model's own turns: a pipeline's other steps, queued in between, must not keep its turn
        # on one device.
        turn = self._turns[job.model] = self._turns.get(job.model, -1) + 1
        queues = [q for q in self.queues.values() if job.model in q.models]
        # Least loaded first; equal loads take turns, so idle devices all get work.
        order = sorted(range(len(queues)), key=lambda i: (queues[i].load(), (i - turn) % len(queues)))
        for queue in (queues[i] for i in order):
            if queue.offer(job):
                return queue
        raise Overloaded(FULL)

    def capacity(self, max_batch: int) -> int:
        """Requests the engine holds at most: every queue full, every worker on a batch of ``max_batch``.
        A front end holds no more for it (process/link.py), so a stalled engine cannot grow one."""
        return sum(q.capacity + q.workers * max_batch for q in self.queues.values())

    def close(self) -> None:
        self.closed = True

    def fail_unstarted(self) -> None:
        """Answer every job still queued (the workers have stopped) with 503 Draining."""
        for queue in self.queues.values():
            for job in queue.take_unstarted():
                job.fail(Draining(STOPPING))
