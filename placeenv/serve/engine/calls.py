"""A worker's batches in hand, and the calls their models make to others (``Model.infer``).

A worker runs one batch at a time, except while a model of it waits for a call: then it serves its own
queue meanwhile (``serve_until``), of every model it holds but those whose batches are in hand (their
calls wait further down the thread), so it never waits for itself, nor for workers that wait for it.

What a batch's model code reads of its requests (``models/base.py``'s ``Serving``: their parameters, the
engine's way in for a call under the generation they were admitted under, their strictest deadline, the
models they are inside of) is made here (``context``) and set by the worker around the forward pass with
a token pair: a batch served while a call waits sets its own and leaves the caller's as it was.

No thread of its own: the worker's calls it, a test calls it with a queue and plain functions.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable

from ..models.base import NOT_SERVING, Serving
from .batch import failure
from .dispatch import DeviceQueue
from .job import Job


class Calls:
    """The batches a worker has in hand, outermost first (``hand``), and what its models' calls need: its
    ``name``, ``device`` and ``queue``, the engine's way in for a call (``call(generation, ...)``, or None:
    calls are refused), and how it runs and answers a batch it takes while a call waits (``run``, the
    worker's)."""

    def __init__(self, name: str, device: str, queue: DeviceQueue, call: Callable | None,
                 run: Callable[[list[Job]], None]) -> None:
        self.name, self.device, self.queue, self.call, self.run = name, device, queue, call, run
        self.hand: list[list[Job]] = []  # pushed by the worker as it takes a batch, popped once answered

    def jobs(self) -> list[Job]:
        """Every job in hand: a worker that dies answers them."""
        return [job for batch in self.hand for job in batch]

    def holds(self, served) -> bool:
        """Whether this worker holds a replica of ``served`` (a ``ServedVersion``, or None)."""
        return served is not None and self.name in served.replicas

    def context(self, jobs: list[Job], model: str) -> Serving:
        """What ``model``'s code reads while it runs ``jobs`` (one batch: their parameters are equal,
        ``dispatch.batch_key``) on this thread: a call made from it has their strictest deadline."""
        first = jobs[0]
        parameters = first.request.parameters
        if self.call is None:
            return NOT_SERVING if parameters is None else Serving(parameters)
        chain = (*dict.fromkeys(m for job in jobs for m in job.options.chain), model)
        return Serving(parameters, functools.partial(self.call, first.generation), first.loop,
                       min(job.request.deadline for job in jobs), chain, self, threading.get_ident())

    def serve_until(self, answered: concurrent.futures.Future, deadline: float) -> None:
        """While a model on this worker waits for a call (``answered``): run jobs from this worker's queue,
        of every model it holds but those in hand, until the call is answered or the deadline passes."""
        in_hand = frozenset(batch[0].model for batch in self.hand)
        answered.add_done_callback(lambda _: self.queue.wake())
        while not answered.done():
            left = deadline - time.perf_counter()
            if left <= 0:
                return
            batch = self.queue.take_batch(self.name, wait=min(left, 0.05), besides=in_hand)
            if batch is None:  # closed and empty: nothing left to serve
                concurrent.futures.wait([answered], timeout=left)
                return
            if not batch:
                continue
            depth = len(self.hand)
            try:
                self.run(batch)
            except Exception as exc:  # answering the batch failed: its jobs still get their one answer
                for job in batch:
                    job.fail(failure(batch[0].model[0], exc))
                del self.hand[depth:]
                self.queue.done(len(batch))
