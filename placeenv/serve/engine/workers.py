"""The worker pool: every worker (worker.py), a thread per device slot, started together, and a
thread that replaces a worker that dies; the weights each device's workers share; each device's
memory gauge.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
import time

import paddle

import placeenv
import placeenv.sim

from .. import metrics
from .dispatch import DeviceQueue
from ..protocol.errors import StartupError
from ..models.repository import Entry
from .replica import Shares
from .worker import Worker

log = logging.getLogger(__name__)


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


class WorkerPool:
    """All workers, and a thread that replaces dead ones."""

    def __init__(self, queues: dict[str, DeviceQueue], entries: dict[str, Entry], settings, call=None,
                 listed_only: frozenset[str] = frozenset(), served=None) -> None:
        """``entries``: what the workers load at start, each on the workers its instance_group places it on;
        ``call``: the engine's way in for a model's call to another; ``listed_only``: devices whose workers
        load only the models whose instance_group names their kind (the CPU, added for such models);
        ``served``: the engine's, whose generations say what a replacement worker builds."""
        self.queues, self.settings, self.call, self.served = queues, settings, call, served
        self.listed_only = listed_only
        self.workers: list[Worker] = []
        self._stopping = threading.Event()
        self._replacer = threading.Thread(target=self._replace_dead, name="worker-replacer", daemon=True)
        self.shares = Shares()
        self.accelerator_devices = [device for device in queues if device != "cpu"]
        for device, queue in queues.items():
            for i in range(queue.workers):
                held = [e for e in entries.values()
                        if i < e.instances(device, queue.workers, listed_only=device in listed_only)]
                self.workers.append(self._new(f"{device}/{i}", device, queue, held))

    @property
    def accelerators(self) -> int:
        return len(self.accelerator_devices)

    @property
    def layout(self) -> dict[str, int]:
        """Each device's number of workers."""
        return {device: queue.workers for device, queue in self.queues.items()}

    def _new(self, name: str, device: str, queue: DeviceQueue, entries: list[Entry],
             replacement: bool = False) -> Worker:
        return Worker(name, device, queue, entries, self.settings, self.accelerators, self.shares, self.call,
                      self.served, replacement)

    def start(self, timeout: float = 300) -> dict[str, tuple[dict, dict[str, str]]]:
        """Start every worker and wait until each has loaded its models: by worker name, (the replicas it
        built, the models that did not load there and why). ``StartupError`` when one dies first."""
        for device in self.accelerator_devices:
            metrics.DEVICE_MEMORY.labels(device).set_function(functools.partial(device_memory, device))
        for worker in self.workers:
            worker.start()
        deadline = time.monotonic() + timeout
        loaded = {}
        for worker in self.workers:
            try:
                loaded[worker.name] = worker.ready.result(max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                raise StartupError(f"worker {worker.name} did not load its models in {timeout}s") from None
            except BaseException as exc:  # noqa: BLE001 - its thread died before it was ready
                raise StartupError(f"worker {worker.name} failed to start: {exc!r}") from None
        self._replacer.start()
        return loaded

    def ready(self) -> bool:
        return all(w.ready.done() and w.alive() for w in self.workers)

    def _replace_dead(self) -> None:
        while not self._stopping.wait(0.2):
            for i, worker in enumerate(self.workers):
                if worker.alive() or self._stopping.is_set():
                    continue
                log.error("replacing dead worker %s", worker.name)
                metrics.WORKER_RESTARTS.labels(worker.device).inc()
                fresh = self._new(worker.name, worker.device, worker.queue, [], replacement=True)
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
            worker.mailbox.stopping.set()
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            worker.thread.join(max(0.0, deadline - time.monotonic()))
        if self._replacer.is_alive():
            self._replacer.join(1)