"""`docker compose up`, for real: the images built from the Dockerfile and the compose stack run
under a real Docker engine (docker.io's dockerd), with no image registry.

The engine starts with no bridge network (``--bridge=none --iptables=false``) and every
container uses the host's network (deploy/compose.ci.yml), so all traffic stays on 127.0.0.1.
The base image is Debian bookworm made by ``debootstrap`` (no registry to pull from), kept in
the engine's data root between runs while its inputs are the same. Grafana has no image or
package here and is left out; its dashboards' queries run against the stack's Prometheus.

A machine without the engine fails these tests with the reason; they do not skip.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import certifi
import httpx
import pytest
import yaml
from support.dashboards import dashboard_exprs
from support import wait_until
from support.servers import free_port, prometheus_query, scrape, total
from support.tools import find_tool

ROOT = Path(__file__).resolve().parents[2]
DATA_ROOT = Path("/var/lib/placeenv-ci-docker")  # images survive between runs on one machine
DEBOOTSTRAP = ["--variant=minbase", "--include=python3,python3-venv,python3-pip,g++,ca-certificates",
               "bookworm"]
SOURCES = ["-f", "docker-compose.yml", "-f", "deploy/compose.ci.yml"]
DEVICES = {"sim:0", "sim:1", "sim:2", "sim:3"}  # the compose api's default

pytestmark = pytest.mark.timeout(900)


def _run(command: list[str], env: dict, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(command[:6])} ... exited {done.returncode}:\n"
                             f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def _apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 or one-line sources)."""
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        text = path.read_text() if path.is_file() else ""
        found = re.search(r"^URIs:\s*(\S+/debian)\s*$", text, re.M) or re.search(r"^deb\s+(\S+/debian)\s", text, re.M)
        if found:
            return found.group(1)
    return "http://deb.debian.org/debian"


def _extra_ca_certs() -> str:
    """The CAs this machine trusts that certifi's bundle lacks (a TLS-inspecting proxy's): what
    pip in the build needs besides its own."""
    pem = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    known = set(pem.findall(Path(certifi.where()).read_text()))
    return "\n".join(c for c in pem.findall(system.read_text()) if c not in known) if system.exists() else ""


def _prune(env: dict) -> None:
    """Stopped containers and untagged images go: each build that changes a layer untags the last
    one's images (about 2 GB an api build), and the data root outlives the run. The tagged images
    stay, so the next build reuses their unchanged layers."""
    _run(["docker", "container", "prune", "-f"], env, timeout=300)
    _run(["docker", "image", "prune", "-f"], env, timeout=300)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A dockerd of our own (its socket, data root and exec root), stopped at the end whatever happens."""
    missing = [tool for tool in ("dockerd", "docker", "docker-compose", "debootstrap") if not find_tool(tool)]
    assert not missing, f"the engine tests need {missing}: apt-get install docker.io docker-compose debootstrap"
    assert os.geteuid() == 0, "dockerd needs root"
    # A short path: the socket's name must fit in sun_path.
    run_dir = Path(f"/tmp/placeenv-ci-dockerd-{os.getpid()}")
    run_dir.mkdir()
    socket = run_dir / "docker.sock"
    log = (run_dir / "dockerd.log").open("w")
    daemon = subprocess.Popen(
        ["dockerd", "--bridge=none", "--iptables=false", "--ip6tables=false", f"--data-root={DATA_ROOT}",
         f"--exec-root={run_dir / 'exec'}", f"--pidfile={run_dir / 'dockerd.pid'}", f"--host=unix://{socket}"],
        stdout=log, stderr=subprocess.STDOUT)
    env = {**os.environ, "DOCKER_HOST": f"unix://{socket}"}
    try:
        def answers() -> bool:
            assert daemon.poll() is None, f"dockerd exited {daemon.returncode}: {tail()}"
            return _run(["docker", "info"], env, check=False).returncode == 0

        def tail() -> str:
            return (run_dir / "dockerd.log").read_text()[-3000:]

        wait_until(answers, 60, lambda: f"dockerd did not answer: {tail()}", interval=0.5)
        _prune(env)  # what a run killed before its teardown left
        yield env
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def base_image(engine) -> str:
    """Debian bookworm from debootstrap, imported; reused while its inputs are the same."""
    mirror = _apt_mirror()
    tag = "placeenv-ci-base:" + hashlib.sha256(json.dumps([DEBOOTSTRAP, mirror]).encode()).hexdigest()[:12]
    if _run(["docker", "image", "inspect", tag], engine, check=False).returncode == 0:
        return tag
    rootfs = Path(f"/tmp/placeenv-ci-rootfs-{os.getpid()}")
    try:
        _run(["debootstrap", *DEBOOTSTRAP, str(rootfs), mirror], engine, timeout=600)
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["docker", "import", "-c", 'CMD ["python3"]', "-", tag], stdin=tar.stdout,
                                  env=engine, capture_output=True, text=True, timeout=300)
        tar.stdout.close()
        assert tar.wait() == 0 and imported.returncode == 0, imported.stderr
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    return tag


#: The Dockerfile's stages that hold the dependencies' virtualenvs, by the compose service whose image copies them.
DEPENDENCY_STAGES = {"api": "deps", "locust": "build-locust"}


def _build_dependencies(merged: dict, env: dict) -> None:
    """The dependency stages built and tagged before compose builds the images, with the build arguments the
    merged compose file gives their services. docker-compose 1.29 uses the classic builder, whose cache is its
    images: a stage no final image descends from (``deps``, whose venv the api copies) is left untagged,
    ``_prune`` deletes it, and every build then installed Paddle and the rest again. Tagged, they stay until
    the dependency list (pyproject.toml's) or loadtest/requirements.txt changes (the old tag's images are then
    untagged and pruned), and compose's build of the same stages, with the same arguments, reuses them."""
    for service, stage in DEPENDENCY_STAGES.items():
        build = merged["services"][service]["build"]
        args = [a for name, value in build.get("args", {}).items() for a in ("--build-arg", f"{name}={value}")]
        _run(["docker", "build", "--network", build.get("network", "default"), "--target", stage,
              "-t", f"placeenv-ci-{stage}:local", *args, build["context"]], env, timeout=900)


@pytest.fixture(scope="module")
def stack(engine, base_image, tmp_path_factory):
    """The images built, the stack up (api, Prometheus), torn down at the end: {env, api, prometheus}."""
    ports = {name: free_port() for name in ("api", "grpc", "prometheus")}
    config = tmp_path_factory.mktemp("prometheus") / "prometheus.yml"
    # The shipped config, its DNS discovery of `api` (no compose network here) made a static target.
    shipped = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
    discovery = re.search(r"    dns_sd_configs:\n(?:      .*\n)+", shipped)
    assert discovery, "deploy/prometheus/prometheus.yml no longer discovers `api` by DNS"
    config.write_text(shipped.replace(discovery.group(0),
                                      f'    static_configs:\n      - targets: ["127.0.0.1:{ports["api"]}"]\n')
                      .replace('"localhost:9090"', f'"127.0.0.1:{ports["prometheus"]}"'))
    env = {**engine, "CI_BASE_IMAGE": base_image, "CI_EXTRA_CA_CERTS": _extra_ca_certs(),
           "CI_API_PORT": str(ports["api"]), "CI_GRPC_PORT": str(ports["grpc"]),
           "CI_PROMETHEUS_PORT": str(ports["prometheus"]), "CI_PROMETHEUS_CONFIG": str(config)}
    # Host networking publishes no ports, and the engine refuses a container that asks for both:
    # the merged configuration, without the compose file's `ports`.
    merged = yaml.safe_load(_run(["docker-compose", *SOURCES, "--profile", "load", "config"], env).stdout)
    for service in merged["services"].values():
        service.pop("ports", None)
    # The api's health from the image's own HEALTHCHECK, not compose's copy of it.
    merged["services"]["api"].pop("healthcheck")
    merged_file = config.parent / "compose.yml"
    merged_file.write_text(yaml.safe_dump(merged))
    compose = ["docker-compose", "-p", "placeenvci", "--project-directory", str(ROOT), "-f", str(merged_file)]
    timings = {}
    try:
        started = time.monotonic()
        _build_dependencies(merged, env)
        _run([*compose, "--profile", "load", "build"], env, timeout=900)
        timings["build_s"] = time.monotonic() - started
        started = time.monotonic()
        _run([*compose, "up", "-d"], env, timeout=300)
        yield {"env": env, "compose": compose, "api": f"http://127.0.0.1:{ports['api']}",
               "prometheus": f"http://127.0.0.1:{ports['prometheus']}", "up_at": started, "timings": timings}
    finally:
        logs = _run([*compose, "logs", "--no-color", "--tail=40"], env, check=False)
        print(logs.stdout[-6000:])
        _run([*compose, "--profile", "load", "down", "-v", "--remove-orphans"], env, check=False, timeout=300)
        _prune(env)


def _container(stack, service: str) -> str:
    return _run([*stack["compose"], "ps", "-q", service], stack["env"]).stdout.strip()


def _inspect(stack, service: str, template: str) -> str:
    return _run(["docker", "inspect", "-f", template, _container(stack, service)], stack["env"]).stdout.strip()


def _predict(url: str, model: str = "digits") -> httpx.Response:
    inputs = [[float(i % 17) for i in range(64)]] if model == "digits" else \
        [[[[0.1] * 32 for _ in range(32)] for _ in range(3)]]
    return httpx.post(url + "/predict", json={"model": model, "inputs": inputs}, timeout=60)


def test_the_stack(stack):
    """In order, on one stack: healthy by the image's HEALTHCHECK, every device serves, Prometheus
    scrapes it and every dashboard query has data, the Locust profile passes its leak gate, and
    `docker-compose stop` drains."""
    env, api, compose = stack["env"], stack["api"], stack["compose"]

    # 1. The api becomes healthy through the image's own HEALTHCHECK (compose's copy is removed).
    def healthy() -> bool:
        health = _inspect(stack, "api", "{{.State.Health.Status}}")
        assert health in ("starting", "healthy"), health
        return health == "healthy"

    wait_until(healthy, 240, "the api did not become healthy", interval=1)
    healthy_s = time.monotonic() - stack["up_at"]
    image_check = _run(["docker", "image", "inspect", "-f", "{{json .Config.Healthcheck.Test}}", "placeenv:local"],
                       env).stdout.strip()
    assert "/readyz" in image_check and _inspect(stack, "api", "{{json .Config.Healthcheck.Test}}") == image_check
    assert _inspect(stack, "api", "{{.Config.User}}") == "placeenv"

    # 2. /predict on every sim device, the same answer from each.
    answers = {}
    for _ in range(200):
        got = _predict(api)
        assert got.status_code == 200, got.text[:300]
        body = got.json()
        answers.setdefault(body["device"], body["outputs"])
        if set(answers) == DEVICES:
            break
    assert set(answers) == DEVICES, sorted(answers)
    assert len({json.dumps(o) for o in answers.values()}) == 1, answers

    # 3. The Locust profile's container exits 0, its leak gate included.
    run = _run([*compose, "--profile", "load", "run", "--rm", "locust"], env, check=False, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "leak gate: PASS" in run.stdout + run.stderr, run.stdout[-4000:]

    # 4. Prometheus, in its container, scrapes the api; every dashboard query returns data.
    def query(expr: str) -> list:
        return prometheus_query(stack["prometheus"], expr)

    wait_until(lambda: query('up{job="placeenv"} == 1'), 60, "Prometheus does not scrape the api", interval=1)
    # rate() windows need scrapes from during the load (every 5 s): until each query has them.
    empty: list[str] = []

    def every_query_has_data() -> bool:
        empty[:] = [expr for expr in dashboard_exprs() if not query(expr)]
        return not empty

    wait_until(every_query_has_data, 60, lambda: f"dashboard queries with no data: {empty}", interval=1)
    assert not empty, empty

    # 5. `docker-compose stop` drains: requests in flight when it comes all get their answer,
    # and the api exits 0 after saying so.
    container = _container(stack, "api")
    memory = _run(["docker", "stats", "--no-stream", "--format", "{{.MemUsage}}", container], env).stdout.strip()
    answered = total(scrape(api), "inference_requests_total", model="mobilenet")

    def all_received() -> bool:  # each of the 32 in flight in the api, or already answered
        samples = scrape(api)
        return (total(samples, "inference_in_flight_requests")
                + total(samples, "inference_requests_total", model="mobilenet") - answered) >= 32

    with ThreadPoolExecutor(33) as pool:  # every request in flight at once, and the stop
        futures = [pool.submit(_predict, api, "mobilenet") for _ in range(32)]
        wait_until(all_received, 60, "the 32 requests did not all reach the api", interval=0.02)
        stopping = time.monotonic()
        pool.submit(_run, [*compose, "stop", "api"], env).result()
        statuses = [f.result().status_code for f in futures]
    stop_s = time.monotonic() - stopping
    assert statuses == [200] * 32, statuses
    assert _run(["docker", "inspect", "-f", "{{.State.ExitCode}}", container], env).stdout.strip() == "0"
    logs = _run(["docker", "logs", container], env)
    log = logs.stdout + logs.stderr
    received, answered = map(int, re.findall(r"stopped: (\d+) inference requests received, (\d+) answered", log)[-1])
    assert received == answered > 0, log[-2000:]

    size = _run(["docker", "image", "inspect", "-f", "{{.Size}}", "placeenv:local"], env).stdout.strip()
    print(f"\nbuild {stack['timings']['build_s']:.0f} s; api image {int(size) / 1e6:.0f} MB; "
          f"up to healthy {healthy_s:.1f} s; memory {memory}; stop (drain of 32 mobilenet requests) "
          f"{stop_s:.1f} s, {received} received / {answered} answered, exit 0")
