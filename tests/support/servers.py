"""Real service processes for tests: ``python -m placeenv.serve`` on 127.0.0.1 with sim devices."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from placeenv.serve.config import BUNDLED, STACKS
from placeenv.testing import free_port

from .polling import WaitTimeout, wait_until
from .tools import need_tool

if TYPE_CHECKING:
    from typing import Self  # Python 3.11; annotations are not evaluated (PEP 563)

#: The test-only models (faulty), served beside the bundled examples.
TEST_REPOSITORY = str(Path(__file__).resolve().parents[1] / "repository")
REPOSITORIES = f"{BUNDLED},{TEST_REPOSITORY}"


class ServiceProcess:
    """Starts the service with ``PLACEENV_*`` settings; ``stop()`` sends SIGTERM and waits."""

    def __init__(self, port: int | None = None, wrap: list[str] | None = None, extra_env: dict | None = None,
                 **settings) -> None:
        """``wrap``: a command that runs the service (``wrap + [python, -m, placeenv.serve]``);
        ``extra_env``: variables besides the settings."""
        self.port = port or free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLACEENV_")}
        # One thread a CPU run (PLACEENV_CPU_THREADS): the suite's workers keep the cores busy, and a run's
        # second thread only adds its own overhead (8 OCR pages: 7.7 s of CPU against 9.2 s on two threads).
        env.update({"PLACEENV_DEVICES": "sim:0,sim:1,sim:2,sim:3", "PLACEENV_WORKERS_PER_DEVICE": "2",
                    "PLACEENV_MODELS": "digits", "PLACEENV_LOG_LEVEL": "info",
                    "PLACEENV_MODEL_REPOSITORY": REPOSITORIES, "PLACEENV_CPU_THREADS": "1"})
        env.update({f"PLACEENV_{k.upper()}": str(v) for k, v in settings.items()})
        env.update(extra_env or {})
        env["PLACEENV_PORT"] = str(self.port)
        env["PLACEENV_HOST"] = "127.0.0.1"
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [*(wrap or []), sys.executable, "-m", "placeenv.serve"], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        # Read the log as it comes: unread, the pipe fills (64 KiB, a dozen tracebacks)
        # and the service blocks on its next log line.
        self._lines: list[str] = []
        self._drain = threading.Thread(target=self._lines.extend, args=(self.proc.stdout,), daemon=True)
        self._drain.start()

    def ready(self) -> bool:
        """Whether /readyz answers 200 now; RuntimeError if the service has exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"service exited with {self.proc.returncode}:\n{self.output()}")
        try:
            return httpx.get(self.url + "/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float = 180) -> Self:
        try:
            wait_until(self.ready, timeout, "service not ready", interval=0.2)
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}; what it printed, then where its threads wait:\n{self.stacks()}") from None
        return self

    def stacks(self) -> str:
        """Stop the service after it printed its threads' Python stacks (``STACKS``): all it printed."""
        if self.proc.poll() is None:
            self.proc.send_signal(STACKS)
            try:
                wait_until(lambda: "most recent call first" in self.output(), 20, "no stacks", interval=0.2)
            except WaitTimeout:
                pass
        self.kill()
        return self.output()

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
        return scrape(self.url)

    def total(self, name: str, **labels) -> float:
        return total(self.metrics(), name, **labels)

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


@contextmanager
def workers_held(url: str, workers: int) -> Iterator[list[Future]]:
    """Each of a service's ``workers`` busy with a request for the test model ``gate`` (serve it: the
    service's repository includes TEST_REPOSITORY and its models ``gate``), until the block ends.

    What is sent meanwhile waits in the device queues, so a test decides what is queued when the
    workers look, instead of racing them. The block starts once every worker is held (each gate
    request connected back to the test); leaving it lets them go. Yields the gate requests' futures
    (httpx responses; their answers come after the block)."""
    with socket.create_server(("127.0.0.1", 0)) as gate, ThreadPoolExecutor(workers) as pool:
        gate.settimeout(60)
        port = gate.getsockname()[1]
        body = {"inputs": [{"name": "port", "shape": [1, 1], "datatype": "FP32", "data": [port]}]}
        answers = [pool.submit(httpx.post, f"{url}/v2/models/gate/infer", json=body, timeout=120)
                   for _ in range(workers)]
        held = []
        try:
            for _ in range(workers):  # a connection from each worker: every one of them is held
                held.append(gate.accept()[0])
            yield answers
        finally:
            for connection in held:  # let them go
                connection.close()


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """The samples of ``url``/metrics (a service's, a container's): {(name, sorted label items): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def total(samples: dict[tuple[str, tuple], float], name: str, **labels) -> float:
    """``name``'s samples (of ``scrape``) that have ``labels``, summed."""
    return sum(value for (n, items), value in samples.items()
               if n == name and all(dict(items).get(k) == v for k, v in labels.items()))


def _wait_http(url: str, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    def answers() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            return httpx.get(url, timeout=2).status_code < 500
        except httpx.HTTPError:
            return False

    wait_until(answers, timeout, f"{what} did not start", interval=0.2)


class ReplicaSet:
    """Service processes on fixed ports (a restarted replica comes back on its port, as behind
    a load balancer), each with the same settings unless ``start`` overrides them."""

    def __init__(self, count: int, **settings) -> None:
        self.ports = [free_port() for _ in range(count)]
        self.settings = settings
        self.procs: list[ServiceProcess | None] = [None] * count
        self.logs: list[str] = []  # the output of every replica that has exited

    def start(self, i: int, **overrides) -> ServiceProcess:
        assert self.procs[i] is None or self.procs[i].proc.poll() is not None
        self.procs[i] = ServiceProcess(port=self.ports[i], **{**self.settings, **overrides})
        return self.procs[i]

    def start_all(self) -> Self:
        for proc in [self.start(i) for i in range(len(self.ports))]:
            proc.wait_ready()
        return self

    def terminate(self, i: int, timeout: float = 60) -> int:
        """SIGTERM, and the exit code once the replica has drained."""
        code = self.procs[i].stop(timeout)
        self.logs.append(self.procs[i].output())
        return code

    def kill(self, i: int) -> None:
        """SIGKILL: no drain."""
        self.procs[i].kill()
        self.logs.append(self.procs[i].output())

    def stop_all(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc is not None and proc.proc.poll() is None:
                try:
                    self.terminate(i)
                finally:
                    proc.kill()


def prometheus_query(url: str, expr: str) -> list[dict]:
    """The instant vector ``expr`` from the Prometheus at ``url``."""
    body = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=30).json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


class Prometheus:
    """A real Prometheus on 127.0.0.1 scraping every second: static jobs, and a file_sd job
    ``replicas`` whose targets ``set_targets`` rewrites (Prometheus re-reads the file)."""

    def __init__(self, tmp: Path, jobs: dict[str, int] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.targets = tmp / "replicas.json"
        self.set_targets([])
        scrape = "".join(
            f"  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
            for job, port in (jobs or {}).items()
        )
        scrape += (f"  - job_name: replicas\n    file_sd_configs:\n      - files: ['{self.targets}']\n"
                   "        refresh_interval: 1s\n")
        config = tmp / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{scrape}"
        )
        self.proc = subprocess.Popen(
            [need_tool("prometheus"), f"--config.file={config}",
             f"--storage.tsdb.path={tmp / 'prometheus-data'}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        _wait_http(self.url + "/-/ready", self.proc, "prometheus")

    def set_targets(self, ports: list[int]) -> None:
        tmp = self.targets.with_suffix(".tmp")  # renamed into place: Prometheus never reads half a file
        tmp.write_text(json.dumps([{"targets": [f"127.0.0.1:{p}" for p in ports]}]))
        tmp.replace(self.targets)

    def query(self, expr: str) -> list[dict]:
        return prometheus_query(self.url, expr)

    def value(self, expr: str) -> float:
        return sum(float(sample["value"][1]) for sample in self.query(expr))

    def scraped_since(self, moment: float) -> bool:
        """Whether every target is up and was last scraped after ``moment`` (a ``time.time()``): what
        happened before it is in Prometheus, whatever the scrapes cost on a busy machine."""
        targets = httpx.get(self.url + "/api/v1/targets", timeout=30).json()["data"]["activeTargets"]

        def started(stamp: str) -> float:  # RFC 3339 with nanoseconds; Python reads microseconds
            return datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", stamp).replace("Z", "+00:00")).timestamp()

        return bool(targets) and all(t["health"] == "up" and started(t["lastScrape"]) > moment for t in targets)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


#: The nginx configuration shipped for the compose scale profile.
NGINX_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "placeenv.conf"
_UPSTREAM = re.compile(r"^(\s*)server api:8000( [^;]*)?;$", re.MULTILINE)
_LISTEN = re.compile(r"^(\s*)listen 80;$", re.MULTILINE)


class Nginx:
    """Debian's nginx running the shipped ``deploy/nginx/placeenv.conf``, with only its
    upstream servers (one line per replica, same parameters) and its listen port replaced."""

    def __init__(self, tmp: Path, replica_ports: list[int], retries: bool = True) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        shipped = NGINX_CONFIG.read_text()
        assert len(_UPSTREAM.findall(shipped)) == 1 and len(_LISTEN.findall(shipped)) == 1, \
            "the shipped nginx config no longer has one `server api:8000 ...;` and one `listen 80;` line"
        site = _UPSTREAM.sub(
            lambda m: "\n".join(f"{m.group(1)}server 127.0.0.1:{p}{m.group(2) or ''};" for p in replica_ports),
            shipped)
        site = _LISTEN.sub(lambda m: f"{m.group(1)}listen 127.0.0.1:{self.port};", site)
        if not retries:  # the measurement without retries (docs/benchmarks.md)
            site, found = re.subn(r"^(\s*)proxy_next_upstream [^;\n]*;", r"\1proxy_next_upstream off;", site, flags=re.M)
            assert found == 1
        root = tmp / "nginx"
        root.mkdir(parents=True)
        (root / "site.conf").write_text(site)
        (root / "nginx.conf").write_text(
            f"daemon off;\nworker_processes 1;\npid {root}/nginx.pid;\nerror_log {root}/error.log warn;\n"
            + ("user root;\n" if os.geteuid() == 0 else "")
            + "events { worker_connections 1024; }\nhttp {\n"
            f"    access_log {root}/access.log;\n"
            + "".join(f"    {kind}_temp_path {root}/{kind};\n"
                      for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
            + f"    include {root}/site.conf;\n}}\n"
        )
        self.root = root
        self.proc = subprocess.Popen(
            [need_tool("nginx"), "-c", str(root / "nginx.conf"), "-p", str(root)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        wait_until(self._listening, 20, "nginx did not start", interval=0.1)

    def _listening(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"nginx exited: {self.proc.stderr.read()}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def errors(self) -> str:
        return (self.root / "error.log").read_text()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


def batches(url: str, model: str) -> dict[int, int]:
    """Forward passes ``model`` has run, by their examples (Triton's batch_stats)."""
    (stats,) = httpx.get(f"{url}/v2/models/{model}/stats", timeout=30).json()["model_stats"]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def ran(url: str, model: str, before: dict[int, int]) -> dict[int, int]:
    """The forward passes since ``before`` (``batches``), by size."""
    now = batches(url, model)
    return {size: count - before.get(size, 0) for size, count in sorted(now.items()) if count > before.get(size, 0)}


def queued_together(service, model: str, bodies: list[dict]) -> list[httpx.Response]:
    """``bodies`` sent to ``model`` while the one worker is held, answered once it is let go: its queue
    holds them all when it next looks."""
    async def send():
        async with httpx.AsyncClient(base_url=service.url, timeout=60) as http:
            return await asyncio.gather(*(http.post(f"/v2/models/{model}/infer", json=b) for b in bodies))

    with ThreadPoolExecutor(1) as pool, workers_held(service.url, 1):
        running = pool.submit(asyncio.run, send())
        wait_until(lambda: service.total("inference_queue_depth") >= len(bodies), 30,
                   "the requests did not queue")
    return running.result(60)
