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
    def take(cls, host: str) -> "Scrape":
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
        return self.total("inference_requests_total", device=device, status="ok")

    def queue_depth(self, device: str) -> float:
        return self.total("inference_queue_depth", device=device)

    def leaks(self) -> float:
        return self.total("placeenv_device_leaks_total")

    def leak_series(self) -> dict[tuple, float]:
        return {
            tuple(sorted(l.items())): v for n, l, v in self.samples if n == "placeenv_device_leaks_total"
        }


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


def evaluate(start: Scrape, end: Scrape, requests: int, failures: int, max_failure_ratio: float) -> Verdict:
    """Compare two scrapes: leaks must not grow, every device must serve, failures stay under the ratio."""
    per_device = {d: end.ok(d) - start.ok(d) for d in end.devices}
    verdict = Verdict(
        requests, failures, max_failure_ratio, end.leaks() - start.leaks(), per_device,
        end.total("placeenv_place_checks_total") - start.total("placeenv_place_checks_total"),
    )
    if verdict.leaks > 0:
        grown = {k: v - start.leak_series().get(k, 0) for k, v in end.leak_series().items()}
        worst = sorted(((v, dict(k)) for k, v in grown.items() if v > 0), key=lambda x: -x[0])[:5]
        verdict.problems.append(f"{verdict.leaks:.0f} device leaks, e.g. {worst}")
    idle = [d for d, n in per_device.items() if n <= 0]
    if idle:
        verdict.problems.append(f"devices that served no request: {', '.join(idle)}")
    if requests == 0:
        verdict.problems.append("no request was made")
    elif failures / requests > max_failure_ratio:
        verdict.problems.append(f"failure ratio {failures / requests:.2%} over {max_failure_ratio:.2%}")
    return verdict
