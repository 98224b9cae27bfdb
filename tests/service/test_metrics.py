"""``LoopMetrics``, the request path's metrics kept on the event loop, exports what prometheus_client's
own Counter, Histogram and Gauge would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from placeenv.serve import metrics


def _exposition(registry: CollectorRegistry) -> list[str]:
    return sorted(line for line in generate_latest(registry).decode().splitlines() if not line.startswith("#"))


def test_loop_metrics_export_what_prometheus_clients_own_metrics_would():
    ours, theirs = metrics.LoopMetrics(), CollectorRegistry()
    mine = CollectorRegistry()
    mine.register(ours)
    requests = Counter("inference_requests", "", ["model", "device", "status"], registry=theirs)
    duration = Histogram("inference_request_duration_seconds", "", ["model", "device"],
                         buckets=metrics.LATENCY_BUCKETS, registry=theirs)
    preprocess = Histogram("inference_preprocess_duration_seconds", "", ["model"],
                           buckets=metrics.LATENCY_BUCKETS, registry=theirs)
    refusals = Histogram("inference_refusal_duration_seconds", "", ["model", "status"],
                         buckets=metrics.LATENCY_BUCKETS, registry=theirs)
    in_flight = Gauge("inference_in_flight_requests", "", registry=theirs)
    seconds = [0.0, 0.0004, 0.001, 0.00100001, 0.0025, 0.07, 1.0, 29.9, 30.0, 31, 1e6]
    for i, value in enumerate(seconds):
        device = f"sim:{i % 2}"
        ours.count("digits", device, "ok")
        requests.labels("digits", device, "ok").inc()
        ours.observe(ours.durations, ("digits", device), value)
        duration.labels("digits", device).observe(value)
        ours.observe(ours.preprocess, ("digits",), value / 10)
        preprocess.labels("digits").observe(value / 10)
        ours.observe(ours.refusals, ("digits", "overloaded"), value / 100)
        refusals.labels("digits", "overloaded").observe(value / 100)
    ours.count("unknown", "none", "not_found")
    requests.labels("unknown", "none", "not_found").inc()
    ours.in_flight = 3
    in_flight.set(3)
    assert _exposition(mine) == _exposition(theirs)
    ours.observe(ours.durations, ("digits", "sim:0"), 0.002)  # the control: one more observation shows
    assert _exposition(mine) != _exposition(theirs)
