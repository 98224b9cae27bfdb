"""The service's metrics across processes: with ``PROMETHEUS_MULTIPROC_DIR`` set, every
process's series meet in one ``/metrics`` view.

Each process here is a fresh interpreter, as the supervisor's children are: prometheus_client reads
the variable when it is imported, so the mode cannot change inside this test process.

- two front ends count, observe and move gauges through ``metrics``' one surface; a third process's
  ``exposition()`` shows the counters summed, the histograms merged, a ``frontend`` label per front
  end, and each gauge combined by its mode; ``process_dead`` drops a gone process's live gauges;
- the negative control: the same processes without the directory each see only their own series;
- the request path's series are those of the single-process mode, plus the ``frontend`` label;
- a running process that serves no ``/metrics`` reaches the files from its writer thread: the loop's
  numbers, and a gauge read through a function (queue depth), where prometheus_client's own
  ``set_function`` would leave its first value; one that exits writes what is left at exit;
- setting the variable after prometheus_client is imported fails loudly instead of silently.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from support import wait_until
from support.servers import total

from placeenv.serve import metrics

PRELUDE = "import json, os, sys\nfrom placeenv.serve import metrics\nON_LOOP = metrics.ON_LOOP\n"
SAY = ("print(json.dumps({'pid': os.getpid(), 'text': metrics.exposition()[0].decode(),\n"
       "                  'families': sorted(metrics.families().items())}))\n")
# A writer serves no /metrics: what it counted reaches the files from its writer thread or at exit.
QUIET = "print(json.dumps({'pid': os.getpid(), 'text': ''}))\n"

# What each process does, through the surface the engine, the workers and the dispatcher use.
FRONT_END_0 = """
for _ in range(3):
    ON_LOOP.count("digits", "sim:0", "ok")
ON_LOOP.count("digits", "sim:1", "overloaded")
for seconds in (0.002, 0.3):
    ON_LOOP.observe(ON_LOOP.durations, ("digits", "sim:0"), seconds)
ON_LOOP.observe(ON_LOOP.preprocess, ("digits",), 0.0001)
ON_LOOP.observe(ON_LOOP.refusals, ("digits", "overloaded"), 0.0001)
ON_LOOP.in_flight += 2
metrics.READY.set(1)
"""
FRONT_END_1 = """
for _ in range(2):
    ON_LOOP.count("digits", "sim:0", "ok")
for seconds in (0.002, 7.0):
    ON_LOOP.observe(ON_LOOP.durations, ("digits", "sim:0"), seconds)
ON_LOOP.in_flight += 2
ON_LOOP.in_flight -= 1
metrics.READY.set(1)
"""
ENGINE = """
metrics.WORKER_UP.labels("sim:0-0", "sim:0").set(1)
metrics.QUEUE_DEPTH.labels("sim:0").set_function(lambda: 4)
metrics.child(metrics.PLACE_CHECKS, "input", "sim:0").inc(5)
metrics.READY.set(1)
"""
# An engine being replaced, not yet marked dead: it still reports its worker and queue, and is not ready.
OLD_ENGINE = """
metrics.WORKER_UP.labels("sim:0-0", "sim:0").set(1)
metrics.QUEUE_DEPTH.labels("sim:0").set_function(lambda: 2)
metrics.child(metrics.PLACE_CHECKS, "input", "sim:0").inc(1)
metrics.READY.set(0)
"""
# The front end that answers the scrape: it is ready itself, and counts nothing.
READER = "metrics.READY.set(1)\n"


def run(code: str, directory: Path | None, frontend: str | None = None, say: str = SAY) -> dict:
    """``code`` in a fresh interpreter, after ``from placeenv.serve import metrics``; its pid and
    (``say=SAY``) its exposition() and families() after the code ran."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir", "PLACEENV_FRONTEND_INDEX")}
    if directory is not None:
        env["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    if frontend is not None:
        env["PLACEENV_FRONTEND_INDEX"] = frontend
    result = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code) + say], env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    said = json.loads(result.stdout.splitlines()[-1])
    said["samples"] = parse(said["text"])
    return said


def parse(text: str) -> dict[tuple[str, tuple], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def merged(directory: Path) -> dict[tuple[str, tuple], float]:
    """The directory's series as any front end would merge them, read from this (single-process) test."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in MultiProcessCollector(None, path=str(directory)).collect() for sample in family.samples}


def names(samples: dict) -> set[str]:
    return {name for name, _ in samples}


def test_every_processs_series_meet_in_one_view(tmp_path):
    front_0 = run(FRONT_END_0, tmp_path, frontend="0", say=QUIET)
    run(FRONT_END_1, tmp_path, frontend="1", say=QUIET)
    old_engine, _ = run(OLD_ENGINE, tmp_path, say=QUIET), run(ENGINE, tmp_path, say=QUIET)
    seen = run(READER, tmp_path, frontend="2")["samples"]

    # counters: summed over processes, one series per front end
    assert total(seen, "inference_requests_total", model="digits", device="sim:0", status="ok") == 5
    assert total(seen, "inference_requests_total", status="ok", frontend="0") == 3
    assert total(seen, "inference_requests_total", status="ok", frontend="1") == 2
    assert total(seen, "inference_requests_total", device="sim:1", status="overloaded", frontend="0") == 1
    assert total(seen, "placeenv_place_checks_total", stage="input", device="sim:0") == 6
    # histograms: buckets, counts and sums merged, cumulative as one process's would be
    duration = "inference_request_duration_seconds"
    assert total(seen, duration + "_count", model="digits", device="sim:0") == 4
    assert total(seen, duration + "_bucket", le="0.0025") == 2  # 0.002 from each front end
    assert total(seen, duration + "_bucket", le="0.5") == 3
    assert total(seen, duration + "_bucket", le="10.0", frontend="1") == 2
    assert total(seen, duration + "_bucket", le="+Inf") == 4
    assert abs(total(seen, duration + "_sum") - 7.304) < 1e-9
    assert total(seen, "inference_preprocess_duration_seconds_bucket", le="0.001", frontend="0") == 1
    assert total(seen, "inference_refusal_duration_seconds_bucket", le="0.001", status="overloaded") == 1
    # gauges, by their modes: livesum (in flight, queue depth), livemax (worker up), livemin (ready)
    assert total(seen, "inference_in_flight_requests", frontend="0") == 2
    assert total(seen, "inference_in_flight_requests", frontend="1") == 1
    assert total(seen, "inference_in_flight_requests") == 3
    assert total(seen, "inference_queue_depth", device="sim:0") == 4 + 2
    assert total(seen, "worker_up", worker="sim:0-0", device="sim:0") == 1  # not 2: counted once
    assert total(seen, "service_ready") == 0  # the old engine is not ready
    assert not any(dict(labels).keys() & {"pid"} for _, labels in seen)

    metrics.process_dead(old_engine["pid"], str(tmp_path))  # as the supervisor, which is not in the mode
    metrics.process_dead(front_0["pid"], str(tmp_path))
    seen = run(READER, tmp_path, frontend="2")["samples"]
    assert total(seen, "service_ready") == 1  # every live process is ready
    assert total(seen, "inference_queue_depth", device="sim:0") == 4
    assert total(seen, "worker_up", worker="sim:0-0", device="sim:0") == 1
    assert ("inference_in_flight_requests", (("frontend", "0"),)) not in seen  # gone with its process
    assert total(seen, "inference_in_flight_requests") == 1
    assert total(seen, "inference_requests_total", status="ok") == 5  # what was answered stays counted
    assert total(seen, "placeenv_place_checks_total") == 6


def test_without_the_directory_each_process_sees_only_its_own():
    """Negative control: the same processes, no PROMETHEUS_MULTIPROC_DIR: no merge, no frontend label."""
    front_0 = run(FRONT_END_0, None, frontend="0")["samples"]
    front_1 = run(FRONT_END_1, None, frontend="1")["samples"]
    seen = run(READER, None, frontend="2")["samples"]
    assert total(front_0, "inference_requests_total", status="ok") == 3
    assert total(front_1, "inference_requests_total", status="ok") == 2
    assert total(front_1, "inference_in_flight_requests") == 1
    assert total(seen, "inference_requests_total") == 0 and total(seen, "inference_in_flight_requests") == 0
    assert not any("frontend" in dict(labels) for samples in (front_0, front_1) for _, labels in samples)
    assert "process_cpu_seconds_total" in names(seen)  # this process's own collectors: single-process mode


def _request_path_series(samples: dict) -> dict:
    """The per-request series without their frontend label: what both modes must agree on."""
    families = ("inference_requests", "inference_request_duration_seconds",
                "inference_preprocess_duration_seconds", "inference_refusal_duration_seconds",
                "inference_in_flight_requests")
    return {(name, tuple(item for item in labels if item[0] != "frontend")): value
            for (name, labels), value in samples.items() if name.startswith(families)}


def test_the_request_path_series_are_the_same_in_both_modes(tmp_path):
    """Names, types, labels and buckets of ``LoopMetrics``'s series and of the multiprocess metrics agree."""
    single, shared = run(FRONT_END_0, None), run(FRONT_END_0, tmp_path)
    assert _request_path_series(single["samples"]) == _request_path_series(shared["samples"])
    assert single["families"] == shared["families"]
    assert dict(single["families"])["inference_requests"] == "counter"
    assert dict(single["families"]) == metrics.families()  # this test process's mode: single
    # the control: one more observation in one mode shows
    extra = run(FRONT_END_0 + "ON_LOOP.observe(ON_LOOP.durations, ('digits', 'sim:0'), 0.002)\n", None)
    assert _request_path_series(extra["samples"]) != _request_path_series(shared["samples"])


POLLED = """
from prometheus_client import Gauge
jobs = []
metrics.QUEUE_DEPTH.labels("sim:0").set_function(lambda: len(jobs))
# prometheus_client's own set_function, for comparison: it answers only this process's collect
plain = Gauge("plain_queue_depth", "", ["device"], multiprocess_mode="livesum")
plain.labels("sim:0").set_function(lambda: len(jobs))
print("ready", flush=True)
for line in sys.stdin:
    jobs[:] = [None] * int(line)
    ON_LOOP.count("digits", "sim:0", "ok")
    ON_LOOP.observe(ON_LOOP.durations, ("digits", "sim:0"), 0.02)
    ON_LOOP.in_flight = int(line)
    print("set", flush=True)
"""


def test_a_running_process_reaches_the_others_without_serving_metrics(tmp_path):
    """The writer thread copies the loop's numbers and the queue depth's function to the files while
    the process runs, though nothing in it serves /metrics."""
    env = {k: v for k, v in os.environ.items() if k != "PLACEENV_FRONTEND_INDEX"}
    env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path)
    engine = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(POLLED)], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert engine.stdout.readline() == "ready\n", engine.stderr.read()
        assert total(merged(tmp_path), "inference_queue_depth", device="sim:0") == 0
        engine.stdin.write("3\n")
        engine.stdin.flush()
        assert engine.stdout.readline() == "set\n"
        wait_until(lambda: total(merged(tmp_path), "inference_queue_depth", device="sim:0") == 3, 10,
                   lambda: f"the queue depth in the files: {merged(tmp_path)}")
        wait_until(lambda: total(merged(tmp_path), "inference_requests_total", status="ok") == 1
                   and total(merged(tmp_path), "inference_request_duration_seconds_bucket", le="0.025") == 1
                   and total(merged(tmp_path), "inference_in_flight_requests", frontend="engine") == 3, 10,
                   lambda: f"the loop's numbers in the files: {merged(tmp_path)}")
        # the negative control: the same function on prometheus_client's Gauge never reaches the files
        assert total(merged(tmp_path), "plain_queue_depth", device="sim:0") == 0
    finally:
        engine.stdin.close()
        assert engine.wait(30) == 0, engine.stderr.read()


def test_setting_the_directory_after_prometheus_client_is_imported_fails(tmp_path):
    """The values would stay in this process, out of the merge: the import says so instead."""
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}

    def imported(first: str) -> subprocess.CompletedProcess:
        code = f"{first}\nimport os\nos.environ['PROMETHEUS_MULTIPROC_DIR'] = {str(tmp_path)!r}\n" \
               "import placeenv.serve.metrics\n"
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              timeout=60, check=False)

    late = imported("import prometheus_client")
    assert late.returncode != 0 and "PROMETHEUS_MULTIPROC_DIR changed after" in late.stderr, late.stderr
    early = imported("pass")  # the control: set before the import, as the supervisor does
    assert early.returncode == 0, early.stderr


def test_each_process_reports_its_own_resident_memory():
    # One process, then an engine and two front ends: the engine's figure holds Paddle and the models; a front
    # end's does not. The control: the front ends' are their own, well under the engine's.
    from support.servers import ServiceProcess

    name = "placeenv_process_resident_memory_bytes"
    with ServiceProcess(MODELS="digits") as proc:
        alone = proc.by_label(name, "process")
    assert set(alone) == {"engine"} and alone["engine"] > 200 * 2**20, alone
    with ServiceProcess(MODELS="digits", FRONTENDS=2) as proc:
        # A front end writes its figure every quarter second; the first scrape may precede one.
        found = wait_until(lambda: (lambda seen: seen if set(seen) == {"engine", "0", "1"} else None)(
            proc.by_label(name, "process")), 30, "no resident memory from every process")
    assert found["engine"] > 200 * 2**20, found
    assert all(20 * 2**20 < found[i] < found["engine"] / 2 for i in ("0", "1")), found
