"""Throughput against the number of devices, one process for all of them or one per device.

    python benchmarks/device_scaling.py [--counts 1,2,4,8,16] [--sleep-ms 20] [--rounds 2] [--seconds 5]

The null model (``benchmarks/repository/null``) with ``sleep_ms`` per batch and batches of
one: each forward pass sleeps with the GIL released, a stand-in for an accelerator kernel
that leaves the host CPU free, so a device serves at most ``1000 / sleep_ms`` requests a
second and N devices ``N`` times that (the ideal line). For each count N, in each round:

  one process    the service on sim:0..N-1, one worker each
  per device     N service processes on one sim device each, the load split evenly

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
    parser.add_argument("--sleep-ms", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5)
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    found = {kind: {n: [] for n in counts} for kind in ("one process", "per device")}
    with tempfile.TemporaryDirectory() as tmp:
        repo = str(repository(Path(tmp), args.sleep_ms))
        settings = {"MODEL_REPOSITORY": repo, "WORKERS_PER_DEVICE": 1}
        for r in range(args.rounds):
            for n in counts if r % 2 == 0 else counts[::-1]:
                for kind in ("one process", "per device") if r % 2 == 0 else ("per device", "one process"):
                    if kind == "one process":
                        servers = [service([f"sim:{i}" for i in range(n)], "null", SIM_DEVICES=n, **settings)]
                    else:
                        servers = [service(["sim:0"], "null", SIM_DEVICES=1, **settings) for _ in range(n)]
                    try:
                        got = measure(servers, n, args.seconds)
                    finally:
                        for s in servers:
                            s.stop()
                    found[kind][n].append(got)
                    print(f"round {r + 1}: {n:2} devices, {kind:11}: {got['rps']:.0f} req/s, "
                          f"p50 {got['p50_ms']:.1f} ms, PSS {got['pss_mb']:.0f} MB, non-2xx {got['non_2xx']}",
                          flush=True)

    ideal = {n: n * 1000 / args.sleep_ms for n in counts}
    print(f"\n{datetime.date.today()}, {platform.machine()}, null model sleeping {args.sleep_ms:g} ms per "
          f"request (batch 1), {args.rounds} rounds of {args.seconds:g} s, wrk 2 connections per device\n")
    print("| devices | ideal req/s | one process: req/s (share of ideal) | PSS MB | "
          "per device: req/s (share of ideal) | PSS MB |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in counts:
        cells = []
        for kind in ("one process", "per device"):
            rps = [x["rps"] for x in found[kind][n]]
            cells += [f"{statistics.median(rps):.0f} ({statistics.median(rps) / ideal[n]:.0%}; "
                      f"{min(rps) / ideal[n]:.0%}..{max(rps) / ideal[n]:.0%})",
                      f"{statistics.median(x['pss_mb'] for x in found[kind][n]):.0f}"]
        print(f"| {n} | {ideal[n]:.0f} | " + " | ".join(cells) + " |")
    save_results("device_scaling", args, ideal=ideal, found=found)
    plot(counts, ideal, found, ROOT / "docs" / "device_scaling.png", args.sleep_ms)


def plot(counts, ideal, found, path: Path, sleep_ms: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(counts, [ideal[n] for n in counts], "k--", label=f"ideal ({1000 / sleep_ms:g} req/s per device)")
    for kind, marker in (("one process", "o-"), ("per device", "s-")):
        values = [statistics.median(x["rps"] for x in found[kind][n]) for n in counts]
        ax.plot(counts, values, marker, label=kind)
        for n, v in zip(counts, values, strict=True):
            ax.annotate(f"{v:.0f}", (n, v), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set_xlabel("sim devices (each request sleeps on its device, GIL released)")
    ax.set_ylabel("requests/s")
    ax.set_title("Throughput against devices: one process vs a process per device")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
