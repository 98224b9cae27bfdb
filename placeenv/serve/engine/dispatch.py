"""Requests in flight: per-device bounded queues, least-loaded dispatch, batching.

The event loop thread submits jobs (job.py); worker threads take batches. Every job is
answered exactly once, whichever of worker, timeout or shutdown comes first.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from .. import metrics
from ..protocol.errors import Draining, Overloaded
from .job import Job

log = logging.getLogger(__name__)


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
    """A worker waiting for more of a batch: the served version and shape it takes, the queue length that
    may fill the batch, and the jobs it could take offered meanwhile (another model's or shape's arrivals do
    not keep it waiting). Compared by identity: each worker removes its own."""

    __slots__ = ("kind", "fill_at", "arrived")

    def __init__(self, kind: tuple, fill_at: int) -> None:
        self.kind, self.fill_at, self.arrived = kind, fill_at, 0


class DeviceQueue:
    """Bounded FIFO of jobs for one device, shared by that device's workers; high-priority jobs first.

    The high-priority jobs are the first ``_high`` of the queue, in their arrival order: a job of
    priority 1 goes in after them, ahead of every normal job (two levels, as Triton's). A batch is
    still one served version's jobs, taken in queue order. Which worker takes a job, and its batch's
    limits, the job's served version says (``Job.served``): the queue keeps no list of models."""

    def __init__(self, device: str, capacity: int, workers: int, clock: Clock = REAL_CLOCK) -> None:
        self.device, self.capacity, self.workers = device, capacity, workers
        self.clock = clock  # what a batch's delay and an idle worker's wait are timed by
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
            if job.request.priority:
                self._jobs.insert(self._high, job)
                self._high += 1
            else:
                self._jobs.append(job)
            fill_at = None
            if self._gathering:
                kind = (job.served.replicas, job.shape)
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
                if self.device in job.served.everywhere and not self._helping:
                    self._cond.notify()  # every worker here takes it: one is enough
                else:
                    self._cond.notify_all()  # the one woken might not take this model
            return True

    def take_batch(self, worker: str, wait: float, besides: frozenset = frozenset()) -> list[Job] | None:
        """The first job ``worker`` holds a replica for (``Job.served``), and more of that served version and
        shape (``Job.shape``) up to its limits (max examples, max delay): a batch waits for more until it is
        full, its delay is up, or ``max delay / QUIET_STEPS`` passes with no job it could take joining the
        queue; max examples 0 takes one job. Jobs of another shape keep their place in line and form batches
        of their own. ``besides``: models it does not take now (a worker waiting for a model's call: those
        whose batches it has in hand).

        Returns None when closed and empty (the worker should exit), [] on an idle ``wait``.
        """
        helping = bool(besides)
        with self._cond:
            first = self._first_of(worker, besides)
            if first is None:
                if self.closed and not self._jobs:
                    return None
                self._idle += 1
                self._helping += helping
                try:
                    self.clock.wait(self._cond, wait)
                finally:
                    self._idle -= 1
                    self._helping -= helping
                first = self._first_of(worker, besides)
                if first is None:
                    return None if self.closed and not self._jobs else []
            max_examples, max_delay = first.served.limits
            batch, examples = [first], first.request.examples
            # Wait for more only under load (others were queued too): an idle
            # service answers a lone request at once instead of paying the delay.
            until = self.clock.now() + (max_delay if self._jobs else 0.0)
            arrived = None  # jobs it could take offered during its last wait; None before the first
            kind = (first.served.replicas, first.shape)
            while examples < max_examples:
                nxt = self._next_of(first, max_examples - examples)
                if nxt is not None:
                    batch.append(nxt)
                    examples += nxt.request.examples
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

    def _first_of(self, worker: str, besides: frozenset) -> Job | None:
        jobs = self._jobs
        if jobs and worker in jobs[0].served.replicas and not besides:  # most often: the head is its
            if self._high:
                self._high -= 1
            return jobs.popleft()
        return self._take(lambda job: worker in job.served.replicas and job.model not in besides)

    def withdraw(self, replicas: set) -> list[Job]:
        """Take every job run on ``replicas`` (served versions' ``Slots``) out of the queue: versions no
        generation serves any more (an unload that stopped waiting, a job answered at its deadline but still
        queued). Their owner answers them."""
        with self._cond:
            gone = [job for job in self._jobs if job.served.replicas in replicas]
            if gone:
                high = list(self._jobs)[:self._high]
                self._jobs = collections.deque(job for job in self._jobs if job.served.replicas not in replicas)
                self._high -= sum(1 for job in high if job.served.replicas in replicas)
            return gone

    def _next_of(self, first: Job, room: int) -> Job | None:
        # Jobs run on the same replicas (a version, under whichever generations serve it), of the same
        # shape, in arrival order; others keep their place in line.
        replicas, shape = first.served.replicas, first.shape
        return self._take(lambda job: job.served.replicas is replicas and job.shape == shape
                          and job.request.examples <= room, within=64)

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

    def admit(self, served, step: bool = False) -> None:
        """Refuse now what ``submit`` would refuse of a job of ``served`` (a ``ServedVersion``), before CPU is
        spent on preprocessing. ``step``: a pipeline's step or a model's call, work of a request already
        taken, which stopping does not refuse."""
        if not step:
            self.check_open()
        queues = self.queues
        if not any(len(q) < q.capacity and not q.closed for d in served.devices if (q := queues.get(d)) is not None):
            raise Overloaded(FULL)

    def submit(self, job: Job) -> DeviceQueue:
        if self.closed and job.options.step is None:
            raise Draining(STOPPING)
        devices = job.served.devices
        # A step whose tensors are on a device runs there if it can: moving them costs copies.
        prefer = job.options.prefer
        if prefer in devices and self.queues[prefer].offer(job):
            return self.queues[prefer]
        # Each model's own turns: a pipeline's other steps, queued in between, must not keep its turn
        # on one device.
        turn = self._turns[job.model] = self._turns.get(job.model, -1) + 1
        queues = [q for d, q in self.queues.items() if d in devices]
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
