"""The load test when nothing answers: a failure per request, a log line per interval, and a verdict;
and ``-t`` honoured whatever the locustfiles' imports cost.

Locust runs as users run it (``locust -f loadtest/``, the repository's locust.conf)
against a port where nothing listens, with and without ``--prometheus``, and
against a server that cuts every answer off in the body (a service dying mid-drain).
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path

import pytest

from support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
LOCUST = str(Path(sys.executable).with_name("locust"))

#: Locust's own end-of-run tables have a row per request name (14 of them) in each of
#: three tables, about 66 lines in all; our part is the warning every 5 s and the verdict.
#: The bound leaves room for a few more request names and a second warning, while a
#: traceback per failed request (the old behaviour) gives thousands of lines in 4 s.
MAX_LINES = 100
#: How far a run may stray from its ``-t``: Locust's own shutdown and a busy machine's scheduling.
RUN_TIME_SLACK_S = 1.0


def run_locust(tmp_path: Path, host: str, *options: str, locustfiles: str = "loadtest/",
               ) -> tuple[subprocess.CompletedProcess, str]:
    command = [LOCUST, "-f", locustfiles, "--host", host, "-u", "8", "-r", "8", "-t", "4s",
               "--csv", str(tmp_path / "run"), "--html", str(tmp_path / "run.html"), *options]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    return result, result.stdout + result.stderr


def run_time(output: str) -> float:
    """Seconds from Locust arming ``-t`` to the limit firing, by Locust's own log."""
    def logged(message: str) -> datetime:
        stamp = re.search(r"^\[([\d-]+ [\d:,]+)\] .*" + re.escape(message), output, re.MULTILINE)
        assert stamp, f"Locust did not log {message!r}:\n{output[-3000:]}"
        return datetime.strptime(stamp[1], "%Y-%m-%d %H:%M:%S,%f")
    return (logged("--run-time limit reached") - logged("Run time limit set to 4 seconds")).total_seconds()


#: The most requests 8 users send in a 4 s run with ``--wait-s 2``: about 40 (each user's first at once, then
#: one a second on average); 100 would need their waits to average a third of a second, 12 standard
#: deviations below their mean.
PACED_MOST = 100


def requests(output: str) -> int:
    return int(re.search(r"requests (\d+), failures", output)[1])


def assert_runs_its_time(output: str) -> None:
    assert abs(run_time(output) - 4) <= RUN_TIME_SLACK_S, f"a -t 4s run lasted {run_time(output)} s"


def assert_one_failure_per_request_and_a_verdict(result, output: str, verdict: str) -> None:
    lines = output.splitlines()
    assert result.returncode != 0, output[-3000:]
    assert re.search(verdict, output), output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert len(lines) <= MAX_LINES, f"{len(lines)} lines:\n" + "\n".join(lines[:60])
    # Every request failed, each counted once, and the log said so once per interval.
    requests, failures = map(int, re.search(r"requests (\d+), failures (\d+)", output).groups())
    assert requests > 0 and failures == requests
    assert 1 <= len(re.findall(r"service unreachable at .* requests without an answer", output)) <= 2
    assert_runs_its_time(output)


#: A locustfile whose import costs 3 s of CPU, as a heavier set of imports or a slower machine does
#: (numpy, tritonclient and scikit-learn made loadtest/'s own imports take 1.3 s here and about 4 s
#: on a machine 3-4x slower). It spins rather than sleeps: Locust has patched time.sleep by then, and
#: a gevent sleep runs the loop, which brings its clock up to date and hides the fault.
SLOW_IMPORT = """
import time
from locust import User, constant, task

started = time.perf_counter()
while time.perf_counter() - started < 3:
    pass


class Idle(User):
    wait_time = constant(0.1)

    @task
    def nothing(self):
        pass
"""


def test_run_time_is_honoured_after_a_slow_import(tmp_path: Path):
    """``-t 4s`` lasts 4 s however long the locustfiles took to import. Without loadtest's clock
    refresh (Locust times the run on gevent's cached loop clock, last read before the imports),
    the limit fires about 1 s after it is set, whatever the machine."""
    extra = tmp_path / "slow_import.py"
    extra.write_text(SLOW_IMPORT)
    result, output = run_locust(tmp_path, f"http://127.0.0.1:{free_port()}", "Idle",
                                locustfiles=f"loadtest/,{extra}")
    assert_runs_its_time(output)
    assert "the run ended before any load started" not in output, output[-3000:]


#: A locustfile that quits Locust before its test starts: what the early ``-t`` stop did.
QUIT_AT_INIT = """
import gevent
from locust import User, events, task


@events.init.add_listener
def quit_first(environment, **_):
    gevent.spawn(environment.runner.quit)


class Idle(User):
    @task
    def nothing(self):
        pass
"""


def test_a_run_that_never_started_fails_the_gate(tmp_path: Path):
    """A run that ends before any load (Locust's early stop sent 0 requests and exited 0) fails."""
    extra = tmp_path / "quit_at_init.py"
    extra.write_text(QUIT_AT_INIT)
    result, output = run_locust(tmp_path, f"http://127.0.0.1:{free_port()}", "Idle",
                                locustfiles=f"loadtest/,{extra}")
    assert result.returncode != 0, output[-3000:]
    assert "leak gate: FAIL: the run ended before any load started" in output, output[-3000:]


@pytest.mark.parametrize("prometheus", [False, True], ids=["service", "prometheus"])
def test_locust_with_nothing_listening_fails_once_with_a_verdict(tmp_path: Path, prometheus: bool):
    host = f"http://127.0.0.1:{free_port()}"
    source, options = host, []
    if prometheus:
        source = f"http://127.0.0.1:{free_port()}"
        options = ["--prometheus", source, "--prometheus-settle-s", "0"]
    result, output = run_locust(tmp_path, host, *options)
    what = "Prometheus" if prometheus else "service"
    assert_one_failure_per_request_and_a_verdict(
        result, output, rf"leak gate: FAIL: {what} unreachable at {re.escape(source)} \(.*refused")
    # The control of --wait-s (the test below): unpaced, the users send many more than PACED_MOST.
    assert requests(output) > 3 * PACED_MOST, output[-3000:]


@pytest.fixture
def cut_off_server():
    """Sends a status line, headers and 6 of 1000 promised bytes, then closes: every answer is cut off."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:  # the 0.2 s timeout: look at stop again
                continue
            with conn:
                try:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: 1000\r\n\r\n{\"outp")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    listener.close()


def test_locust_with_answers_cut_off_fails_once_with_a_verdict(tmp_path: Path, cut_off_server: str):
    """Paced too (``--wait-s 2``): its 8 users, each waiting a second between requests on average, send
    about 32 in 4 s, where unpaced ones send hundreds (the test above)."""
    result, output = run_locust(tmp_path, cut_off_server, "--wait-s", "2")
    assert_one_failure_per_request_and_a_verdict(
        result, output, rf"leak gate: FAIL: service unreachable at {re.escape(cut_off_server)} \(")
    assert requests(output) <= PACED_MOST, output[-3000:]
