"""Resident memory of one service process with N devices vs N processes with one device each.

    python benchmarks/memory_scaling.py [--model digits] [--devices 1 2 4] [--seconds 8]

Row (c) of bench_service.py asks for one process at <= 1/N of the N processes'
memory. With a fixed cost F per process (Python, Paddle, FastAPI) and a cost D
per device (a replica, its workspace, a worker), one process holds F + N*D and
N processes N*(F + D): the ratio is 1/N + (N-1)*D / (N*(F + D)), above 1/N
whenever D > 0. This script measures F and D, so the bound's distance is a
number instead of a guess. Each configuration is saturated with wrk first
(memory a service holds under load, not idle), then its RSS is read from /proc.
Needs ``wrk``. Prints a Markdown table; writes results/memory_scaling_MODEL.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform

from bench_service import RESULTS, example_body, metric_samples, process_per_device, service, warm, wrk


def forward_passes(url: str) -> tuple[float, float]:
    """(forward passes, examples) so far, from the service's inference_batch_size histogram."""
    totals = {"inference_batch_size_count": 0.0, "inference_batch_size_sum": 0.0}
    for sample in metric_samples(url):
        if sample.name in totals:
            totals[sample.name] += sample.value
    return totals["inference_batch_size_count"], totals["inference_batch_size_sum"]


def measure(devices: list[str], model: str, body: str, seconds: float, connections: int) -> dict:
    """One process with all ``devices``, then one process per device; RSS after saturating each."""
    one = service(devices, model)
    try:
        warm(one.url, body)
        passes_before, examples_before = forward_passes(one.url)
        one_sat = wrk([one.url], body, connections, seconds)
        one_rss = one.rss_mb()
        passes, examples = forward_passes(one.url)
        mean_batch = (examples - examples_before) / (passes - passes_before)
    finally:
        one.stop()
    each_sat, each_rss = process_per_device(devices, model, body, connections, seconds)
    return {"n": len(devices), "one_rss_mb": one_rss, "each_rss_mb": each_rss,
            "one_rps": one_sat["rps"], "each_rps": each_sat["rps"], "one_mean_batch": mean_batch,
            "non_2xx": one_sat["non_2xx"] + each_sat["non_2xx"]}


def table(r: dict) -> str:
    rows = r["rows"]
    base = next(x for x in rows if x["n"] == 1)  # one process, one device: F + D
    wider = [x for x in rows if x["n"] > 1]
    per_device = sum((x["one_rss_mb"] - base["one_rss_mb"]) / (x["n"] - 1) for x in wider) / len(wider)
    fixed = base["one_rss_mb"] - per_device
    lines = [(f"Memory scaling, {r['date']}, {r['machine']}, model {r['model']}, wrk {r['connections']} "
              f"connections, {r['seconds']:g} s per run\n"),
             ("| N devices | one process | N processes | ratio | 1/N | throughput one vs N processes "
              "| mean batch, one process |"),
             "|---|---|---|---|---|---|---|"]
    for x in rows:
        lines.append(f"| {x['n']} | {x['one_rss_mb']:.0f} MB | {x['each_rss_mb']:.0f} MB | "
                     f"{x['one_rss_mb'] / x['each_rss_mb']:.3f} | {1 / x['n']:.3f} | "
                     f"{x['one_rps']:.0f} vs {x['each_rps']:.0f} req/s ({x['one_rps'] / x['each_rps']:.2f}x) | "
                     f"{x['one_mean_batch']:.2f} |")
    lines.append(f"\nper process F = {fixed:.0f} MB, per device D = {per_device:.1f} MB "
                 f"(D from the one-process rows); non-2xx answers: {sum(x['non_2xx'] for x in rows)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="digits")
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4], help="N values; must include 1")
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    if 1 not in args.devices or len(args.devices) < 2:
        parser.error("--devices needs 1 (the per-process cost) and at least one N > 1")
    body = example_body(args.model)
    r = {"model": args.model, "seconds": args.seconds, "connections": args.connections,
         "date": str(datetime.date.today()), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
         "rows": [measure([f"sim:{i}" for i in range(n)], args.model, body, args.seconds, args.connections)
                  for n in sorted(args.devices)]}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"memory_scaling_{args.model}.json").write_text(json.dumps(r, indent=2))
    print(table(r))


if __name__ == "__main__":
    main()
