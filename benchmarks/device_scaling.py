"""Throughput against the number of devices, one process for all of them or one per device.

    python benchmarks/device_scaling.py [--counts 1,2,4,8,16] [--sleeps-ms 20,5,2] [--rounds 2] [--seconds 5]
                                        [--workers-per-device 2] [--frontends 1,2]

The null model (``benchmarks/repository/null``) with ``sleep_ms`` per batch and batches of
one: each forward pass sleeps with the GIL released, a stand-in for an accelerator kernel
that leaves the host CPU free, so a device serves at most ``1000 / sleep_ms`` requests a
second and N devices ``N`` times that (the ideal line). A device sleeps for one batch at a
time (the model holds its device's lock), so ``--workers-per-device`` (the service's default,
2) overlaps one worker's host work with another's sleep, as a second instance per GPU does,
without raising the ideal. In each round, for each count N:

  one process    the service on sim:0..N-1, --workers-per-device each, for every sleep in --sleeps-ms
  per device     N service processes on one sim device each, the load split evenly, for the
                 first sleep only (16 processes take a minute to start on two cores)
  ceiling        (once per round) the service on the most devices with sleep 0: what the front
                 end alone can feed at batch 1, whatever the devices
  engine + K front ends   with --frontends: the service as one engine process and K front-end
                 processes (--frontends K), for every sleep

wrk with 2 connections per device, ``/predict``. Prints throughput, its share of the ideal
and the processes' summed PSS (shared pages counted once per process share); writes the raw
results to ``results/device_scaling.json``, and ``docs/device_scaling.png`` with the numbers it
draws beside it in ``docs/device_scaling.json`` (``--replot`` that JSON to draw it again).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_service import save_results, service, tree, warm, wrk  # noqa: E402
from charts import DOCS, below_nearest, label_points, publish, pyplot, replot  # noqa: E402

BODY = json.dumps({"model": "null", "inputs": [[0.5] * 64]})


def pss_mb(pid: int) -> float:
    """PSS of ``pid`` and its descendants (an engine and front ends under the supervisor)."""
    total = 0.0
    for one in tree(pid):
        for line in Path(f"/proc/{one}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1]) / 1024
    return total


def repository(tmp: Path, sleep_ms: float, max_batch_size: int = 1) -> Path:
    """A model repository under ``tmp`` holding the null model with this sleep and batch size."""
    root = tmp / "repository"
    shutil.copytree(ROOT / "benchmarks" / "repository" / "null", root / "null")
    (root / "null" / "config.yaml").write_text(
        f"max_batch_size: {max_batch_size}\nparameters:\n  sleep_ms: {sleep_ms}\n")
    return root


def measure(servers, n: int, seconds: float) -> dict:
    for s in servers:
        warm(s.url, BODY, 10)
    result = wrk([s.url for s in servers], BODY, 2 * n, seconds)
    result["pss_mb"] = sum(pss_mb(s.proc.pid) for s in servers)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="1,2,4,8,16")
    parser.add_argument("--sleeps-ms", default="20,5,2", help="per-request device time; the first also "
                        "runs a process per device")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--workers-per-device", type=int, default=2,
                        help="worker threads a device, in every run (the service's default: 2)")
    parser.add_argument("--frontends", default="",
                        help="comma-separated front-end counts K: 'one process' runs also with an engine and "
                        "K front-end processes (--frontends K), as rows 'engine + K front ends'")
    parser.add_argument("--replot", type=Path, metavar="JSON",
                        help="draw the PNG beside this saved chart JSON again, measuring nothing")
    args = parser.parse_args()
    if args.replot:
        print(replot(args.replot, plot))
        return
    counts = [int(c) for c in args.counts.split(",")]
    workers = args.workers_per_device
    sleeps = [float(x) for x in args.sleeps_ms.split(",")]
    frontends = [int(k) for k in args.frontends.split(",") if k.strip()]
    runs = [("one process", sleep) for sleep in sleeps] + [("per device", sleeps[0])]
    runs += [(f"engine + {k} front ends", sleep) for k in frontends for sleep in sleeps]
    found: dict = {f"{kind} {sleep:g} ms": {n: [] for n in counts} for kind, sleep in runs}
    ceiling: list[dict] = []
    top = max(counts)
    with tempfile.TemporaryDirectory() as tmp:
        repos = {sleep: str(repository(Path(tmp) / f"{sleep:g}", sleep)) for sleep in [*sleeps, 0.0]}
        for r in range(args.rounds):
            servers = [service([f"sim:{i}" for i in range(top)], "null", SIM_DEVICES=top,
                               MODEL_REPOSITORY=repos[0.0], WORKERS_PER_DEVICE=workers)]
            try:
                ceiling.append(measure(servers, top, args.seconds))
            finally:
                servers[0].stop()
            print(f"round {r + 1}: ceiling (sleep 0, {top} devices): {ceiling[-1]['rps']:.0f} req/s", flush=True)
            for n in counts if r % 2 == 0 else counts[::-1]:
                for kind, sleep in runs if r % 2 == 0 else runs[::-1]:
                    if kind == "one process" or kind.startswith("engine"):
                        k = int(kind.split()[2]) if kind.startswith("engine") else 0
                        servers = [service([f"sim:{i}" for i in range(n)], "null", SIM_DEVICES=n,
                                           MODEL_REPOSITORY=repos[sleep], WORKERS_PER_DEVICE=workers,
                                           FRONTENDS=k)]
                    else:
                        servers = [service(["sim:0"], "null", SIM_DEVICES=1, MODEL_REPOSITORY=repos[sleep],
                                           WORKERS_PER_DEVICE=workers) for _ in range(n)]
                    try:
                        got = measure(servers, n, args.seconds)
                    finally:
                        for s in servers:
                            s.stop()
                    found[f"{kind} {sleep:g} ms"][n].append(got)
                    print(f"round {r + 1}: {n:2} devices, {kind} {sleep:g} ms: {got['rps']:.0f} req/s, "
                          f"p50 {got['p50_ms']:.1f} ms, PSS {got['pss_mb']:.0f} MB, non-2xx {got['non_2xx']}",
                          flush=True)

    top_rps = statistics.median(x["rps"] for x in ceiling)
    print(f"\n{datetime.date.today()}, {platform.machine()}, null model, batches of one, {args.rounds} rounds "
          f"of {args.seconds:g} s, {workers} workers and wrk 2 connections per device. "
          f"Ceiling (sleep 0, {top} devices): "
          f"{top_rps:.0f} req/s ({min(x['rps'] for x in ceiling):.0f}..{max(x['rps'] for x in ceiling):.0f})\n")
    print("| devices | " + " | ".join(f"{name}: req/s (share of ideal; min..max) | PSS MB" for name in found) + " |")
    print("|---:|" + "---:|---:|" * len(found))
    for n in counts:
        cells = []
        for name, by_count in found.items():
            ideal = n * 1000 / sleep_of(name)
            rps = [x["rps"] for x in by_count[n]]
            cells += [f"{statistics.median(rps):.0f} ({statistics.median(rps) / ideal:.0%}; "
                      f"{min(rps) / ideal:.0%}..{max(rps) / ideal:.0%})",
                      f"{statistics.median(x['pss_mb'] for x in by_count[n]):.0f}"]
        print(f"| {n} | " + " | ".join(cells) + " |")
    # The sim device's own per-request host work (copies and fallback kernels) sits on top of the
    # sleep, so one sim device serves less than 1000 / sleep. Scaling proper: N devices against N
    # times one device (the first count's rate per device), the same way.
    print("\n| devices | " + " | ".join(f"{name}: req/s / (N x req/s at 1 device)" for name in found) + " |")
    print("|---:|" + "---:|" * len(found))
    rps = {name: {n: statistics.median(x["rps"] for x in by_count[n]) for n in counts}
           for name, by_count in found.items()}
    per_device = {name: rps[name][counts[0]] / counts[0] for name in found}
    for n in counts:
        print(f"| {n} | " + " | ".join(f"{rps[name][n] / (n * per_device[name]):.2f}" for name in found) + " |")
    save_results("device_scaling", args, found=found, ceiling=ceiling)
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    drawn = chart(counts, found, ceiling, sleeps, machine, workers)
    print(publish(drawn, DOCS / "device_scaling.png", plot))


def sleep_of(name: str) -> float:
    """``"one process 20 ms"`` -> 20.0"""
    return float(name.split()[-2])


def chart(counts: list[int], found: dict, ceiling: list[dict], sleeps: list[float], machine: str,
          workers_per_device: int = 1) -> dict:
    """The numbers the chart draws, medians over rounds (``docs/device_scaling.json``).

    Memory is kept for the first sleep only, the one run both as one process and as a
    process per device: there it is the comparison, at other sleeps the same process again.
    """
    def median(name: str, key: str) -> list[float]:
        return [statistics.median(x[key] for x in found[name][n]) for n in counts]

    series = {name: {"rps": median(name, "rps"), "p50_ms": median(name, "p50_ms")} for name in found}
    for name in found:
        if sleep_of(name) == sleeps[0]:
            series[name]["pss_mb"] = median(name, "pss_mb")
    rps = [x["rps"] for x in ceiling]
    return {"date": str(datetime.date.today()), "machine": machine, "workers_per_device": workers_per_device,
            "counts": counts,
            "ceiling_rps": statistics.median(rps), "ceiling_range": [min(rps), max(rps)], "series": series}


def plot(chart: dict, path: Path) -> None:
    plt = pyplot()
    # Latency only where the numbers have it: saved tables may carry throughput and memory alone.
    has_latency = any("p50_ms" in s for s in chart["series"].values())
    panels = [_throughput, _memory] + ([_latency] if has_latency else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 + 5.5 * (len(panels) - 1), 5.5),
                             width_ratios=[1.4] + [1] * (len(panels) - 1))
    colours = dict(zip(sorted({sleep_of(name) for name in chart["series"]}, reverse=True),
                       plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for ax, panel in zip(axes, panels, strict=True):
        panel(ax, chart, colours)
        ax.set_xscale("log", base=2)
        ax.set_xticks(chart["counts"], [str(n) for n in chart["counts"]])
        ax.set_xlabel("sim devices")
        ax.grid(alpha=0.3, which="both")
    workers = chart.get("workers_per_device", 1)  # charts saved before the option ran 1
    fig.suptitle(f"One process vs a process per device, null model (each request sleeps on its device, "
                 f"GIL released; {workers} worker{'s' if workers > 1 else ''} a device), {chart['date']}, "
                 f"{chart['machine']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _lines(ax, chart: dict, colours: dict, key: str, text) -> None:
    """One line per series that has ``key``, each point labelled with its value."""
    drawn = {name: values[key] for name, values in chart["series"].items() if key in values}
    for (name, ys), below in zip(drawn.items(), below_nearest(list(drawn.values())), strict=True):
        per_device = name.startswith("per device")
        style = "s--" if per_device else "^:" if name.startswith("engine") else "o-"
        ax.plot(chart["counts"], ys, style, color=colours[sleep_of(name)],
                alpha=0.7 if per_device else 1, label=name)
        label_points(ax, chart["counts"], ys, [text(v) for v in ys], below, color=colours[sleep_of(name)])
    ax.margins(x=0.08, y=0.1)  # room for the labels of the outermost points


def _throughput(ax, chart: dict, colours: dict) -> None:
    counts = chart["counts"]
    for sleep, colour in colours.items():
        ax.plot(counts, [n * 1000 / sleep for n in counts], ":", color=colour, alpha=0.7,
                label=f"ideal at {sleep:g} ms ({1000 / sleep:g} req/s per device)")
    _lines(ax, chart, colours, "rps", lambda v: f"{v:.0f}")
    low, high = chart["ceiling_range"]
    ax.axhline(chart["ceiling_rps"], color="k", linestyle="--", label=f"front-end ceiling at batch 1: "
               f"{chart['ceiling_rps']:.0f} req/s ({low:.0f}..{high:.0f})")
    ax.set_yscale("log")
    ax.set(title="Throughput (wrk, 2 connections per device)", ylabel="requests/s (log scale)")
    ax.legend(fontsize=7, loc="upper left")


def _memory(ax, chart: dict, colours: dict) -> None:
    _lines(ax, chart, colours, "pss_mb", lambda v: f"{v:.0f}")
    ax.set_ylim(bottom=0)
    ax.set(title="Memory: summed PSS of the processes", ylabel="MB")
    ax.legend(fontsize=8, loc="upper left")


def _latency(ax, chart: dict, colours: dict) -> None:
    _lines(ax, chart, colours, "p50_ms", lambda v: f"{v:.1f}")
    ax.set_ylim(bottom=0)
    ax.set(title="p50 latency under that load", ylabel="ms")
    ax.legend(fontsize=8, loc="best")


if __name__ == "__main__":
    main()
