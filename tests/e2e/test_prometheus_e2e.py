"""End to end with real tools: the service on 4 sim devices, Locust load, a real Prometheus.

Checks that every PromQL expression the Grafana dashboards use returns data,
that no device leaked, and that every device served, with Locust's traffic through
the bundled pipelines too (classify, ocr: a leak in any step of theirs counts); then,
as the negative control, that the same queries see leaks (and the Locust gate fails)
with ``PLACEENV_ISOLATION=off``, in the pipelines' steps too. The run with isolation is also the load-test
report's real run (loadtest/report.py: its picture and its summary, from Locust's CSVs and the sampler's).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import wait_until
from support.dashboards import dashboard_exprs
from support.servers import Prometheus, ServiceProcess, free_port, total
from support.tools import need_tool

from loadtest import report

ROOT = Path(__file__).resolve().parents[2]
LOCUST = str(Path(sys.executable).with_name("locust"))


@pytest.fixture(scope="module", autouse=True)
def tools():
    """Debian's prometheus, before anything of the module starts."""
    need_tool("prometheus")


#: The bundled examples and pipelines (mobilenet among classify's steps; ocr_rec, which ocr_read calls).
MODELS = "digits,classify,ocr,ocr_rec"
PIPELINE_STEPS = {("classify", "classify_decode"), ("classify", "mobilenet"), ("classify", "classify_topk"),
                  ("ocr", "ocr_decode"), ("ocr", "ocr_det"), ("ocr", "ocr_read"), ("ocr_read", "ocr_rec")}


PNG = b"\x89PNG"
#: Locust's -t where a run ends at a check (SIGTERM, which Locust answers with its gate): only an outer bound,
#: some 40 times what the check takes here.
BOUND_S = 90


def locust(url: str, seconds: int, csv: Path, until=None) -> tuple[int, str]:
    """Locust's 16 users for ``seconds``, or, with ``until``, until that check holds; (exit code, output)."""
    run = subprocess.Popen(
        [LOCUST, "-f", "loadtest/", "--host", url, "-u", "16", "-r", "8", "-t", f"{seconds}s",
         "--csv", str(csv), "--csv-full-history", "--html", str(csv) + ".html"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if until is not None:
            try:
                wait_until(lambda: run.poll() is not None or until(), seconds, "the check never held", interval=0.2)
            finally:
                run.send_signal(signal.SIGTERM)  # (its output, the gate's, comes with a failure too)
        output, _ = run.communicate(timeout=seconds + 120)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    return run.returncode, output


def wait_for_scrapes(prom: Prometheus, job: str, since: float, timeout: float = 30) -> None:
    """Until Prometheus holds a successful scrape of ``job`` taken after ``since`` (``time.time()``): what it
    shows is then what the service had counted by then (it scrapes every second)."""
    def scraped_since() -> bool:
        return any(float(s["value"][1]) > since for s in prom.query(f'timestamp(up{{job="{job}"}} == 1)'))

    wait_until(scraped_since, timeout, f"prometheus is not scraping {job}", interval=0.2)
    assert prom.query(f'up{{job="{job}"}} == 1'), f"prometheus is not scraping {job}"


@pytest.mark.timeout(600)  # two services, two Locust runs, the report: minutes on a slow, busy machine
def test_dashboards_have_data_no_leaks_and_the_gate_can_fire(tmp_path):
    exprs = dashboard_exprs()
    assert len(exprs) >= 6
    on_port, off_port = free_port(), free_port()
    prom = Prometheus(tmp_path, {"isolation_on": on_port, "isolation_off": off_port})
    try:
        with ServiceProcess(port=on_port, MODELS=MODELS) as on:
            code, output = locust(on.url, 8, tmp_path / "on")
            assert code == 0, output[-3000:]
            assert "leak gate: PASS" in output
            wait_for_scrapes(prom, "isolation_on", since=time.time())
            empty = [expr for expr in exprs if not prom.query(expr)]
            assert empty == [], f"dashboard queries with no data: {empty}"
            assert prom.value('sum(placeenv_device_leaks_total{job="isolation_on"}) or vector(0)') == 0
            by_device = 'sum by (device) (inference_requests_total{job="isolation_on",status="ok"})'
            served = {s["metric"]["device"]: float(s["value"][1]) for s in prom.query(by_device)}
            assert set(served) == {"sim:0", "sim:1", "sim:2", "sim:3"}
            assert all(n > 0 for n in served.values())
            assert prom.value('sum(placeenv_place_checks_total{job="isolation_on"})') > 0
            # Locust went through every step of both pipelines, each checked, none leaking.
            steps = 'sum by (pipeline, step) (inference_pipeline_step_queue_duration_seconds_count{job="isolation_on"})'
            assert {(s["metric"]["pipeline"], s["metric"]["step"]) for s in prom.query(steps)} >= PIPELINE_STEPS
            assert prom.value('sum(placeenv_pipeline_step_device_leaks_total{job="isolation_on"}) or vector(0)') == 0

        # The report of that run: what a reader takes from docs/loadtest.png (the run's requests, leaks and
        # verdict, every device's share), drawn from Locust's CSVs and the sampler's.
        summary = report.render(str(tmp_path / "on"), str(tmp_path / "on.png"))
        assert (tmp_path / "on.png").read_bytes().startswith(PNG)
        assert summary["requests"] > 0 and summary["leaks"] == 0
        assert summary["verdict"] == "PASS", summary["problems"]
        assert set(summary["served"]) == {"sim:0", "sim:1", "sim:2", "sim:3"}
        assert all(n > 0 for n in summary["served"].values())
        assert summary["p50_ms"] <= summary["p99_ms"]
        assert summary["samples"] >= 3, "the sampler's rows are all read, one point per sample"

        with ServiceProcess(port=off_port, MODELS=MODELS, ISOLATION="off") as off:
            # The run ends once a device and a pipeline's step have leaked under its load (the gate counts what
            # grew: the warm-up may have leaked already): what it shows is that the gate fires.
            leaks = ("placeenv_device_leaks_total", "placeenv_pipeline_step_device_leaks_total")
            before = [off.total(name) for name in leaks]

            def leaked() -> bool:
                samples = off.metrics()
                return all(total(samples, name) > n for name, n in zip(leaks, before))

            code, output = locust(off.url, BOUND_S, tmp_path / "off", until=leaked)
            assert code != 0, "the leak gate did not fire with isolation off"
            assert "leak gate: FAIL" in output
            # It fired for leaks during the run (not only for failed requests): the gate counts what grew.
            grown = re.search(r"(\d+) device leaks, e\.g\.", output)
            assert grown and int(grown.group(1)) > 0, output[-3000:]
            # Prometheus sees both (the service's counters hold still now, and it scrapes every second; a
            # scrape may still miss what the engine counted last, which its front end's /metrics shows in a
            # quarter of a second): the pipelines' steps leaked too, counted by step.
            wait_for_scrapes(prom, "isolation_off", since=time.time())
            seen = [f'sum({name}{{job="isolation_off"}}) or vector(0)' for name in leaks]
            wait_until(lambda: all(prom.value(expr) > 0 for expr in seen), 30,
                       lambda: f"Prometheus sees no leak with isolation off: {[prom.value(e) for e in seen]}",
                       interval=0.5)
    finally:
        prom.stop()
