"""Per-request cost of the service's metric updates: single-process mode, multiprocess mode, and
multiprocess mode with prometheus_client's metrics updated on each request instead.

    python benchmarks/metrics_cost.py [--rounds 15] [--requests 200000]

A request on the service's path counts its answer, observes its duration and its preprocessing
time, and moves the in-flight gauge up and down (the gateway and the engine): those five calls on ``metrics.ON_LOOP``,
timed per request over 8 series (2 models x 4 devices).

- ``single``: no ``PROMETHEUS_MULTIPROC_DIR``: ``LoopMetrics``'s plain numbers;
- ``multiprocess``: the same calls, while the writer thread copies the numbers to the directory
  (its rounds run inside the timing); then the time of one copy of the 8 series, every one changed;
- ``direct``: what multiprocess mode would cost with a prometheus_client Counter, Histogram and
  Gauge updated on each request (every update writes its file under a lock): ``SharedSeries``'s
  own metrics, called the way ``LoopMetrics`` is.

The mode is chosen when ``placeenv.serve.metrics`` is imported, so each round runs one fresh
interpreter per mode, in rotating order, each with a new directory. Prints each mode's median over
the rounds, with the lowest and highest round.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import sys, time
from placeenv.serve import metrics
mode, n = sys.argv[1], int(sys.argv[2])
loop = metrics.ON_LOOP
keys = [(model, f"sim:{d}") for model in ("digits", "mobilenet") for d in range(4)]

if mode == "direct":
    shared = metrics.SHARED
    def count(model, device, status):
        metrics.child(shared.requests, model, device, status, "x").inc()
    def observe(histogram, key, seconds):
        metrics.child(histogram, *key, "x").observe(seconds)
    gauge = metrics.child(shared.in_flight, "x")
    def request(i, key):
        gauge.inc()
        observe(shared.preprocess, key[:1], 0.0002)
        gauge.dec()
        count(*key, "ok")
        observe(shared.durations, key, 0.003 if i % 4 else 0.04)
else:
    def request(i, key, loop=loop):
        loop.in_flight += 1
        loop.observe(loop.preprocess, key[:1], 0.0002)
        loop.in_flight -= 1
        loop.count(*key, "ok")
        loop.observe(loop.durations, key, 0.003 if i % 4 else 0.04)

def requests(count):
    for i in range(count):
        request(i, keys[i % 8])

requests(n // 10)  # first children made, caches warm
started = time.perf_counter_ns()
requests(n)
per_request = (time.perf_counter_ns() - started) / n
flush = 0.0
if mode == "multiprocess":
    times = []
    for _ in range(200):
        requests(8)
        started = time.perf_counter_ns()
        metrics.SHARED.flush()
        times.append(time.perf_counter_ns() - started)
    flush = sorted(times)[len(times) // 2]
print(per_request, flush)
"""

MODES = ["single", "multiprocess", "direct"]


def one(mode: str, requests: int) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")}
    with tempfile.TemporaryDirectory() as directory:
        if mode != "single":
            env["PROMETHEUS_MULTIPROC_DIR"] = directory
        out = subprocess.run([sys.executable, "-c", CHILD, mode, str(requests)], env=env, capture_output=True,
                             text=True, check=True, timeout=600)
    per_request, flush = out.stdout.split()[-2:]
    return float(per_request), float(flush)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--requests", type=int, default=200_000)
    args = parser.parse_args()
    found: dict[str, list[float]] = {mode: [] for mode in MODES}
    flushes: list[float] = []
    for i in range(args.rounds):
        for mode in MODES[i % 3:] + MODES[:i % 3]:
            per_request, flush = one(mode, args.requests)
            found[mode].append(per_request)
            if mode == "multiprocess":
                flushes.append(flush)
    print(f"{platform.python_implementation()} {platform.python_version()}, {platform.machine()}, "
          f"{args.rounds} rounds of {args.requests} requests")
    for mode in MODES:
        ns = found[mode]
        print(f"{mode:>13}: median {statistics.median(ns):7.0f} ns/request (rounds {min(ns):.0f}-{max(ns):.0f})")
    print(f"one copy of 8 changed series to the directory: median {statistics.median(flushes) / 1000:.1f} us "
          f"(rounds {min(flushes) / 1000:.1f}-{max(flushes) / 1000:.1f})")


if __name__ == "__main__":
    main()
