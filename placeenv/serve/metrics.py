"""Every Prometheus metric the service exports, in one place.

Base units, ``_total`` on counters, low-cardinality labels only: model,
device, worker, stage, status. The default registry also carries the process
and platform collectors.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

disable_created_metrics()  # *_created series double the exposition for no use here

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

REQUESTS = Counter(
    "inference_requests", "Predict requests answered, by outcome.", ["model", "device", "status"]
)
REQUEST_DURATION = Histogram(
    "inference_request_duration_seconds", "Time from arrival to answer of successful predicts.",
    ["model", "device"], buckets=LATENCY_BUCKETS,
)
QUEUE_DURATION = Histogram(
    "inference_queue_duration_seconds", "Time a request waited in its device queue.",
    ["model", "device"], buckets=LATENCY_BUCKETS,
)
COMPUTE_DURATION = Histogram(
    "inference_compute_duration_seconds", "Forward pass time of a batch, copy to device included.",
    ["model", "device"], buckets=LATENCY_BUCKETS,
)
PREPROCESS_DURATION = Histogram(
    "inference_preprocess_duration_seconds", "CPU preprocessing time of a request.",
    ["model"], buckets=LATENCY_BUCKETS,
)
QUEUE_DEPTH = Gauge("inference_queue_depth", "Requests waiting in a device queue.", ["device"])
IN_FLIGHT = Gauge("inference_in_flight_requests", "Requests accepted and not yet answered.")
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
