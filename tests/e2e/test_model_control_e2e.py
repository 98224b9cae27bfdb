"""Loading new versions while Locust drives 32 users at the model: no request fails, readiness never
drops, no device leaks; in one process and with front ends. The negative control unloads the model
under the same load: Locust counts the failures, and its gate fails."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from support import wait_until
from support.servers import ServiceProcess, scrape, total

from placeenv.serve.config import BUNDLED

ROOT = Path(__file__).resolve().parents[2]
LOCUST = str(Path(sys.executable).with_name("locust"))
#: Locust's --wait-s: each of the 32 users waits up to this long between requests. The loads are what
#: the traffic meets while they happen, not how much of it there is: at full speed, the users took the
#: service as much CPU as the machine gave it for as long as each load took.
WAIT_S = 0.5


def locust(url: str, seconds: int, csv: Path) -> subprocess.Popen:
    """Locust, its output to ``csv``.log (a pipe read only at the end could fill and block it)."""
    with open(str(csv) + ".log", "w") as log:
        return subprocess.Popen(
            [LOCUST, "-f", "loadtest/", "--host", url, "-u", "32", "-r", "32", "-t", f"{seconds}s",
             "--max-failure-ratio", "0", "--wait-s", str(WAIT_S), "--csv", str(csv), "--html", str(csv) + ".html"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)


def finished(run: subprocess.Popen, csv: Path, end: bool = False) -> str:
    """Locust's output once it has exited; ``end``: ended now by SIGTERM, which Locust answers with its
    gate over the run so far (its ``-t`` is then only an outer bound: the scenario sets the length)."""
    if end and run.poll() is None:
        run.send_signal(signal.SIGTERM)
    run.wait(timeout=120)
    return Path(str(csv) + ".log").read_text()


class Readiness:
    """/readyz every 20 ms on a thread until stopped: how many looks, and those that were not 200."""

    def __init__(self, url: str) -> None:
        self.url, self.looks, self.not_ready = url, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(0.02):
                try:
                    status = client.get(self.url + "/readyz").status_code
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                self.looks += 1
                if status != 200:
                    self.not_ready.append(status)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def served_ok(url: str) -> float:
    return total(scrape(url), "inference_requests_total", model="digits", status="ok")


def summary(output: str) -> tuple[int, int]:
    found = re.search(r"requests (\d+), failures (\d+)", output)
    assert found, output[-3000:]
    return int(found.group(1)), int(found.group(2))


@pytest.mark.parametrize("frontends", [0, 2], ids=["one-process", "2-frontends"])
def test_new_versions_load_under_32_users_with_no_failure(tmp_path, frontends):
    repository = tmp_path / "repository"
    shutil.copytree(BUNDLED / "digits", repository / "digits", ignore=shutil.ignore_patterns("__pycache__"))
    with ServiceProcess(MODEL_REPOSITORY=str(repository), MODELS="digits", MODEL_CONTROL_MODE="explicit",
                        FRONTENDS=frontends) as service:
        service.wait_ready()
        readiness = Readiness(service.url)
        run = locust(service.url, 120, tmp_path / "run")
        during = []  # the looks /readyz answered while each load was in progress
        try:
            for version in (2, 3):  # each load retires the one before (the default policy: the latest)
                before = served_ok(service.url)
                wait_until(lambda: served_ok(service.url) > before + 200, 60, "Locust's requests are not served")
                shutil.copytree(repository / "digits" / "1", repository / "digits" / str(version))
                looked = readiness.looks
                try:
                    answer = httpx.post(f"{service.url}/v2/repository/models/digits/load", timeout=120)
                except httpx.TransportError as exc:  # (seen once beside a busy loop: the connection closed unanswered)
                    raise AssertionError(f"loading version {version}: {exc!r}; the service's log:\n"
                                         f"{service.output()[-4000:]}") from exc
                assert answer.status_code == 200, answer.text
                during.append(readiness.looks - looked)
                assert httpx.get(f"{service.url}/v2/models/digits").json()["versions"] == [str(version)]
            before = served_ok(service.url)
            wait_until(lambda: served_ok(service.url) > before + 200, 60, "version 3 does not serve Locust")
            output = finished(run, tmp_path / "run", end=True)
        finally:
            readiness.stop()
            if run.poll() is None:
                run.kill()
        requests, failures = summary(output)
        assert run.returncode == 0 and "leak gate: PASS" in output, output[-3000:]
        assert requests > 600 and failures == 0, output[-3000:]  # 200 on each version at least
        # Readiness was watched through each load, and never dropped.
        assert readiness.not_ready == [] and min(during) > 0, (readiness.not_ready[:10], during)
        print(f"two loads under 32 users: {requests} requests, {failures} failed, /readyz 200 at all "
              f"{readiness.looks} looks, {during} of them during the loads")
        stats = httpx.get(f"{service.url}/v2/models/digits/stats").json()["model_stats"]
        assert [(s["version"], s["inference_stats"]["success"]["count"] > 0) for s in stats] == [("3", True)]
        assert total(scrape(service.url), "placeenv_device_leaks_total") == 0

        # The negative control: the same load, and the model unloaded under it. Locust sees the 404s.
        control = locust(service.url, 8, tmp_path / "control")
        before = served_ok(service.url)
        wait_until(lambda: served_ok(service.url) > before + 100, 60, "Locust's requests are not served")
        assert httpx.post(f"{service.url}/v2/repository/models/digits/unload", timeout=120).status_code == 200
        output = finished(control, tmp_path / "control")
        requests, failures = summary(output)
        assert control.returncode != 0 and "leak gate: FAIL" in output and failures > 0, output[-3000:]
