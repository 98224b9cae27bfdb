"""A worker: one thread pinned to one device that takes a batch from its device's queue, runs the forward
pass and answers each job once.

The worker is the loop; what it calls lives in units of their own, each without a thread:
``replica.Holding`` (the replicas its slot builds at its start and lets go of at its end),
``batch.run_batch`` (the failure policy), ``calls.Calls`` (the batches in hand, and the model calls
they make), ``forward`` (the pass and its answers), and its ``Mailbox`` (what the engine's control
asks of its thread: a load's replicas built, an unloaded version's finalized). It keeps no list of
what it serves: each job carries its served version (``Job.served``), whose replica it runs on.

With isolation on, a worker calls ``paddle.set_device`` once, when it starts;
placeenv keeps that device private to the thread. With isolation off (the
stock-Paddle demonstration) it calls ``set_device`` before every batch, as
naive code does, and the place checks see other workers' devices.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import paddle

import placeenv

from .. import metrics
from ..models import runtimes
from ..models.base import JIT_LOAD_LOCK, SERVING, Model
from ..models.repository import Entry
from ..protocol.errors import ModelFailed, UnknownModel
from .batch import PlaceChecker, run_batch, step_checker
from .calls import Calls
from .dispatch import DeviceQueue
from .job import Job
from .forward import Batch, answer_batch, forward
from .replica import STOCK_BUILDS, Holding, Shares, Slot

log = logging.getLogger(__name__)

#: The backends whose exports are converted to ONNX, started in the background as a worker starts.
CONVERTED = ("auto", *runtimes.RUNTIMES)


class Mailbox:
    """What the engine's control asks of a worker's thread between two batches (engine/control.py: build a
    version's replica, drop one, hold still while the devices' cache is emptied), each with its future;
    and whether the thread is to stop once idle. ``wake``: the worker's queue's, to look at once."""

    def __init__(self, worker: str, wake: Callable[[], None]) -> None:
        self.worker, self.wake = worker, wake
        self.tasks: collections.deque[tuple[Callable[[], Any], concurrent.futures.Future]] = collections.deque()
        self.lock = threading.Lock()
        self.closed = False  # the thread has ended: a task is refused
        self.stopping = threading.Event()

    def put(self, task: Callable[[], Any]) -> concurrent.futures.Future:
        """Run ``task`` on the worker's thread, between two batches: a replica is built, used and finalized
        by the thread of its device (Paddle's per-thread place, and one user at a time)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self.lock:
            if self.closed:  # its thread has ended: nobody would run it
                future.set_exception(RuntimeError(f"worker {self.worker} has stopped"))
                return future
            self.tasks.append((task, future))
        self.wake()
        return future

    def run_all(self) -> None:
        while self.tasks:
            task, future = self.tasks.popleft()
            try:
                future.set_result(task())
            except BaseException as exc:  # noqa: BLE001 - the control's answer to give
                future.set_exception(exc)

    def close(self) -> None:
        """The thread ends: each task left is answered, any later one refused (the control waits for each)."""
        with self.lock:
            self.closed = True
            while self.tasks:
                self.tasks.popleft()[1].set_exception(RuntimeError(f"worker {self.worker} stopped"))


class Worker:
    """One thread, one device, taking batches of the versions that hold a replica of its name."""

    def __init__(self, name: str, device: str, queue: DeviceQueue, entries: list[Entry], settings,
                 accelerators: int = 1, shares: Shares | None = None, call=None, served=None,
                 replacement: bool = False) -> None:
        """``entries``: what it loads at the service's start; ``served``: the engine's, whose generations
        say what it holds (what it finalizes when it ends; a ``replacement`` of a dead worker refills its
        slot in each version that names it). ``accelerators``: the
        devices of this process that are not the CPU; ``shares``: the weights this device's workers share
        (None: each loads its own); ``call``: the engine's way in for a model's call to another, given the
        generation the batch's request was admitted under (None: refused)."""
        self.name, self.device, self.queue = name, device, queue
        self.holding = Holding(Slot(name, device, placeenv.to_place(device), PlaceChecker(name, device),
                                    settings.isolation == "on", accelerators, shares), entries, served, replacement)
        self.mailbox = Mailbox(name, queue.wake)
        self.calls = Calls(name, device, queue, call, self._batch)
        # Once loaded: (the replicas built, the models that did not load and why); its exception if it died first.
        self.ready: concurrent.futures.Future = concurrent.futures.Future()
        self._up = metrics.WORKER_UP.labels(name, device)
        self.thread = threading.Thread(target=self._run, name=f"worker-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def do(self, task: Callable[[], Any]) -> concurrent.futures.Future:
        """``task`` run on this worker's thread between two batches (``Mailbox.put``)."""
        return self.mailbox.put(task)

    def _run(self) -> None:
        holding, ready = self.holding, self.ready
        try:
            # The thread's first Paddle call, not during another worker's jit.load: stock Paddle (isolation
            # off) gives a new thread the process-wide Tracer of that moment, and jit.load sets it to None
            # hundreds of times (switch_to_static_graph): a thread born then stays in static mode.
            with contextlib.nullcontext() if holding.slot.isolation else STOCK_BUILDS, JIT_LOAD_LOCK:
                paddle.set_device(self.device)  # once: placeenv keeps it to this thread
            runtimes.convert_soon([v.program for e in holding.entries if e.config.backend in CONVERTED
                                   for v in e.versions.values() if v.program is not None], self.device)
            ready.set_result(holding.load())
            self._up.set(1)
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - said; the pool replaces us
            if not ready.done():
                ready.set_exception(exc)
            log.error("worker %s died: %r", self.name, exc)
        finally:
            holding.release()
            self._up.set(0)
            self.mailbox.close()
            jobs = self.calls.jobs()
            if jobs:  # every accepted request gets exactly one answer
                for job in jobs:
                    job.fail(ModelFailed(f"the worker serving this request ({self.name}) died"))
                self.queue.done(len(jobs))
                self.calls.hand.clear()

    def _serve(self) -> None:
        mailbox = self.mailbox
        while True:
            if mailbox.tasks:
                mailbox.run_all()
            batch = self.queue.take_batch(self.name, wait=0.2)
            if batch is None:
                return
            if not batch:
                if mailbox.stopping.is_set():
                    return
                continue
            self._batch(batch)
            # Nothing of the batch stays referenced while the worker waits: an unloaded replica is freed.
            batch = None

    def _batch(self, batch: list[Job]) -> None:
        """Run and answer one batch (``take_batch`` gives only jobs whose served version holds a replica of
        this worker), then count it done. It raises only if the worker is dying: its jobs stay in hand,
        answered by ``_run``."""
        self.calls.hand.append(batch)
        replica = batch[0].served.replicas.get(self.name)
        if replica is None:  # its version retired since the worker took it (a drain that stopped waiting)
            model, version = batch[0].model
            for job in batch:
                job.fail(UnknownModel(f"model {model!r} version {version} was unloaded"))
        else:
            name = replica.context.name
            run_batch(batch, name, functools.partial(self._attempt, replica),
                      metrics.child(metrics.QUEUE_DURATION, name, self.device))
        self.calls.hand.pop()
        self.queue.done(len(batch))

    def _attempt(self, replica: Model, jobs: list[Job]) -> None:
        """One forward pass of ``replica`` over ``jobs``, each answered its rows; raises what the model raised."""
        started = time.perf_counter()
        slot = self.holding.slot
        if not slot.isolation:
            paddle.set_device(self.device)  # what naive code does before each batch
        name = replica.context.name
        check = step_checker(slot.check, jobs)  # a pipeline's steps: a leak is counted for each step too
        check("worker", paddle.get_device())
        examples = sum(job.request.examples for job in jobs)
        metrics.child(metrics.BATCH_SIZE, name).observe(examples)
        keep = frozenset().union(*(job.options.keep for job in jobs))
        stamps: list[float] = []
        token = SERVING.set(self.calls.context(jobs, name))  # what Model.infer and request_parameters read
        try:
            results = forward(replica, [job.inputs for job in jobs], jobs[0].batched, examples, check, keep, stamps)
        finally:
            SERVING.reset(token)
        metrics.child(metrics.COMPUTE_DURATION, name, self.device).observe(time.perf_counter() - started)
        joined, executed, answered = stamps[1] - stamps[0], stamps[2] - stamps[1], stamps[3] - stamps[2]
        answer_batch(jobs, results, Batch(examples, int(joined * 1e9), int(executed * 1e9), int(answered * 1e9)),
                     self.device, self.name)
