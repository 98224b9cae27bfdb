"""Requests in flight: jobs, per-device bounded queues, least-loaded dispatch, batching.

The event loop thread submits jobs; worker threads take batches. Every job is
answered exactly once, whichever of worker, timeout or shutdown comes first.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from . import metrics
from .errors import Draining, Overloaded


@dataclass(eq=False)
class Job:
    """One accepted request. ``resolve``/``fail`` answer it; the first answer wins."""

    model: tuple[str, int]  # (name, version): what a batch may share
    inputs: dict[str, Any]  # preprocessed CPU tensors [n, ...], in the model's input order
    examples: int  # n; 1 for a model that does not batch
    batched: bool  # the model batches along the first dimension (its outputs are split by rows)
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    arrived: float
    deadline: float
    device: str = ""
    enqueued: float = 0.0
    started: float = 0.0
    _answered: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _answer(self, setter, value) -> bool:
        with self._lock:
            if self._answered:
                return False
            self._answered = True
        self.loop.call_soon_threadsafe(_settle, self.future, setter, value)
        return True

    def resolve(self, value) -> bool:
        return self._answer("set_result", value)

    def fail(self, error: BaseException) -> bool:
        return self._answer("set_exception", error)

    @property
    def answered(self) -> bool:
        return self._answered


def _settle(future: asyncio.Future, setter: str, value) -> None:
    if not future.done():  # the waiter may have been cancelled (client gone)
        getattr(future, setter)(value)


class DeviceQueue:
    """Bounded FIFO of jobs for one device, shared by that device's workers."""

    def __init__(self, device: str, capacity: int, workers: int) -> None:
        self.device, self.capacity, self.workers = device, capacity, workers
        self.models: set[tuple[str, int]] = set()  # what some worker of this device holds
        self.uniform = True  # every worker holds every model: one wake-up per job is enough
        self._jobs: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self.busy = 0  # jobs taken by workers, not yet answered
        self.closed = False
        self._depth = metrics.QUEUE_DEPTH.labels(device)

    def load(self) -> float:
        return (len(self._jobs) + self.busy) / self.workers

    def __len__(self) -> int:
        return len(self._jobs)

    def offer(self, job: Job) -> bool:
        with self._cond:
            if self.closed or len(self._jobs) >= self.capacity:
                return False
            job.device, job.enqueued = self.device, time.perf_counter()
            self._jobs.append(job)
            self._depth.set(len(self._jobs))
            if self.uniform:
                self._cond.notify()
            else:
                self._cond.notify_all()  # the one woken might not hold this model
            return True

    def take_batch(self, limits: dict[tuple[str, int], tuple[int, float]], wait: float) -> list[Job] | None:
        """The first job of a model in ``limits``, and more of that model up to its (max examples,
        max delay): a model's batch waits ``max delay`` for more; max examples 0 takes one job.

        Returns None when closed and empty (the worker should exit), [] on an idle ``wait``.
        """
        with self._cond:
            first = self._first_of(limits)
            if first is None:
                if self.closed and not self._jobs:
                    return None
                self._cond.wait(wait)
                first = self._first_of(limits)
                if first is None:
                    return None if self.closed and not self._jobs else []
            max_examples, max_delay = limits[first.model]
            batch, examples = [first], first.examples
            # Wait for more only under load (others were queued too): an idle
            # service answers a lone request at once instead of paying the delay.
            until = time.perf_counter() + (max_delay if self._jobs else 0.0)
            while examples < max_examples:
                nxt = self._next_of(first.model, max_examples - examples)
                if nxt is not None:
                    batch.append(nxt)
                    examples += nxt.examples
                    continue
                left = until - time.perf_counter()
                if left <= 0 or self.closed:
                    break
                self._cond.wait(left)
            self.busy += len(batch)
            self._depth.set(len(self._jobs))
            return batch

    def _first_of(self, held) -> Job | None:
        if self.uniform:
            return self._jobs.popleft() if self._jobs else None
        return self._take(lambda job: job.model in held)

    def _next_of(self, model: tuple[str, int], room: int) -> Job | None:
        # Same model only, in arrival order; other models keep their place in line.
        return self._take(lambda job: job.model == model and job.examples <= room, within=64)

    def _take(self, wanted, within: int | None = None) -> Job | None:
        """The first job ``wanted`` accepts, among the first ``within`` (all when None), out of the queue."""
        for i, job in enumerate(self._jobs):
            if within is not None and i > within:
                break
            if wanted(job):
                del self._jobs[i]
                return job
        return None

    def done(self, count: int) -> None:
        with self._cond:
            self.busy -= count

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def drain_unstarted(self) -> list[Job]:
        with self._cond:
            jobs, self._jobs = list(self._jobs), collections.deque()
            self._depth.set(0)
            return jobs


class Dispatcher:
    """Sends each job to the least-loaded device that has room."""

    def __init__(self, queues: dict[str, DeviceQueue]) -> None:
        self.queues = queues
        self._tiebreak = itertools.count()
        self.draining = False

    def submit(self, job: Job) -> DeviceQueue:
        if self.draining:
            raise Draining("the service is shutting down")
        turn = next(self._tiebreak)
        queues = [q for q in self.queues.values() if job.model in q.models]
        # Least loaded first; equal loads take turns, so idle devices all get work.
        order = sorted(range(len(queues)), key=lambda i: (queues[i].load(), (i - turn) % len(queues)))
        for queue in (queues[i] for i in order):
            if queue.offer(job):
                return queue
        raise Overloaded("every device queue serving this model is full; retry later")

    def has_room(self, model: tuple[str, int]) -> bool:
        """Whether some queue could take a job for ``model`` now (checked before preprocessing, to refuse early)."""
        return any(len(q) < q.capacity and not q.closed and model in q.models for q in self.queues.values())

