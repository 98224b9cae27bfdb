"""Every Prometheus metric the service exports, in one place.

Base units, ``_total`` on counters, low-cardinality labels only: model,
device, worker, stage, status. The default registry also carries the process
and platform collectors.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

disable_created_metrics()  # *_created series double the exposition for no use here

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class LoopMetrics(Collector):
    """The request path's own metrics, kept as plain numbers by the event loop thread.

    Every request counted its answer, observed two durations and moved the in-flight gauge:
    seven prometheus_client updates, each taking a lock and checking its arguments (a share of
    a small request's event-loop time: docs/benchmarks.md). Here one thread writes and, since ``/metrics``
    is served on that same loop, the same thread reads: no lock is needed. The series are
    the same as prometheus_client's Counter, Histogram and Gauge would export.
    """

    def __init__(self) -> None:
        self.answered: dict[tuple[str, str, str], int] = {}  # (model, device, status) -> count
        self.durations: dict[tuple[str, str], list] = {}  # (model, device) -> [bucket counts..., sum]
        self.preprocess: dict[tuple[str], list] = {}  # (model,) -> [bucket counts..., sum]
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
        requests = CounterMetricFamily("inference_requests", "Predict requests answered, by outcome.",
                                       labels=["model", "device", "status"])
        for labels, value in list(self.answered.items()):
            requests.add_metric(labels, value)
        yield requests
        for name, help_text, labels, histograms in (
            ("inference_request_duration_seconds", "Time from arrival to answer of successful predicts.",
             ["model", "device"], self.durations),
            ("inference_preprocess_duration_seconds", "CPU preprocessing time of a request.", ["model"],
             self.preprocess),
        ):
            family = HistogramMetricFamily(name, help_text, labels=labels)
            for key, found in list(histograms.items()):
                counts, total = found[:-1], found[-1]
                cumulative = [sum(counts[:i + 1]) for i in range(len(counts))]
                bounds = [floatToGoString(b) for b in LATENCY_BUCKETS] + ["+Inf"]
                family.add_metric(list(key), list(zip(bounds, cumulative)), total)
            yield family
        yield GaugeMetricFamily("inference_in_flight_requests", "Requests accepted and not yet answered.",
                                value=self.in_flight)


ON_LOOP = LoopMetrics()
REGISTRY.register(ON_LOOP)
QUEUE_DURATION = Histogram(
    "inference_queue_duration_seconds", "Time a request waited in its device queue.",
    ["model", "device"], buckets=LATENCY_BUCKETS,
)
COMPUTE_DURATION = Histogram(
    "inference_compute_duration_seconds", "Forward pass time of a batch, copy to device included.",
    ["model", "device"], buckets=LATENCY_BUCKETS,
)
QUEUE_DEPTH = Gauge("inference_queue_depth", "Requests waiting in a device queue.", ["device"])
BATCH_SIZE = Histogram(
    "inference_batch_size", "Examples per forward pass.", ["model"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
)
WORKER_UP = Gauge("worker_up", "1 while a worker thread is alive and has its models loaded.", ["worker", "device"])
WORKER_RESTARTS = Counter("worker_restarts", "Workers replaced after their thread died.", ["device"])
PLACE_CHECKS = Counter(
    "placeenv_place_checks", "Place checks made on the request path.", ["stage", "device"]
)
DEVICE_LEAKS = Counter(
    "placeenv_device_leaks",
    "Place checks that found a tensor or thread on the wrong device.",
    ["worker", "expected", "actual", "stage"],
)
READY = Gauge("service_ready", "1 when every worker is up and the service is not draining.")


_CHILDREN: dict[tuple, Any] = {}


def child(metric, *labels: str):
    """``metric.labels(*labels)``, looked up once: ``labels()`` takes a lock on every call.

    For the request path, whose label values are known models, devices, stages
    and outcomes, so the cache is bounded. Two threads racing on a first lookup
    both get the one child Prometheus keeps for those labels.
    """
    found = _CHILDREN.get((metric, *labels))
    if found is None:
        found = _CHILDREN[(metric, *labels)] = metric.labels(*labels)
    return found
