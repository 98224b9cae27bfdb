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

    python benchmarks/memory_scaling.py --workers-per-device 1 2 4 [--model mobilenet]

measures instead device memory per model version against the workers of a device: one service
on ``sim:0`` serving only ``--model``, for each backend (``jit``, ``inference``) with its
workers sharing one copy of the weights (the default) and with ``share_weights: false``;
``device_memory_used_bytes{device="sim:0"}`` once the service is ready and again after wrk
has saturated it. Writes results/device_memory_MODEL.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import tempfile
from pathlib import Path

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


def device_memory(url: str) -> float:
    return sum(s.value for s in metric_samples(url)
               if s.name == "device_memory_used_bytes" and s.labels.get("device") == "sim:0")


def device_memory_rows(model: str, workers: list[int], seconds: float, connections: int) -> list[dict]:
    """Device memory of one model version on sim:0, per backend, sharing or not, per workers a device."""
    from placeenv.serve.models.examples import ensure_mobilenet, mobilenet_home
    from placeenv.serve.models.repository import BUNDLED

    ensure_mobilenet()
    body, rows = example_body(model), []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("jit", "inference"):
            for share in (True, False):
                root = Path(tmp) / f"{backend}-{share}"
                source = mobilenet_home() if model == "mobilenet" else BUNDLED / model
                shutil.copytree(source, root / model, ignore=shutil.ignore_patterns("config.*"))
                if (BUNDLED / model / "config.yaml").is_file():
                    shutil.copy(BUNDLED / model / "config.yaml", root / model / "config.yaml")
                with open(root / model / "config.yaml", "a") as config:
                    config.write(f"\nbackend: {backend}\nshare_weights: {str(share).lower()}\n")
                for n in workers:
                    one = service(["sim:0"], model, MODEL_REPOSITORY=str(root), WORKERS_PER_DEVICE=n)
                    try:
                        ready = device_memory(one.url)
                        load = wrk([one.url], body, connections, seconds)
                        rows.append({"backend": backend, "share": share, "workers": n, "ready_mb": ready / 2**20,
                                     "loaded_mb": device_memory(one.url) / 2**20, "rps": load["rps"],
                                     "non_2xx": load["non_2xx"]})
                    finally:
                        one.stop()
                    print(rows[-1], flush=True)
    return rows


def device_memory_table(r: dict) -> str:
    lines = [f"Device memory of {r['model']} on sim:0, {r['date']}, {r['machine']}; after wrk {r['seconds']:g} s "
             f"at {r['connections']} connections\n",
             "| backend | weights | " + " | ".join(f"{n} worker{'s' * (n > 1)}: ready / after load, MB"
                                                  for n in r["workers"]) + " | after load, per worker |",
             "|---|---|" + "---:|" * (len(r["workers"]) + 1)]
    for backend in ("jit", "inference"):
        for share in (True, False):
            rows = {x["workers"]: x for x in r["rows"] if x["backend"] == backend and x["share"] == share}
            cells = [f"{rows[n]['ready_mb']:.2f} / {rows[n]['loaded_mb']:.2f}" for n in r["workers"]]
            top = max(r["workers"])
            lines.append(f"| {backend} | {'one copy a device' if share else 'share_weights: false'} | "
                         + " | ".join(cells) + f" | {rows[top]['loaded_mb'] / top:.2f} |")
    lines.append(f"\nnon-2xx answers: {sum(x['non_2xx'] for x in r['rows'])}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="digits")
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4], help="N values; must include 1")
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--workers-per-device", type=int, nargs="+", metavar="N",
                        help="device memory per model version against workers a device, instead")
    args = parser.parse_args()
    if args.workers_per_device:
        r = {"model": args.model, "seconds": args.seconds, "connections": args.connections,
             "workers": args.workers_per_device, "date": str(datetime.date.today()),
             "machine": f"{platform.machine()}, {os.cpu_count()} cores",
             "rows": device_memory_rows(args.model, args.workers_per_device, args.seconds, args.connections)}
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"device_memory_{args.model}.json").write_text(json.dumps(r, indent=2))
        print(device_memory_table(r))
        return
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
