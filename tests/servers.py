"""Real service processes for tests: ``python -m placeenv.serve`` on 127.0.0.1 with sim devices."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import httpx

from placeenv.serve.config import BUNDLED_REPOSITORY

if TYPE_CHECKING:
    from typing import Self  # Python 3.11; annotations are not evaluated (PEP 563)

#: The test-only models (faulty), served beside the bundled examples.
TEST_REPOSITORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "repository")
REPOSITORIES = f"{BUNDLED_REPOSITORY},{TEST_REPOSITORY}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServiceProcess:
    """Starts the service with ``PLACEENV_*`` settings; ``stop()`` sends SIGTERM and waits."""

    def __init__(self, port: int | None = None, **settings) -> None:
        self.port = port or free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLACEENV_")}
        env.update({"PLACEENV_DEVICES": "sim:0,sim:1,sim:2,sim:3", "PLACEENV_WORKERS_PER_DEVICE": "2",
                    "PLACEENV_MODELS": "digits", "PLACEENV_LOG_LEVEL": "info",
                    "PLACEENV_MODEL_REPOSITORY": REPOSITORIES})
        env.update({f"PLACEENV_{k.upper()}": str(v) for k, v in settings.items()})
        env["PLACEENV_PORT"] = str(self.port)
        env["PLACEENV_HOST"] = "127.0.0.1"
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "placeenv.serve"], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        # Read the log as it comes: unread, the pipe fills (64 KiB, a dozen tracebacks)
        # and the service blocks on its next log line.
        self._lines: list[str] = []
        self._drain = threading.Thread(target=self._lines.extend, args=(self.proc.stdout,), daemon=True)
        self._drain.start()

    def wait_ready(self, timeout: float = 180) -> Self:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"service not ready in {timeout}s:\n{self.output()}")

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def output(self) -> str:
        """Everything the service printed so far (all of it once it has exited)."""
        if self.proc.poll() is not None:
            self._drain.join(10)
        return "".join(self._lines)

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """Samples of /metrics: {(name, sorted label items): value}."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(self.url + "/metrics", timeout=10).text
        samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    def total(self, name: str, **labels) -> float:
        return sum(
            value for (n, items), value in self.metrics().items()
            if n == name and all(dict(items).get(k) == v for k, v in labels.items())
        )

    def by_label(self, name: str, label: str, **labels) -> dict[str, float]:
        """``name``'s samples summed per value of ``label`` (e.g. leaks per stage), zeros left out."""
        found: dict[str, float] = {}
        for (n, items), value in self.metrics().items():
            items = dict(items)
            if n == name and value and all(items.get(k) == v for k, v in labels.items()):
                found[items.get(label, "")] = found.get(items.get(label, ""), 0.0) + value
        return found

    def __enter__(self) -> Self:
        return self.wait_ready()

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        finally:
            self.kill()
