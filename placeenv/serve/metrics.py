"""Every Prometheus metric the service exports, in one place.

Base units, ``_total`` on counters, low-cardinality labels only: model,
device, worker, stage, status, and, across processes, frontend.

Two modes, chosen once, at import, by whether ``PROMETHEUS_MULTIPROC_DIR`` is
set. prometheus_client reads the same variable when it is first imported, so
whoever starts the process sets it in the process's environment, never later:

* **single process** (unset; ``--frontends 0``): ``/metrics`` is this process's
  default registry, with the process and platform collectors.
* **multiprocess** (set by the supervisor for the engine and its front ends):
  every metric is a prometheus_client metric whose values live in
  files under that directory, and ``exposition()`` merges the files of every
  process, so any front end's ``/metrics`` shows the whole service. The names,
  types, buckets and labels are the same, plus a ``frontend`` label on the
  request path's series (``PLACEENV_FRONTEND_INDEX``; "engine" where unset).
  Each gauge's ``multiprocess_mode`` says how the processes' values combine.
  The process and platform collectors are not merged: they would describe
  whichever front end happened to answer the scrape.

In both modes the event loop counts its requests in ``LoopMetrics``'s plain
numbers, the cheapest updates; in multiprocess mode ``SharedSeries`` copies
them to the directory from a writer thread. Callers use one surface in both
modes: ``ON_LOOP.count()``, ``ON_LOOP.observe()``, ``ON_LOOP.in_flight``, the
module-level metrics with ``child()``, and ``exposition()``,
``process_dead()`` and ``families()``.
"""

from __future__ import annotations

import atexit
import bisect
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics,
    generate_latest, values,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

log = logging.getLogger(__name__)

#: The directory every process of the service writes its metric files to; None in single-process mode.
MULTIPROCESS_DIR: str | None = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
if (MULTIPROCESS_DIR is not None) != bool(getattr(values.ValueClass, "_multiprocess", False)):
    # prometheus_client chose where values live when it was imported; a variable set or cleared
    # after that would leave this process's series out of the merge, silently.
    raise RuntimeError("PROMETHEUS_MULTIPROC_DIR changed after prometheus_client was imported: set it in "
                       "the process's environment before it starts")
#: This process's value of the ``frontend`` label (multiprocess mode only).
FRONTEND = os.environ.get("PLACEENV_FRONTEND_INDEX", "engine")

disable_created_metrics()  # *_created series double the exposition for no use here

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# The request path's series, (name, help, labels): one definition for both modes' classes.
REQUESTS = ("inference_requests", "Inference requests answered (/predict, v2 REST and gRPC), by model, the "
            "device that answered and outcome.", ("model", "device", "status"))
REQUEST_DURATION = ("inference_request_duration_seconds", "Time from arrival to answer of inference requests "
                    "answered with a result (every protocol).", ("model", "device"))
PREPROCESS_DURATION = ("inference_preprocess_duration_seconds", "Time from a request's arrival to the end of "
                       "its CPU preprocessing, reading the body and the hop to the engine included.",
                       ("model",))
REFUSAL_DURATION = ("inference_refusal_duration_seconds", "Time from arrival to answer of inference requests "
                    "read and then turned away with Retry-After (overloaded, draining, engine unavailable), by "
                    "outcome: how fast the service sheds load.", ("model", "status"))
IN_FLIGHT = ("inference_in_flight_requests", "Inference requests handed to the engine and not yet answered.", ())


@functools.lru_cache(maxsize=None)
def child(metric, *labels: str):
    """``metric.labels(*labels)``, looked up once: ``labels()`` takes a lock on every call, and a cached
    lookup is the cache's own C call, with no Python frame (a batch makes several).

    For the request path, whose label values are known models, devices, stages
    and outcomes, so the cache is bounded. Two threads racing on a first lookup
    both get the one child Prometheus keeps for those labels.
    """
    return metric.labels(*labels)


class LoopMetrics(Collector):
    """The request path's own metrics, kept as plain numbers by the event loop thread.

    Every request counted its answer, observed two durations and moved the in-flight gauge:
    seven prometheus_client updates, each taking a lock and checking its arguments (a share of
    a small request's event-loop time: docs/benchmarks.md). Here one thread writes and, since ``/metrics``
    is served on that same loop, the same thread reads: no lock is needed (in multiprocess mode the
    writer thread reads too, through copies made in one step). The series are the same as
    prometheus_client's Counter, Histogram and Gauge would export.
    """

    def __init__(self) -> None:
        self.answered: dict[tuple[str, str, str], int] = {}  # (model, device, status) -> count
        self.durations: dict[tuple[str, str], list] = {}  # (model, device) -> [bucket counts..., sum]
        self.preprocess: dict[tuple[str], list] = {}  # (model,) -> [bucket counts..., sum]
        self.refusals: dict[tuple[str, str], list] = {}  # (model, status) -> [bucket counts..., sum]
        self.in_flight = 0

    def count(self, model: str, device: str, status: str) -> None:
        key = (model, device, status)
        self.answered[key] = self.answered.get(key, 0) + 1

    @staticmethod
    def observe(histograms: dict, key: tuple, seconds: float) -> None:
        found = histograms.get(key)
        if found is None:
            found = histograms[key] = [0] * (len(LATENCY_BUCKETS) + 1) + [0.0]
        found[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1  # the first bound >= seconds: le
        found[-1] += seconds

    def collect(self) -> Iterator:
        name, help_text, labels = REQUESTS
        requests = CounterMetricFamily(name, help_text, labels=labels)
        for key, value in list(self.answered.items()):
            requests.add_metric(key, value)
        yield requests
        for (name, help_text, labels), histograms in ((REQUEST_DURATION, self.durations),
                                                      (PREPROCESS_DURATION, self.preprocess),
                                                      (REFUSAL_DURATION, self.refusals)):
            family = HistogramMetricFamily(name, help_text, labels=labels)
            for key, found in list(histograms.items()):
                counts, total = found[:-1], found[-1]
                cumulative = [sum(counts[:i + 1]) for i in range(len(counts))]
                bounds = [floatToGoString(b) for b in LATENCY_BUCKETS] + ["+Inf"]
                family.add_metric(list(key), list(zip(bounds, cumulative)), total)
            yield family
        name, help_text, _ = IN_FLIGHT
        yield GaugeMetricFamily(name, help_text, value=self.in_flight)

    def describe(self) -> list:
        return list(self.collect())


class SharedSeries:
    """Multiprocess mode: ``LoopMetrics``'s numbers copied into prometheus_client metrics, whose values
    live in the shared directory, where ``MultiProcessCollector`` adds up every process's.

    The event loop keeps counting into ``LoopMetrics``: a metric's update in this mode also writes
    its file under a process-wide lock, several times the plain numbers' cost on every request
    (benchmarks/metrics_cost.py). ``flush`` writes what changed since the last one, from the writer
    thread every ``WRITE_S``, before this process serves ``/metrics``, and at exit; so another
    process's scrape sees this one's series at most ``WRITE_S`` old. Each series gains the
    ``frontend`` label, so the merged view tells the front ends apart.
    """

    def __init__(self, source: LoopMetrics, frontend: str, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.source, self.frontend = source, frontend
        name, help_text, labels = REQUESTS
        self.requests = Counter(name, help_text, [*labels, "frontend"], registry=registry)
        self.durations = Histogram(*REQUEST_DURATION[:2], [*REQUEST_DURATION[2], "frontend"],
                                   buckets=LATENCY_BUCKETS, registry=registry)
        self.preprocess = Histogram(*PREPROCESS_DURATION[:2], [*PREPROCESS_DURATION[2], "frontend"],
                                    buckets=LATENCY_BUCKETS, registry=registry)
        self.refusals = Histogram(*REFUSAL_DURATION[:2], [*REFUSAL_DURATION[2], "frontend"],
                                  buckets=LATENCY_BUCKETS, registry=registry)
        # livesum: the merged value is the requests in flight in every running process; a dead
        # process's share goes with process_dead(), so a crash does not leave its requests counted.
        self.in_flight = Gauge(*IN_FLIGHT[:2], ["frontend"], multiprocess_mode="livesum", registry=registry)
        self._written: dict[tuple, Any] = {}  # (metric, label values) -> what its file holds
        self._lock = threading.Lock()  # the writer thread, /metrics on the loop and exit all flush
        self.flush()  # the in-flight series exists from the start, as in one process

    def flush(self) -> None:
        """Write the loop's numbers that changed since the last flush to this process's files."""
        source, written = self.source, self._written
        with self._lock:
            # list(): a copy made in one step, while the loop thread may add a series
            for key, count in list(source.answered.items()):
                before = written.get((self.requests, key), 0)
                if count != before:
                    child(self.requests, *key, self.frontend).inc(count - before)
                    written[self.requests, key] = count
            for metric, histograms in ((self.durations, source.durations), (self.preprocess, source.preprocess),
                                       (self.refusals, source.refusals)):
                for key, found in list(histograms.items()):
                    now = list(found)  # [bucket counts..., sum], as LoopMetrics keeps them
                    before = written.get((metric, key)) or [0] * len(now)
                    if before == now:
                        continue
                    # Histogram has no public call that adds many observations at once: what was
                    # added to each bucket and to the sum is added to its child's values directly
                    # (added, not set: a file a reused pid finds keeps what the old process wrote),
                    # and only where it changed, since each write takes the file's lock.
                    labelled = child(metric, *key, self.frontend)
                    for value, old, new in zip([*labelled._buckets, labelled._sum], before, now):
                        if old != new:
                            value.inc(new - old)
                    written[metric, key] = now
            if written.get(self.in_flight) != source.in_flight:
                child(self.in_flight, self.frontend).set(source.in_flight)
                written[self.in_flight] = source.in_flight

    def describe(self) -> list:
        series = (self.requests, self.durations, self.preprocess, self.refusals, self.in_flight)
        return [family for metric in series for family in metric.describe()]


#: How often the writer thread copies this process's numbers to the shared directory: well inside
#: the scrape interval of deploy/; a copy writes only what changed, off the request path.
WRITE_S = 0.25
_POLLED: list[tuple[Gauge, Callable[[], float]]] = []
_POLLED_LOCK = threading.Lock()


class PolledGauge(Gauge):
    """A Gauge whose ``set_function`` also works in multiprocess mode.

    prometheus_client's ``set_function`` calls the function when this process collects, but in
    multiprocess mode another process (a front end) collects, from the files: they would hold
    the gauge's first value forever. Here the writer thread writes the function's value every
    ``WRITE_S``, and once when the function is set.
    """

    def set_function(self, f: Callable[[], float]) -> None:
        self.set(f())
        with _POLLED_LOCK:
            _POLLED.append((self, f))


def _write() -> None:
    """One copy of this process's loop numbers and polled gauges to its files."""
    if SHARED is not None:
        SHARED.flush()
    with _POLLED_LOCK:
        polled = list(_POLLED)
    for gauge, f in polled:
        try:
            gauge.set(f())
        except Exception:  # one broken function must not stop the others' updates
            log.exception("metrics: a polled gauge's function failed; it is no longer polled")
            with _POLLED_LOCK:
                _POLLED.remove((gauge, f))


def _writer() -> None:
    stop = threading.Event()  # never set: the thread lives as long as the process
    while not stop.wait(WRITE_S):
        try:
            _write()
        except Exception:  # the next round tries again; metrics must not stop the service
            log.exception("metrics: writing to the multiprocess directory failed")


ON_LOOP = LoopMetrics()
SHARED: SharedSeries | None = None
if MULTIPROCESS_DIR is None:
    REGISTRY.register(ON_LOOP)
else:
    SHARED = SharedSeries(ON_LOOP, FRONTEND)
QUEUE_DURATION = Histogram(
    "inference_queue_duration_seconds", "Time a request waited in its device queue.",
    ["model", "device"], buckets=LATENCY_BUCKETS,
)
COMPUTE_DURATION = Histogram(
    "inference_compute_duration_seconds", "Time a worker spends on a batch: its host tensors, the copy to the "
    "device, the forward pass and postprocess.",
    ["model", "device"], buckets=LATENCY_BUCKETS,
)
# livesum: the jobs waiting for a device in every running process (only the engine has queues).
QUEUE_DEPTH = (Gauge if MULTIPROCESS_DIR is None else PolledGauge)(
    "inference_queue_depth", "Requests waiting in a device queue.", ["device"], multiprocess_mode="livesum",
)
# livesum, as the queue depth: the engine alone sets it.
DEVICE_MEMORY = (Gauge if MULTIPROCESS_DIR is None else PolledGauge)(
    "device_memory_used_bytes", "Device memory the device has given Paddle's allocator, its cache included.",
    ["device"], multiprocess_mode="livesum",
)
BATCH_SIZE = Histogram(
    "inference_batch_size", "Examples per forward pass.", ["model"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
)
# livemax: one series per (worker, device), 0 or 1, as in one process, so sum by (device) counts
# workers up; an engine's replacement reporting the same worker before the old one is marked
# dead does not make it count twice, as livesum would, nor adds a pid label, as liveall would.
WORKER_UP = Gauge("worker_up", "1 while a worker thread is alive and has its models loaded.",
                  ["worker", "device"], multiprocess_mode="livemax")
WORKER_RESTARTS = Counter("worker_restarts", "Workers replaced after their thread died.", ["device"])
# Counted by the engine, which knows where a withdrawn request was; inference_requests_total counts
# their answers (status timeout, cancelled) with every other.
CANCELLED = Counter(
    "inference_cancelled_requests", "Requests the engine withdrew because their client left (an HTTP "
    "disconnect, a cancelled gRPC call), by where they were: 'queued' (never run) or 'running' (a worker "
    "had begun; its answer is dropped).", ["model", "stage"],
)
EXPIRED = Counter(
    "inference_expired_requests", "Requests the engine answered 504 at their deadline, by whose deadline it "
    "was ('client': the request's timeout parameter or its gRPC deadline, when shorter than the service's; "
    "'service': the service's request timeout) and where they were ('queued': never run; 'running').",
    ["model", "deadline", "stage"],
)
PLACE_CHECKS = Counter(
    "placeenv_place_checks", "Place checks made, by stage (load, preprocess, worker, batch, execute, "
    "output) and the device of the worker (or 'cpu' for the preprocessing threads) that made them.",
    ["stage", "device"]
)
DEVICE_LEAKS = Counter(
    "placeenv_device_leaks",
    "Place checks that found a tensor or thread on the wrong device.",
    ["worker", "expected", "actual", "stage"],
)
# A pipeline's steps, and a model's calls to another (label pipeline: the calling model; step: the called).
STEP_QUEUE_DURATION = Histogram(
    "inference_pipeline_step_queue_duration_seconds", "Time a pipeline's step (or a model's call to another) "
    "waited in its device queue.", ["pipeline", "step", "device"], buckets=LATENCY_BUCKETS,
)
STEP_COMPUTE_DURATION = Histogram(
    "inference_pipeline_step_compute_duration_seconds", "Time from a pipeline's step (or a call) starting on "
    "its worker to its answer: the forward pass it shared, and the hand-back.", ["pipeline", "step", "device"],
    buckets=LATENCY_BUCKETS,
)
STEP_BATCH_SIZE = Histogram(
    "inference_pipeline_step_batch_size", "Examples in the forward pass a pipeline's step (or a call) shared.",
    ["pipeline", "step"], buckets=(1, 2, 4, 8, 16, 32, 64, 128),
)
STEP_HANDOFFS = Counter(
    "inference_pipeline_handoffs", "Tensors a pipeline's step read from another step's output, by how: "
    "'device' (the tensor the other made, where it was), 'moved' (that tensor, copied to this step's "
    "device), 'host' (a host array, for a model with a preprocess or postprocess of its own).",
    ["pipeline", "step", "way"],
)
STEP_LEAKS = Counter(
    "placeenv_pipeline_step_device_leaks", "Place checks of a pipeline's step (or a model's call to "
    "another) that found a tensor or thread on the wrong device.", ["pipeline", "step", "stage"],
)
def resident_bytes() -> float:
    """This process's resident memory (``/proc/self/statm``); 0 where the system has no such file."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return float(int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return 0.0


# Each process's own (the engine's: Paddle, its workers' runtimes and buffers; a front end's): the figure
# a host's memory is planned by, which Prometheus' own process_resident_memory_bytes gives only for the
# process it scrapes.
RESIDENT = PolledGauge(
    "placeenv_process_resident_memory_bytes", "Resident memory of each process of the service, by process: "
    "'engine' (one process: the service), or a front end's index.", ["process"], multiprocess_mode="livemax",
)
RESIDENT.labels(process=FRONTEND).set_function(resident_bytes)

# Model control (engine/control.py): written by the engine process only.
MODEL_LOADS = Counter(
    "placeenv_model_loads", "Model loads (a request, or a poll that saw a change), by model and outcome "
    "('ok', 'failed': what served the model serves on).", ["model", "outcome"],
)
MODEL_LOAD_FAILED = Gauge(
    "placeenv_model_load_failed", "1 while a model's last load failed (the repository index says why), "
    "0 once one succeeds.", ["model"], multiprocess_mode="livemax",
)
# livemin: 1 only while every running process that imported this module says 1. The service is
# ready when the engine and every front end are; each process starts at 0, sets 1 when it is
# ready itself and 0 when it stops, and a dead one's vote goes with process_dead().
READY = Gauge("service_ready", "1 while every worker is up and no process of the service is stopping.",
              multiprocess_mode="livemin")


if MULTIPROCESS_DIR is None:
    _SERVED = REGISTRY
else:
    _SERVED = CollectorRegistry()
    MultiProcessCollector(_SERVED, path=MULTIPROCESS_DIR)  # reads the directory at each collect
    threading.Thread(target=_writer, name="metrics-writer", daemon=True).start()
    atexit.register(_write)  # what the loop counted since the last copy


def exposition() -> tuple[bytes, str]:
    """The body and content type of ``/metrics``: this process's registry, or every process's
    series merged from the shared directory (this process's own written first); the polled gauges read
    now."""
    _write()  # (one process: nothing else updates the polled gauges)
    return generate_latest(_SERVED), CONTENT_TYPE_LATEST


def process_dead(pid: int, directory: str | None = None) -> None:
    """Drop the live gauges (``live*`` modes) of process ``pid``, which has exited; its counters and
    histograms stay in the merge. For the supervisor, when a child exits: it passes the directory it
    gave its children, since it need not be in multiprocess mode itself. A no-op without a directory."""
    directory = directory or MULTIPROCESS_DIR
    if directory is not None:
        mark_process_dead(pid, directory)


def families() -> dict[str, str]:
    """Name -> type of every family this module exports, the same in both modes (the process and
    platform collectors' aside): what alerts and dashboards may refer to."""
    found = {family.name: family.type for value in list(globals().values())
             if isinstance(value, MetricWrapperBase) for family in value.describe()}
    found.update((family.name, family.type) for family in ON_LOOP.describe())
    return found
