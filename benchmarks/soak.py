"""Soak: hold the service at saturation until it has made N place checks, with 0 leaks.

    python benchmarks/soak.py [--checks 1000000] [--connections 32] [--model digits]

4 sim devices x 2 workers, ``wrk`` at saturation in 60 s rounds; after each
round it scrapes /metrics, and it stops early on the first leak. Prints the
count, the duration, throughput and the resident memory at start and end.
"""

from __future__ import annotations

import argparse
import datetime
import time

from bench_service import example_body, metric_samples, service, warm, wrk


def totals(url: str) -> dict[str, float]:
    out = {"checks": 0.0, "leaks": 0.0, "ok": 0.0, "non_ok": 0.0}
    for s in metric_samples(url):
        if s.name == "placeenv_place_checks_total":
            out["checks"] += s.value
        elif s.name == "placeenv_device_leaks_total":
            out["leaks"] += s.value
        elif s.name == "inference_requests_total":
            out["ok" if s.labels["status"] == "ok" else "non_ok"] += s.value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checks", type=int, default=1_000_000)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--model", default="digits")
    parser.add_argument("--round-seconds", type=int, default=60)
    args = parser.parse_args()
    devices = [f"sim:{i}" for i in range(4)]
    server = service(devices, args.model, WORKERS_PER_DEVICE=2)
    body = example_body(args.model)
    try:
        warm(server.url, body)
        rss_start, start = server.rss_mb(), time.monotonic()
        rounds = []
        while True:
            result = wrk([server.url], body, args.connections, args.round_seconds)
            t = totals(server.url)
            rounds.append(result)
            elapsed = time.monotonic() - start
            print(f"{elapsed:7.0f} s  checks {t['checks']:>10.0f}  leaks {t['leaks']:.0f}  "
                  f"ok {t['ok']:.0f}  non-ok {t['non_ok']:.0f}  {result['rps']:.0f} req/s  "
                  f"p99 {result['p99_ms']:.0f} ms  rss {server.rss_mb():.0f} MB", flush=True)
            if t["leaks"] > 0 or t["checks"] >= args.checks:
                break
        print(f"\nsoak {datetime.date.today()}: {t['checks']:.0f} place checks, {t['leaks']:.0f} leaks, "
              f"{t['ok']:.0f} requests ok, {t['non_ok']:.0f} not ok, in {elapsed / 60:.1f} min "
              f"({sum(r['rps'] for r in rounds) / len(rounds):.0f} req/s mean); "
              f"rss {rss_start:.0f} -> {server.rss_mb():.0f} MB")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
