"""The load test when nothing answers: a failure per request, a log line per interval, and a verdict.

Locust runs as users run it (``locust -f loadtest/``, the repository's locust.conf)
against a port where nothing listens, with and without ``--prometheus``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from servers import free_port

ROOT = Path(__file__).resolve().parent.parent
LOCUST = str(Path(sys.executable).with_name("locust"))

#: Locust's own end-of-run tables have a row per request name (14 of them) in each of
#: three tables, about 70 lines in all; our part is the warning every 5 s and the verdict.
#: A traceback per refused request (the old behaviour) gave thousands of lines in 4 s.
MAX_LINES = 100


@pytest.mark.parametrize("prometheus", [False, True], ids=["service", "prometheus"])
def test_locust_with_nothing_listening_fails_once_with_a_verdict(tmp_path: Path, prometheus: bool):
    host = f"http://127.0.0.1:{free_port()}"
    command = [LOCUST, "-f", "loadtest/", "--host", host, "-u", "8", "-r", "8", "-t", "4s",
               "--csv", str(tmp_path / "run"), "--html", str(tmp_path / "run.html")]
    source = host
    if prometheus:
        source = f"http://127.0.0.1:{free_port()}"
        command += ["--prometheus", source, "--prometheus-settle-s", "0"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    lines = output.splitlines()

    assert result.returncode != 0, output[-3000:]
    what = "Prometheus" if prometheus else "service"
    assert re.search(rf"leak gate: FAIL: {what} unreachable at {re.escape(source)} \(.*refused", output), \
        output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert len(lines) <= MAX_LINES, f"{len(lines)} lines:\n" + "\n".join(lines[:60])
    # Every request failed, each counted once, and the log said so once per interval.
    requests, failures = map(int, re.search(r"requests (\d+), failures (\d+)", output).groups())
    assert requests > 0 and failures == requests
    assert 1 <= len(re.findall(r"service unreachable at .* requests without an answer", output)) <= 2
