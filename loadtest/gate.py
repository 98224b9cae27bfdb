"""The leak gate: what ``/metrics`` must say after a load run."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Scrape:
    """One scrape of the service: samples plus the devices it serves."""

    samples: list[tuple[str, dict, float]]
    devices: list[str]

    @classmethod
    def take(cls, host: str) -> Scrape:
        with httpx.Client(base_url=host, timeout=10) as http:
            text = http.get("/metrics").text
            devices = http.get("/v1/models").json()["devices"]
        samples = [
            (s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples
        ]
        return cls(samples, devices)

    def total(self, name: str, **labels) -> float:
        return sum(v for n, l, v in self.samples if n == name and all(l.get(k) == x for k, x in labels.items()))

    def ok(self, device: str) -> float:
        """What ``device`` served: requests answered there, and the pipeline steps and model calls it ran (a
        PaddleX pipeline's networks are its calls)."""
        return (self.total("inference_requests_total", device=device, status="ok")
                + self.total("inference_pipeline_step_compute_duration_seconds_count", device=device))

    def queue_depth(self, device: str) -> float:
        return self.total("inference_queue_depth", device=device)

    def leaks(self) -> float:
        return self.total("placeenv_device_leaks_total")

    def leak_series(self) -> dict[tuple, float]:
        return {
            tuple(sorted(l.items())): v for n, l, v in self.samples if n == "placeenv_device_leaks_total"
        }


@dataclass
class Growth:
    """What grew during a run: ok requests (and steps and calls) per device, leaks per series, place checks."""

    served: dict[str, float]
    leaks: dict[tuple, float]
    checks: float

    @classmethod
    def between(cls, start: Scrape, end: Scrape) -> Growth:
        """One service scraped directly, before and after."""
        before = start.leak_series()
        return cls(
            {d: end.ok(d) - start.ok(d) for d in end.devices},
            {k: v - before.get(k, 0.0) for k, v in end.leak_series().items()},
            end.total("placeenv_place_checks_total") - start.total("placeenv_place_checks_total"),
        )


class Prometheus:
    """Growth over a time window, read from the Prometheus that scrapes every replica.

    Replicas restart during a run (their counters begin again at 0) and new
    series appear (a leak creates its series): each series' growth is summed
    step by step from raw values, a drop counting as a restart, and a series
    born inside the window counting from 0.
    """

    STEP_S = 1.0

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _range(self, expr: str, start: float, end: float) -> dict[tuple, list[tuple[float, float]]]:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            body = http.get("/api/v1/query_range", params={
                "query": expr, "start": start, "end": end, "step": self.STEP_S}).json()
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus query {expr!r} failed: {body.get('error', body)}")
        return {
            tuple(sorted(series["metric"].items())): [(float(t), float(v)) for t, v in series["values"]]
            for series in body["data"]["result"]
        }

    @staticmethod
    def increase(values: list[tuple[float, float]], start: float) -> float:
        (first_t, previous), total = values[0], 0.0
        if first_t > start + 1e-3:  # born during the run
            total += previous
        for _, value in values[1:]:
            total += value - previous if value >= previous else value
            previous = value
        return total

    def growth(self, start: float, end: float) -> Growth:
        def grown(expr: str) -> dict[tuple, float]:
            return {k: self.increase(v, start) for k, v in self._range(expr, start, end).items()}

        served = grown('sum by (instance, device) (inference_requests_total{status="ok"})')
        # The pipeline steps and model calls each device ran count as its work too (``Scrape.ok``).
        for key, value in grown("sum by (instance, device) "
                                "(inference_pipeline_step_compute_duration_seconds_count)").items():
            served[key] = served.get(key, 0.0) + value
        devices = self._range("max by (instance, device) (worker_up)", start, end)
        checks = grown("sum by (instance) (placeenv_place_checks_total)")
        return Growth(
            {f"{dict(k)['instance']} {dict(k)['device']}": served.get(k, 0.0) for k in devices},
            grown("placeenv_device_leaks_total"),
            sum(checks.values()),
        )


@dataclass
class Verdict:
    requests: int
    failures: int
    max_failure_ratio: float
    leaks: float
    per_device: dict[str, float]
    checks: float
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        ratio = self.failures / self.requests if self.requests else 0.0
        lines = [
            "leak gate: " + ("PASS" if self.ok else "FAIL"),
            f"  requests {self.requests}, failures {self.failures} ({ratio:.2%}, limit {self.max_failure_ratio:.2%})",
            f"  place checks {self.checks:.0f}, device leaks {self.leaks:.0f}",
            "  served per device: " + ", ".join(f"{d}={n:.0f}" for d, n in self.per_device.items()),
        ]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


def evaluate(growth: Growth, requests: int, failures: int, max_failure_ratio: float) -> Verdict:
    """Leaks must not grow, every device must serve, failures stay under the ratio."""
    verdict = Verdict(
        requests, failures, max_failure_ratio, sum(growth.leaks.values()), growth.served, growth.checks
    )
    if verdict.leaks > 0:
        worst = sorted(((v, dict(k)) for k, v in growth.leaks.items() if v > 0), key=lambda x: -x[0])[:5]
        verdict.problems.append(f"{verdict.leaks:.0f} device leaks, e.g. {worst}")
    idle = [d for d, n in growth.served.items() if n <= 0]
    if idle:
        verdict.problems.append(f"devices that served no request: {', '.join(idle)}")
    if not growth.served:
        verdict.problems.append("no device was seen")
    if requests == 0:
        verdict.problems.append("no request was made")
    elif failures / requests > max_failure_ratio:
        verdict.problems.append(f"failure ratio {failures / requests:.2%} over {max_failure_ratio:.2%}")
    return verdict
