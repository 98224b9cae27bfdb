"""Turn a Locust run into one PNG: throughput per device, latency percentiles, queue depth, leaks.

    python -m loadtest.report results/loadtest [-o results/loadtest.png]

Reads ``<prefix>_stats_history.csv`` (Locust's ``--csv`` with
``--csv-full-history``) and ``<prefix>_service.csv`` (sampled from ``/metrics``
by the locustfile during the run).
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def render(prefix: str, out: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = [r for r in _rows(Path(f"{prefix}_stats_history.csv")) if r["Name"] == "Aggregated"]
    service = _rows(Path(f"{prefix}_service.csv"))
    t0 = float(history[0]["Timestamp"]) if history else 0.0

    fig, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=False)
    (thr, lat), (queue, leaks) = axes

    by_device: dict[str, list[tuple[float, float, float, float]]] = defaultdict(list)
    for r in service:
        by_device[r["device"]].append(
            (float(r["elapsed_s"]), float(r["requests_ok_total"]), float(r["queue_depth"]), float(r["leaks_total"]))
        )
    for device, points in sorted(by_device.items()):
        rates = [
            (b[0], (b[1] - a[1]) / (b[0] - a[0])) for a, b in zip(points, points[1:]) if b[0] > a[0]
        ]
        thr.plot([t for t, _ in rates], [r for _, r in rates], label=device)
        queue.plot([p[0] for p in points], [p[2] for p in points], label=device)
    thr.set(title="Throughput per device", xlabel="s", ylabel="requests/s")
    queue.set(title="Queue depth per device", xlabel="s", ylabel="requests waiting")
    thr.legend(fontsize=8)
    queue.legend(fontsize=8)

    times = [float(r["Timestamp"]) - t0 for r in history]
    for column, label in (("50%", "p50"), ("95%", "p95"), ("99%", "p99")):
        values = [float(r[column]) if r[column] not in ("", "N/A") else float("nan") for r in history]
        lat.plot(times, values, label=label)
    lat.set(title="Latency (all requests, rolling)", xlabel="s", ylabel="ms")
    lat.legend(fontsize=8)

    any_device = next(iter(by_device.values()), [])
    leaks.plot([p[0] for p in any_device], [p[3] for p in any_device], color="tab:red")
    top = max([p[3] for p in any_device] + [1.0])
    leaks.set(title="placeenv_device_leaks_total", xlabel="s", ylabel="leaks", ylim=(-0.05 * top, top * 1.1))

    fig.suptitle(f"placeenv load run: {Path(prefix).name}")
    fig.tight_layout()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefix", nargs="?", default="results/loadtest", help="the --csv prefix of the run")
    parser.add_argument("-o", "--output", default=None, help="PNG path (default: <prefix>.png)")
    args = parser.parse_args(argv)
    print(render(args.prefix, args.output or f"{args.prefix}.png"))


if __name__ == "__main__":
    main()
