"""The pictures: the load-test report from Locust's CSVs, and the benchmark charts from their numbers.

The report's summary is what a reader takes from docs/loadtest.png: it must say what the run
did (requests, leaks, the gate's verdict), not just draw lines. Its real run is test_prometheus_e2e.py's
(the Locust run with isolation, with Prometheus beside); these cases are written runs. The benchmark
charts are drawn again from saved numbers (docs/*.json) without measuring, so each must draw from such a dict.
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import pytest

from loadtest import report

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_service  # noqa: E402
import charts  # noqa: E402
import device_scaling  # noqa: E402

PNG = b"\x89PNG"


def _write(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=list(rows[0]))
        out.writeheader()
        out.writerows(rows)


def _fake_run(prefix: Path, leaks: list[float], failures: int = 0) -> None:
    """Locust's and the sampler's CSVs for a 2-device run; the sampler writes the service's leak
    total on every device's row, as the locustfile does."""
    _write(Path(f"{prefix}_stats.csv"), [{"Type": "", "Name": "Aggregated", "Request Count": 100, "Failure Count":
                                          failures, "Requests/s": 10.0, "50%": 20, "99%": 90}])
    _write(Path(f"{prefix}_stats_history.csv"), [
        {"Timestamp": 1000 + t, "User Count": 4, "Name": "Aggregated", "50%": 20 if t else "N/A",
         "95%": 60 if t else "N/A", "99%": 90 if t else "N/A"} for t in range(len(leaks))])
    _write(Path(f"{prefix}_service.csv"), [
        {"elapsed_s": t, "device": d, "requests_ok_total": 10 * t, "queue_depth": t % 3, "leaks_total": leak}
        for t, leak in enumerate(leaks) for d in ("sim:0", "sim:1")])


def test_report_counts_a_leak_once_and_fails(tmp_path):
    _fake_run(tmp_path / "run", leaks=[0, 0, 1, 3, 3])
    summary = report.render(str(tmp_path / "run"), str(tmp_path / "run.png"))
    assert summary["leaks"] == 3, "the total on every device's row is one series, not one per device"
    assert summary["verdict"] == "FAIL"
    assert summary["served"] == {"sim:0": 40, "sim:1": 40}
    assert summary["samples"] == 5


def test_report_fails_on_failures_over_the_limit(tmp_path):
    _fake_run(tmp_path / "run", leaks=[0, 0, 0], failures=2)
    prefix, png = str(tmp_path / "run"), str(tmp_path / "run.png")
    assert report.render(prefix, png, max_failure_ratio=0.01)["verdict"] == "FAIL"
    assert report.render(prefix, png, max_failure_ratio=0.05)["verdict"] == "PASS"


@pytest.mark.parametrize("name", ["bench_service_digits", "bench_service_mobilenet", "device_scaling"])
def test_benchmark_charts_draw_again_from_their_saved_numbers(tmp_path, name):
    shutil.copy(ROOT / "docs" / f"{name}.json", tmp_path)
    plot = device_scaling.plot if name == "device_scaling" else bench_service.plot
    assert charts.replot(tmp_path / f"{name}.json", plot).read_bytes().startswith(PNG)


def _wrk(rps: float) -> dict:
    return {"rps": rps, "p50_ms": 10.0, "p99_ms": 30.0, "non_2xx": 0}


def test_bench_service_chart_from_raw_results(tmp_path):
    c1 = [{"bare": 1.0, "floor": 1.5, "service": 2.0}, {"bare": 1.2, "floor": 1.6, "service": 2.1}]
    raw = {"model": "digits", "devices": ["sim:0", "sim:1"], "connections": 16, "date": "2026-01-01",
           "machine": "x86_64, 2 cores", "c1_rounds": c1, "c1_turns": c1 * 3,
           "bare": {"threads": {"rps": 900.0, "p50_ms": 2.0}}, "service_sat": _wrk(1000),
           "global_lock_sat": _wrk(400), "process_per_device_sat": _wrk(1100), "batching_off_sat": _wrk(500),
           "service_rss_mb": 330.0, "process_per_device_rss_mb": 660.0}
    chart = bench_service.chart(raw)
    assert chart["throughput_rps"]["service"] == 1000
    assert chart["c1_p50_ms"]["in rounds (2)"]["service_over"] == pytest.approx(0.95)
    path = charts.publish(chart, tmp_path / "bench_service_digits.png", bench_service.plot)
    assert path.read_bytes().startswith(PNG)
    assert json.loads(path.with_suffix(".json").read_text()) == chart


def test_device_scaling_chart_from_raw_results_has_a_latency_panel(tmp_path):
    counts = [1, 2]
    found = {name: {n: [{"rps": 40.0 * n, "p50_ms": 25.0, "pss_mb": 300.0 * n}] * 2 for n in counts}
             for name in ("one process 20 ms", "one process 5 ms", "per device 20 ms")}
    chart = device_scaling.chart(counts, found, [{"rps": 1000.0}, {"rps": 1100.0}], [20.0, 5.0], "test")
    assert "pss_mb" not in chart["series"]["one process 5 ms"]
    assert chart["ceiling_range"] == [1000.0, 1100.0]
    path = charts.publish(chart, tmp_path / "device_scaling.png", device_scaling.plot)
    assert path.read_bytes().startswith(PNG)


def test_labels_of_close_lines_go_to_opposite_sides():
    below = charts.below_nearest([[45, 100], [45, 110], [1000, 1050]])
    assert below == [[False, True], [True, False], [False, False]]
