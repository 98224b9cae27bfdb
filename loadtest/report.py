"""Turn a Locust run into one PNG: a summary with the gate's verdict, throughput per device,
latency percentiles, queue depth and device leaks.

    python -m loadtest.report results/loadtest [-o results/loadtest.png] [--max-failure-ratio 0.01]

Reads ``<prefix>_stats.csv`` (Locust's totals; it rewrites the file every second, so the
last second of the run may be missing), ``<prefix>_stats_history.csv`` (one row a second;
``--csv-full-history`` adds a row per request name, of which the report reads the
``Aggregated`` ones) and ``<prefix>_service.csv`` (``/metrics`` sampled by the locustfile
during the run). The verdict is recomputed from these files by the gate's own rule
(``loadtest.gate.evaluate``) over the sampler's window; the gate's printed verdict is the
one the run's exit code follows.
"""

from __future__ import annotations

import argparse
import csv
import textwrap
from collections import defaultdict
from pathlib import Path

from loadtest.gate import Growth, evaluate

# A sample: (elapsed s, ok requests so far, queue depth, leaks so far).
Sample = tuple[float, float, float, float]


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _number(text: str) -> float:
    """Locust writes ``N/A`` for a percentile of no requests."""
    return float(text) if text not in ("", "N/A") else float("nan")


def _percentile(text: str) -> float:
    """In the history, 0 ms is a second with no answer in the window yet: no point, not a point at 0."""
    value = _number(text)
    return value if value > 0 else float("nan")


def _by_device(service: list[dict[str, str]]) -> dict[str, list[Sample]]:
    by_device: dict[str, list[Sample]] = defaultdict(list)
    for r in service:
        by_device[r["device"]].append((float(r["elapsed_s"]), float(r["requests_ok_total"]),
                                       float(r["queue_depth"]), float(r["leaks_total"])))
    return dict(sorted(by_device.items()))


def leak_lines(by_device: dict[str, list[Sample]]) -> dict[str, list[tuple[float, float]]]:
    """The leak series worth drawing, by label.

    The sampler may write the service's total on every device's row: identical series are
    one line then, not four on top of each other, and their growth is counted once.
    """
    series = {d: [(p[0], p[3]) for p in points] for d, points in by_device.items()}
    values = {tuple(v for _, v in s) for s in series.values()}
    if len(series) > 1 and len(values) == 1:
        return {"all devices (service total)": next(iter(series.values()))}
    return series


def summarize(prefix: str, max_failure_ratio: float = 0.01) -> dict:
    """The run's figures and the gate's verdict, from the CSVs alone."""
    total = next(r for r in _rows(Path(f"{prefix}_stats.csv")) if r["Name"] == "Aggregated")
    by_device = _by_device(_rows(Path(f"{prefix}_service.csv")))
    # Keyed as the gate keys a series, by its labels, so its problem line reads the same.
    leaks = {(("series", label),): s[-1][1] - s[0][1] for label, s in leak_lines(by_device).items() if s}
    served = {d: points[-1][1] - points[0][1] for d, points in by_device.items()}
    requests, failures = int(total["Request Count"]), int(total["Failure Count"])
    verdict = evaluate(Growth(served, leaks, 0.0), requests, failures, max_failure_ratio)
    return {
        "requests": requests,
        "failures": failures,
        "failure_ratio": failures / requests if requests else 0.0,
        "max_failure_ratio": max_failure_ratio,
        "rps": float(total["Requests/s"]),
        "p50_ms": _number(total["50%"]),
        "p99_ms": _number(total["99%"]),
        "leaks": verdict.leaks,
        "served": served,
        "samples": max((len(p) for p in by_device.values()), default=0),
        "seconds": max((p[-1][0] for p in by_device.values()), default=0.0),
        "verdict": "PASS" if verdict.ok else "FAIL",
        "problems": verdict.problems,
    }


def _draw_devices(thr, queue, by_device: dict[str, list[Sample]]) -> None:
    """Ok requests per second between consecutive samples, and queue depth, one line per device."""
    for device, points in by_device.items():
        rates = [(b[0], (b[1] - a[1]) / (b[0] - a[0])) for a, b in zip(points, points[1:]) if b[0] > a[0]]
        thr.plot([t for t, _ in rates], [r for _, r in rates], marker=".", label=device)
        queue.plot([p[0] for p in points], [p[2] for p in points], marker=".", label=device)
    thr.set(title="Throughput per device (ok requests)", xlabel="s since start", ylabel="requests/s")
    queue.set(title="Queue depth per device", xlabel="s since start", ylabel="requests waiting")
    thr.set_ylim(bottom=0)
    thr.legend(fontsize=8, ncol=2, loc="lower right")
    deepest = max((p[2] for points in by_device.values() for p in points), default=0.0)
    if deepest == 0:
        _zero(queue, "queue empty in every sample")
    else:
        queue.set_ylim(bottom=0)
    queue.legend(fontsize=8, ncol=2, loc="upper left")


def _draw_latency(lat, history: list[dict[str, str]]) -> None:
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    t0 = float(history[0]["Timestamp"]) if history else 0.0
    times = [float(r["Timestamp"]) - t0 for r in history]
    for column, label in (("50%", "p50"), ("95%", "p95"), ("99%", "p99")):
        lat.plot(times, [_percentile(r[column]) for r in history], marker=".", label=label)
    # p50 and p99 are often an order of magnitude apart: a log axis keeps both readable.
    lat.set_yscale("log")
    lat.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    lat.yaxis.set_major_formatter(ScalarFormatter())
    lat.yaxis.set_minor_formatter(NullFormatter())
    lat.set(title="Latency, all requests (Locust's last 10 s)", xlabel="s since start",
            ylabel="ms (log scale)")
    lat.legend(fontsize=8, loc="upper right")


def _zero(ax, claim: str) -> None:
    """Lines that stay at 0 sit on a visible band above the axis, with what they mean in words."""
    ax.set_ylim(-0.5, 2)
    ax.text(0.5, 0.6, claim, transform=ax.transAxes, ha="center", fontsize=13, color="tab:green",
            weight="bold")


def _draw_leaks(ax, by_device: dict[str, list[Sample]]) -> None:
    """Zero leaks read as zero: one green line with the claim in words, not lines hidden under each other."""
    lines = leak_lines(by_device)
    top = max((v for s in lines.values() for _, v in s), default=0.0)
    if top == 0:
        points = next(iter(lines.values()), [])
        ax.plot([t for t, _ in points], [0.0] * len(points), color="tab:green", marker=".", linewidth=2,
                label=f"every device: {', '.join(by_device)}")
        _zero(ax, "0 leaks on every device")
    else:
        for label, points in lines.items():
            ax.step([t for t, _ in points], [v for _, v in points], where="post", marker=".", label=label)
        ax.set_ylim(-0.05 * top, top * 1.15)
    ax.set(title="placeenv_device_leaks_total", xlabel="s since start", ylabel="leaks")
    ax.legend(fontsize=8, loc="upper left")


def _draw_summary(ax, summary: dict) -> None:
    ax.axis("off")
    passed = summary["verdict"] == "PASS"
    ax.text(0.5, 0.97, f"leak gate: {summary['verdict']}", transform=ax.transAxes, ha="center", va="top",
            fontsize=18, weight="bold", color="white",
            bbox={"boxstyle": "round", "edgecolor": "none", "facecolor": "tab:green" if passed else "tab:red"})
    rows = [
        ("requests", f"{summary['requests']:,}"),
        ("throughput", f"{summary['rps']:.0f} req/s"),
        ("failures", f"{summary['failures']} ({summary['failure_ratio']:.2%})"),
        ("failure limit", f"{summary['max_failure_ratio']:.2%}"),
        ("latency p50", f"{summary['p50_ms']:.0f} ms"),
        ("latency p99", f"{summary['p99_ms']:.0f} ms"),
        ("device leaks", f"{summary['leaks']:.0f}"),
        *((f"served by {d}", f"{n:,.0f}") for d, n in summary["served"].items()),
        ("/metrics sampled", f"{summary['samples']} times in {summary['seconds']:.0f} s"),
    ]
    table = ax.table(cellText=rows, colWidths=[0.55, 0.45], loc="upper center", cellLoc="left",
                     bbox=[0, 0.88 - 0.065 * len(rows), 1, 0.065 * len(rows)])
    table.auto_set_font_size(False)
    table.set_fontsize(10)
    for (_, col), cell in table.get_celld().items():
        cell.set_edgecolor("lightgrey")
        if col == 0:
            cell.set_text_props(color="dimgrey")
    notes = summary["problems"] or ["leaks 0, every device served,", "failures within the limit"]
    # Locust rewrites _stats.csv every second: its totals can trail the gate's printed ones by that second.
    notes = [*notes, "", "totals: Locust's _stats.csv (rewritten", "every second); per device: /metrics"]
    ax.text(0.0, 0.83 - 0.065 * len(rows), "\n".join(textwrap.fill(n, 48) for n in notes),
            transform=ax.transAxes, va="top", fontsize=9, color="dimgrey")


def render(prefix: str, out: str, max_failure_ratio: float = 0.01) -> dict:
    """Draw the PNG at ``out``; returns the summary it drew."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarize(prefix, max_failure_ratio)
    history = [r for r in _rows(Path(f"{prefix}_stats_history.csv")) if r["Name"] == "Aggregated"]
    by_device = _by_device(_rows(Path(f"{prefix}_service.csv")))

    fig = plt.figure(figsize=(15, 7.5))
    grid = fig.add_gridspec(2, 3, width_ratios=[1, 1, 0.62])
    thr, lat = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    queue, leaks = fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    _draw_devices(thr, queue, by_device)
    _draw_latency(lat, history)
    _draw_leaks(leaks, by_device)
    _draw_summary(fig.add_subplot(grid[:, 2]), summary)
    for ax in (thr, lat, queue, leaks):
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)

    users = max((int(r["User Count"]) for r in history), default=0)
    fig.suptitle(f"placeenv load run: {Path(prefix).name}, {users} users, "
                 f"{len(history)} s of Locust history, {len(by_device)} devices")
    fig.tight_layout()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return {**summary, "path": str(path)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefix", nargs="?", default="results/loadtest", help="the --csv prefix of the run")
    parser.add_argument("-o", "--output", default=None, help="PNG path (default: <prefix>.png)")
    parser.add_argument("--max-failure-ratio", type=float, default=0.01, help="as the locustfile's option")
    args = parser.parse_args(argv)
    try:
        summary = render(args.prefix, args.output or f"{args.prefix}.png", args.max_failure_ratio)
    except ModuleNotFoundError as exc:
        if exc.name != "matplotlib":
            raise
        parser.exit(1, "loadtest.report draws with matplotlib, which is not installed here: "
                       "pip install 'matplotlib>=3.8' (docs/observability.md)\n")
    print(f"{summary['path']}: leak gate {summary['verdict']}, {summary['requests']} requests, "
          f"{summary['failures']} failures, {summary['leaks']:.0f} leaks")


if __name__ == "__main__":
    main()
