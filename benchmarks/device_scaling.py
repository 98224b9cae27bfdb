"""Throughput against the number of devices, one process for all of them or one per device.

    python benchmarks/device_scaling.py [--counts 1,2,4,8,16] [--sleeps-ms 20,5,2] [--rounds 2] [--seconds 5]

The null model (``benchmarks/repository/null``) with ``sleep_ms`` per batch and batches of
one: each forward pass sleeps with the GIL released, a stand-in for an accelerator kernel
that leaves the host CPU free, so a device serves at most ``1000 / sleep_ms`` requests a
second and N devices ``N`` times that (the ideal line). In each round, for each count N:

  one process    the service on sim:0..N-1, one worker each, for every sleep in --sleeps-ms
  per device     N service processes on one sim device each, the load split evenly, for the
                 first sleep only (16 processes take a minute to start on two cores)
  ceiling        (once per round) the service on the most devices with sleep 0: what the front
                 end alone can feed at batch 1, whatever the devices

wrk with 2 connections per device, ``/predict``. Prints throughput, its share of the ideal
and the processes' summed PSS (shared pages counted once per process share); writes
``results/device_scaling.json`` and ``docs/device_scaling.png``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_service import save_results, service, warm, wrk  # noqa: E402

BODY = json.dumps({"model": "null", "inputs": [[0.5] * 64]})


def pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def repository(tmp: Path, sleep_ms: float) -> Path:
    root = tmp / "repository"
    shutil.copytree(ROOT / "benchmarks" / "repository" / "null", root / "null")
    (root / "null" / "config.yaml").write_text(f"max_batch_size: 1\nparameters:\n  sleep_ms: {sleep_ms}\n")
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
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    sleeps = [float(x) for x in args.sleeps_ms.split(",")]
    runs = [("one process", sleep) for sleep in sleeps] + [("per device", sleeps[0])]
    found: dict = {f"{kind} {sleep:g} ms": {n: [] for n in counts} for kind, sleep in runs}
    ceiling: list[dict] = []
    top = max(counts)
    with tempfile.TemporaryDirectory() as tmp:
        repos = {sleep: str(repository(Path(tmp) / f"{sleep:g}", sleep)) for sleep in [*sleeps, 0.0]}
        for r in range(args.rounds):
            servers = [service([f"sim:{i}" for i in range(top)], "null", SIM_DEVICES=top,
                               MODEL_REPOSITORY=repos[0.0], WORKERS_PER_DEVICE=1)]
            try:
                ceiling.append(measure(servers, top, args.seconds))
            finally:
                servers[0].stop()
            print(f"round {r + 1}: ceiling (sleep 0, {top} devices): {ceiling[-1]['rps']:.0f} req/s", flush=True)
            for n in counts if r % 2 == 0 else counts[::-1]:
                for kind, sleep in runs if r % 2 == 0 else runs[::-1]:
                    if kind == "one process":
                        servers = [service([f"sim:{i}" for i in range(n)], "null", SIM_DEVICES=n,
                                           MODEL_REPOSITORY=repos[sleep], WORKERS_PER_DEVICE=1)]
                    else:
                        servers = [service(["sim:0"], "null", SIM_DEVICES=1, MODEL_REPOSITORY=repos[sleep],
                                           WORKERS_PER_DEVICE=1) for _ in range(n)]
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
          f"of {args.seconds:g} s, wrk 2 connections per device. Ceiling (sleep 0, {top} devices): "
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
    plot(counts, found, top_rps, ROOT / "docs" / "device_scaling.png")


def sleep_of(name: str) -> float:
    """``"one process 20 ms"`` -> 20.0"""
    return float(name.split()[-2])


def plot(counts, found, ceiling: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    colours = dict(zip(sorted({sleep_of(name) for name in found}, reverse=True),
                       plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for name, by_count in found.items():
        sleep, per_device = sleep_of(name), name.startswith("per device")
        if not per_device:
            ax.plot(counts, [n * 1000 / sleep for n in counts], ":", color=colours[sleep], alpha=0.7,
                    label=f"ideal at {sleep:g} ms ({1000 / sleep:g} req/s per device)")
        values = [statistics.median(x["rps"] for x in by_count[n]) for n in counts]
        ax.plot(counts, values, "s--" if per_device else "o-", color=colours[sleep],
                alpha=0.6 if per_device else 1, label=name)
        for n, v in zip(counts, values, strict=True):
            ax.annotate(f"{v:.0f}", (n, v), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    ax.axhline(ceiling, color="k", linestyle="--", label=f"front-end ceiling at batch 1 ({ceiling:.0f} req/s)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set_xlabel("sim devices (each request sleeps on its device, GIL released)")
    ax.set_ylabel("requests/s")
    ax.set_title("Throughput against devices: one process vs a process per device")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
