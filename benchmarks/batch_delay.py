"""What the batch delay buys, and what it costs: the null model under a closed-loop load.

    python benchmarks/batch_delay.py [--rounds 3] [--seconds 4] [--connections 16] [--delays-ms 0,2,10]

The null model (``benchmarks/repository/null``, batches of up to 32) on ``cpu``, wrk at
``--connections`` on ``/predict``, for each ``max_batch_delay_ms`` in ``--delays-ms`` and two
kinds of device:

  host      sleep 0, 2 workers: the front end is the bottleneck (what front_end_ceiling.py runs)
  device    5 ms per batch, the GIL released, 1 worker: a stand-in for an accelerator whose
            kernel costs the same whatever the batch, where bigger batches are more throughput

Every service is alive for the whole run and each round measures every one, order rotated.
Prints req/s, the mean batch (the service's own ``inference_batch_size`` histogram over the
run) and each delay's throughput as a ratio to delay 0, median (min..max) of the rounds.
Writes ``results/batch_delay.json``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_protocols import wrk  # noqa: E402
from bench_service import batch_totals, save_results, service  # noqa: E402
from device_scaling import repository  # noqa: E402
from front_end_ceiling import bodies  # noqa: E402

KINDS = {"host": (0, 2), "device": (5, 1)}  # kind: (sleep_ms per batch, workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--delays-ms", default="0,2,10")
    args = parser.parse_args()
    delays = [float(d) for d in args.delays_ms.split(",")]
    body, headers = bodies()["predict"]
    servers = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for kind, (sleep_ms, workers) in KINDS.items():
                repo = repository(Path(tmp) / kind, sleep_ms, max_batch_size=32)
                for delay in delays:
                    servers[kind, delay] = service(["cpu"], "null", WORKERS_PER_DEVICE=workers,
                                                   MAX_BATCH_DELAY_MS=delay, MODEL_REPOSITORY=str(repo))
            for server in servers.values():  # warm-up
                wrk(server.url + "/predict", body, headers, args.connections, 1)
            found = {key: {"rps": [], "mean_batch": []} for key in servers}
            keys = list(servers)
            for r in range(args.rounds):
                for key in keys[r % len(keys):] + keys[:r % len(keys)]:
                    url = servers[key].url
                    before = batch_totals(url)
                    load = wrk(url + "/predict", body, headers, args.connections, args.seconds)
                    found[key]["rps"].append(load["rps"])
                    after = batch_totals(url)
                    found[key]["mean_batch"].append((after[0] - before[0]) / max(1.0, after[1] - before[1]))
                print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                    f"{k} {d:g} ms {found[k, d]['rps'][-1]:.0f}/s" for k, d in keys), flush=True)
        finally:
            for server in servers.values():
                server.stop()

    print(f"\n{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs, {args.rounds} rounds of "
          f"{args.seconds:.0f} s, {args.connections} connections\n")
    print("| device | max_batch_delay_ms | req/s | mean batch | throughput / delay 0 |")
    print("|---|---:|---:|---:|---:|")
    for kind, delay in keys:
        rps = found[kind, delay]["rps"]
        ratios = [a / b for a, b in zip(rps, found[kind, delays[0]]["rps"], strict=True)]
        print(f"| {kind} | {delay:g} | {statistics.median(rps):.0f} | "
              f"{statistics.median(found[kind, delay]['mean_batch']):.1f} | "
              f"{statistics.median(ratios):.3f} ({min(ratios):.3f}..{max(ratios):.3f}) |")
    save_results("batch_delay", args, found={f"{k} {d:g}": v for (k, d), v in found.items()})


if __name__ == "__main__":
    main()
