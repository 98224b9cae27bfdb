"""End to end with real tools: the service on 4 sim devices, Locust load, a real Prometheus.

Checks that every PromQL expression the Grafana dashboards use returns data,
that no device leaked, and that every device served, with Locust's traffic through
the bundled pipelines too (classify, ocr: a leak in any step of theirs counts); then,
as the negative control, that the same queries see leaks (and the Locust gate fails)
with ``PLACEENV_ISOLATION=off``, in the pipelines' steps too.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import wait_until
from support.dashboards import dashboard_exprs
from support.servers import Prometheus, ServiceProcess, free_port
from support.tools import need_tool

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


def locust(url: str, seconds: int, csv: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [LOCUST, "-f", "loadtest/", "--host", url, "-u", "16", "-r", "8", "-t", f"{seconds}s",
         "--csv", str(csv), "--html", str(csv) + ".html"],
        cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120, check=False,
    )


def wait_for_scrapes(prom: Prometheus, job: str, since: float, timeout: float = 30) -> None:
    """Until Prometheus holds a successful scrape of ``job`` taken after ``since`` (``time.time()``): what it
    shows is then what the service had counted by then (it scrapes every second)."""
    def scraped_since() -> bool:
        return any(float(s["value"][1]) > since for s in prom.query(f'timestamp(up{{job="{job}"}} == 1)'))

    wait_until(scraped_since, timeout, f"prometheus is not scraping {job}", interval=0.2)
    assert prom.query(f'up{{job="{job}"}} == 1'), f"prometheus is not scraping {job}"


def test_dashboards_have_data_no_leaks_and_the_gate_can_fire(tmp_path):
    exprs = dashboard_exprs()
    assert len(exprs) >= 6
    on_port, off_port = free_port(), free_port()
    prom = Prometheus(tmp_path, {"isolation_on": on_port, "isolation_off": off_port})
    try:
        with ServiceProcess(port=on_port, MODELS=MODELS) as on:
            run = locust(on.url, 8, tmp_path / "on")
            assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
            assert "leak gate: PASS" in run.stdout + run.stderr
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

        with ServiceProcess(port=off_port, MODELS=MODELS, ISOLATION="off") as off:
            run = locust(off.url, 8, tmp_path / "off")
            assert run.returncode != 0, "the leak gate did not fire with isolation off"
            assert "leak gate: FAIL" in run.stdout + run.stderr
            # It fired for leaks during the run (not only for failed requests): the gate counts what grew.
            grown = re.search(r"(\d+) device leaks, e\.g\.", run.stdout + run.stderr)
            assert grown and int(grown.group(1)) > 0, run.stdout[-3000:] + run.stderr[-3000:]
            wait_for_scrapes(prom, "isolation_off", since=time.time())
            assert prom.value('sum(placeenv_device_leaks_total{job="isolation_off"}) or vector(0)') > 0
            # The pipelines' steps leaked too, counted by step.
            assert prom.value('sum(placeenv_pipeline_step_device_leaks_total{job="isolation_off"}) or vector(0)') > 0
    finally:
        prom.stop()
