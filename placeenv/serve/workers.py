"""Worker threads: each pins one device once, owns model replicas there, serves batches.

With isolation on, a worker calls ``paddle.set_device`` once, when it starts;
placeenv keeps that device private to the thread. With isolation off (the
stock-Paddle demonstration) it calls ``set_device`` before every batch, as
naive code does, and the place checks see other workers' devices.
"""

from __future__ import annotations

import logging
import threading
import time

import paddle

import placeenv
from .models import registry
from .models.base import move_to

from . import metrics
from .dispatch import DeviceQueue, Job

log = logging.getLogger(__name__)


class ModelError(Exception):
    """The model raised while serving a request (answered 500)."""


class WorkerDied(Exception):
    """The worker thread serving the request died (answered 500)."""


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
    """One thread, one device, one replica of each model."""

    def __init__(self, name: str, device: str, queue: DeviceQueue, model_names: list[str], settings) -> None:
        self.name, self.device, self.queue = name, device, queue
        self.model_names, self.settings = model_names, settings
        self.isolation = settings.isolation == "on"
        self.place = placeenv.to_place(device)
        self.check = PlaceChecker(name, device)
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.current: list[Job] = []
        self._stop = threading.Event()
        self._up = metrics.WORKER_UP.labels(name, device)
        self.thread = threading.Thread(target=self._run, name=f"worker-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            paddle.set_device(self.device)  # once: placeenv keeps it to this thread
            replicas = {}
            for name in self.model_names:
                replica = registry.create(name)
                stray = replica.initialize(self.place, strict=self.isolation)
                self.check("load", next(iter(stray.values()), self.device))
                replicas[name] = replica
            self.ready.set()
            self._up.set(1)
            self._serve(replicas)
            for replica in replicas.values():
                replica.finalize()
        except BaseException as exc:  # noqa: BLE001 - recorded; the supervisor replaces us
            self.error = exc
            log.error("worker %s died: %r", self.name, exc)
        finally:
            self._up.set(0)
            if self.current:  # every accepted request gets exactly one answer
                for job in self.current:
                    job.fail(WorkerDied(f"worker {self.name} died"))
                self.queue.done(len(self.current))
                self.current = []

    def _serve(self, replicas) -> None:
        settings = self.settings
        delay = settings.max_batch_delay_ms / 1000
        while True:
            batch = self.queue.take_batch(settings.max_batch_size, delay, wait=0.2)
            if batch is None:
                return
            if not batch:
                if self._stop.is_set():
                    return
                continue
            self.current = batch
            self._process(replicas[batch[0].model], batch)  # answers every job, or raises only if dying
            self.queue.done(len(batch))
            self.current = []

    def _process(self, replica, jobs: list[Job]) -> None:
        now = time.perf_counter()
        live = [job for job in jobs if not job.answered and job.deadline > now]
        for job in jobs:
            if job not in live and not job.answered:
                job.fail(TimeoutError("request timed out in the queue"))
        if not live:
            return
        if not self.isolation:
            paddle.set_device(self.device)  # what naive code does before each batch
        queue_duration = metrics.child(metrics.QUEUE_DURATION, replica.name, self.device)
        for job in live:
            job.started = now
            queue_duration.observe(now - job.enqueued)
        try:
            outputs = self._forward(replica, live)
        except Exception as exc:  # noqa: BLE001 - a model's failure is the request's 500
            if len(live) > 1:  # one bad request must not fail its batch-mates
                for job in live:
                    self._process_one(replica, job)
                return
            live[0].fail(ModelError(f"{type(exc).__name__}: {exc}"))
            return
        self._answer(live, outputs)

    def _process_one(self, replica, job: Job) -> None:
        try:
            outputs = self._forward(replica, [job])
        except Exception as exc:  # noqa: BLE001
            job.fail(ModelError(f"{type(exc).__name__}: {exc}"))
            return
        self._answer([job], outputs)

    def _forward(self, replica, jobs: list[Job]):
        started = time.perf_counter()
        self.check("worker", paddle.get_device())
        examples = sum(job.examples for job in jobs)
        metrics.child(metrics.BATCH_SIZE, replica.name).observe(examples)
        if len(jobs) == 1:
            host = jobs[0].inputs
        else:
            # One copy on the host (the inputs' place): 0.8 ms for 8 mobilenet examples where
            # .numpy() + np.concatenate + a new tensor took 4.3, holding the GIL throughout.
            host = paddle.concat([job.inputs for job in jobs])
        batch = move_to(host, self.place)
        self.check("batch", placeenv.device_name(batch.place))
        out = replica.execute(batch)
        self.check("output", placeenv.device_name(out.place))
        results = replica.postprocess(out)
        compute = metrics.child(metrics.COMPUTE_DURATION, replica.name, self.device)
        compute.observe(time.perf_counter() - started)
        return results, examples

    def _answer(self, jobs: list[Job], outputs) -> None:
        results, examples = outputs
        offset = 0
        for job in jobs:
            job.resolve({
                "outputs": results[offset:offset + job.examples],
                "device": self.device,
                "worker": self.name,
                "batch_size": examples,
                "compute_started": job.started,
            })
            offset += job.examples


class WorkerPool:
    """All workers, and a supervisor thread that replaces dead ones."""

    def __init__(self, queues: dict[str, DeviceQueue], model_names: list[str], settings) -> None:
        self.queues, self.model_names, self.settings = queues, model_names, settings
        self.workers: list[Worker] = []
        self._stopping = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name="worker-supervisor", daemon=True)
        for device, queue in queues.items():
            for i in range(settings.workers_per_device):
                self.workers.append(self._new(f"{device}/{i}", device, queue))

    def _new(self, name: str, device: str, queue: DeviceQueue) -> Worker:
        return Worker(name, device, queue, self.model_names, self.settings)

    def start(self, timeout: float = 300) -> None:
        for worker in self.workers:
            worker.start()
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            while not worker.ready.wait(0.1):
                if not worker.alive():
                    raise RuntimeError(f"worker {worker.name} failed to start: {worker.error!r}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker {worker.name} did not load its models in {timeout}s")
        self._supervisor.start()

    def ready(self) -> bool:
        return all(w.ready.is_set() and w.alive() for w in self.workers)

    def _supervise(self) -> None:
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
        """Let workers finish what they hold, then join them."""
        self._stopping.set()
        for queue in self.queues.values():
            queue.close()
        for worker in self.workers:
            worker.stop()
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            worker.thread.join(max(0.0, deadline - time.monotonic()))
        if self._supervisor.is_alive():
            self._supervisor.join(1)
