"""The deployment files: Dockerfile, compose stack, Prometheus config, Grafana provisioning and dashboard.

No Docker engine is needed: ``docker-compose config`` and ``promtool`` validate
statically (each test skips when its tool is missing; ``.ci/run`` installs both),
the rest parses the files. The dashboards' PromQL is run against a real
Prometheus in ``test_prometheus_e2e.py``.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from support.dashboards import (
    DASHBOARD_DIR, dashboard_exprs, dashboard_files, dashboard_targets, iter_panels, load_dashboard,
)
from support.tools import need_tool
from placeenv.serve import metrics as service_metrics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_GPU = ROOT / "docker-compose.gpu.yml"
DOCKERFILE = ROOT / "Dockerfile"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDERS = DEPLOY / "grafana" / "provisioning" / "dashboards" / "dashboards.yml"
MAIN_DASHBOARD = DASHBOARD_DIR / "placeenv.json"


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _env(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _default(value: str) -> str:
    """'${VAR:-default}' -> 'default'; anything else unchanged."""
    match = re.fullmatch(r"\$\{\w+:?-(.*)\}", value)
    return match.group(1) if match else value


def _bind_mounts(service: dict) -> dict[str, str]:
    """host path (relative to the repository) -> container path, for ./ bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            mounts[source[2:]] = target
    return mounts


def _compose_config(*files: Path) -> dict:
    """``docker-compose -f ... config``: validates, merges and interpolates; returns the result."""
    return _compose_config_args(*[arg for f in files for arg in ("-f", str(f))])


def _compose_config_args(*options: str, env: dict | None = None) -> dict:
    args = [need_tool("docker-compose"), *options]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PLACEENV_")}, **(env or {})}  # the defaults
    result = subprocess.run(args + ["config"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


# --------------------------------------------------------------------------- compose


def test_compose_file_validates():
    config = _compose_config(COMPOSE)
    assert {"api", "prometheus", "grafana", "locust"} <= set(config["services"])
    api = config["services"]["api"]
    assert _env(api)["PLACEENV_DEVICES"] == "sim:0,sim:1,sim:2,sim:3"
    assert _env(api)["PLACEENV_HOST"] == "0.0.0.0"
    assert any(str(p.get("target")) == "8000" and str(p.get("published")) == "8000" for p in api["ports"])


def test_compose_gpu_override_validates_and_reserves_nvidia_gpus():
    api = _compose_config(COMPOSE, COMPOSE_GPU)["services"]["api"]
    assert _env(api)["PLACEENV_DEVICES"] == "auto"
    assert _env(api)["PLACEENV_HOST"] == "0.0.0.0"  # kept from the base file
    assert api["build"]["args"]["PADDLE"] == "gpu"
    (device,) = api["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]


def test_compose_services_and_profiles():
    services = _yaml(COMPOSE)["services"]
    assert {"api", "prometheus", "grafana", "locust"} <= set(services)
    for name in ("api", "prometheus", "grafana"):
        assert not services[name].get("profiles"), f"{name} must start with a plain `docker compose up`"
    assert services["locust"]["profiles"] == ["load"]


def test_compose_api():
    api = _yaml(COMPOSE)["services"]["api"]
    build = api["build"]
    assert (build if isinstance(build, str) else build["context"]) == "."
    assert "8000:8000" in [str(p) for p in api["ports"]]
    env = _env(api)
    assert env["PLACEENV_HOST"] == "0.0.0.0"
    devices = _default(env["PLACEENV_DEVICES"]).split(",")
    assert devices and all(d.startswith("sim:") for d in devices)
    assert "/readyz" in " ".join(api["healthcheck"]["test"])


def test_compose_locust_runs_the_load_test_against_the_api_from_its_own_target():
    services = _yaml(COMPOSE)["services"]
    api, locust = services["api"], services["locust"]
    assert locust["image"] != api["image"] and locust["build"]["target"] == "locust"
    assert "target" not in api["build"]  # the Dockerfile's last stage, the api
    command = locust["command"]
    command = " ".join(command) if isinstance(command, list) else command
    assert "locust -f loadtest/" in command
    assert "--host http://api:8000" in command and "--headless" in command
    assert "loadtest/locust.conf" in command
    depends = locust["depends_on"]
    assert "api" in depends
    if isinstance(depends, dict):
        assert depends["api"]["condition"] == "service_healthy"


def test_compose_prometheus_and_grafana_mount_the_deploy_files():
    services = _yaml(COMPOSE)["services"]
    prometheus = _bind_mounts(services["prometheus"])
    assert prometheus["deploy/prometheus/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    assert "9090:9090" in services["prometheus"]["ports"]
    assert services["prometheus"]["image"].startswith("prom/prometheus")

    grafana = services["grafana"]
    assert grafana["image"].startswith("grafana/grafana")
    assert "3000:3000" in grafana["ports"]
    mounts = _bind_mounts(grafana)
    assert mounts["deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    # the dashboard provider reads the folder the dashboards are mounted at
    provider_path = _yaml(DASHBOARD_PROVIDERS)["providers"][0]["options"]["path"]
    assert mounts["deploy/grafana/dashboards"] == provider_path
    env = _env(grafana)
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    home = env.get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        assert (DASHBOARD_DIR / Path(home).relative_to(provider_path)).is_file()

    for service in services.values():  # every bind-mounted file or folder exists
        for source in _bind_mounts(service):
            assert (ROOT / source).exists(), source


def test_compose_gpu_override_file():
    api = _yaml(COMPOSE_GPU)["services"]["api"]
    devices = _default(_env(api)["PLACEENV_DEVICES"])
    assert devices == "auto" or "gpu:" in devices
    assert api["build"]["args"]["PADDLE"] == "gpu"
    assert api["image"] != _yaml(COMPOSE)["services"]["api"]["image"]  # the CPU image keeps its tag
    (device,) = api["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}
    assert COMPOSE_GPU.read_text().startswith("#"), "the usage comment at the top"


def test_compose_scale_profile_validates():
    config = _compose_config_args("--profile", "scale")
    services = config["services"]
    assert {"api", "replica", "nginx"} <= set(services)
    assert services["replica"]["scale"] == 2
    with_env = _compose_config_args("--profile", "scale", env={"PLACEENV_REPLICAS": "4"})
    assert with_env["services"]["replica"]["scale"] == 4


def test_compose_scale_profile_replicas_are_the_api_behind_nginx():
    services = _yaml(COMPOSE)["services"]
    api, replica, nginx = services["api"], services["replica"], services["nginx"]
    assert replica["profiles"] == nginx["profiles"] == ["scale"]
    # The same image and settings as the api, without its published port (replicas share one host).
    assert {k: v for k, v in api.items() if k != "ports"} == {
        k: v for k, v in replica.items() if k not in ("profiles", "scale", "networks")}
    assert "ports" not in replica
    # Every replica answers to `api`: nginx's upstream and Prometheus's discovery name.
    assert replica["networks"]["default"]["aliases"] == ["api"]
    assert _bind_mounts(nginx) == {"deploy/nginx/placeenv.conf": "/etc/nginx/conf.d/default.conf"}
    assert nginx["ports"] == ["8080:80"]
    assert nginx["depends_on"] == {"api": {"condition": "service_healthy"},
                                   "replica": {"condition": "service_healthy"}}


def _nginx() -> str:
    return (DEPLOY / "nginx" / "placeenv.conf").read_text()


def _seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m)?", value)
    return int(match[1]) * {"ms": 0.001, "s": 1, "m": 60, None: 1}[match[2]]


def _nginx_directive(name: str) -> str:
    (value,) = re.findall(rf"^\s*{name}\s+([^;]*);", _nginx(), re.M)
    return value


def test_nginx_settings_fit_the_service():
    """Each nginx setting against the service setting it depends on (docs/deploy.md)."""
    import uvicorn

    from placeenv.serve.config import Settings

    defaults = Settings(_cli_parse_args=[])
    assert re.search(r"^\s*server api:8000 max_fails=1 fail_timeout=\d+s;$", _nginx(), re.M)
    assert re.search(r"^\s*listen 80;$", _nginx(), re.M)
    # nginx must drop an idle upstream connection before uvicorn does, or it may reuse a closing one.
    assert _seconds(_nginx_directive("keepalive_timeout")) < uvicorn.Config(app=None).timeout_keep_alive
    # Retries: refused/broken connections, for POSTs too; never 503 (overload) or timeouts.
    retry = _nginx_directive("proxy_next_upstream").split()
    assert retry == ["error", "non_idempotent"]
    assert _nginx_directive("proxy_request_buffering") == "on"  # a retried request needs its body
    # The service answers 504 and 413 itself, with its own messages, before nginx would.
    assert _seconds(_nginx_directive("proxy_read_timeout")) > defaults.request_timeout_s
    body = _nginx_directive("client_max_body_size")
    assert int(body.rstrip("m")) * 1024 * 1024 > defaults.max_body_bytes
    # Compose waits long enough for the drain before it kills a replica.
    env = _env(_yaml(COMPOSE)["services"]["api"])
    drain = float(_default(env["PLACEENV_SHUTDOWN_DELAY_S"])) + float(_default(env["PLACEENV_SHUTDOWN_GRACE_S"]))
    assert _seconds(_yaml(COMPOSE)["services"]["api"]["stop_grace_period"]) > drain


# --------------------------------------------------------------------------- Dockerfile


def _dockerfile() -> list[str]:
    """Instructions, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _instructions(keyword: str) -> list[str]:
    return [line.split(None, 1)[1] for line in _dockerfile() if line.split(None, 1)[0].upper() == keyword]


def _exec_form(value: str) -> list[str]:
    return json.loads(value) if value.startswith("[") else shlex.split(value)


def _env_instructions() -> dict[str, str]:
    env = {}
    for value in _instructions("ENV"):
        for item in shlex.split(value):
            key, _, val = item.partition("=")
            env[key] = val
    return env


def test_dockerfile():
    args = {a.split("=")[0]: a.partition("=")[2] for a in _instructions("ARG")}
    assert args["BASE"] == "python:3.11-slim" and "EXTRA_CA_CERTS" in args
    stages = {line.split()[-1]: line.split()[0] for line in _instructions("FROM")}
    assert set(stages) == {"pip-base", "requirements", "deps", "build", "build-locust", "locust", "api"}
    assert _instructions("FROM")[-1] == "${BASE} AS api", "the api is the default target"
    runs = " ".join(_instructions("RUN"))
    assert re.search(r"apt-get install[^&]*\bg\+\+", runs), "g++ compiles the sim device"
    # The service with gRPC, no test tools: the dependencies of the grpc extra from pyproject.toml alone (a
    # layer the source's changes keep), then the project's wheel over them.
    assert "of('grpc')" in runs and "pip install --no-deps --no-index /tmp/wheels/*.whl" in runs
    copied = _instructions("COPY")
    assert copied.index("pyproject.toml /src/pyproject.toml") < copied.index(". /src")
    # The deps stage installs the list by its content (the requirements stage's), not pyproject.toml itself: a
    # change to the tests' settings keeps the install.
    assert "--from=requirements /src/requirements.txt /tmp/requirements.txt" in copied
    assert "pip install -r /tmp/requirements.txt" in runs, "locust: loadtest/requirements.txt alone"
    assert "python -m placeenv.sim build" in runs, "the sim plugin is built into the image"
    env = _env_instructions()
    assert env["PLACEENV_HOST"] == "0.0.0.0"
    assert env["PLACEENV_SIM_CACHE"].startswith("/")
    assert _instructions("EXPOSE") == ["8000"]
    assert _exec_form(_instructions("CMD")[-1]) == ["python", "-m", "placeenv.serve"]
    (healthcheck,) = _instructions("HEALTHCHECK")
    assert "/readyz" in healthcheck and "python" in healthcheck
    # the GPU override's build argument exists
    assert any(a.split("=")[0] == "PADDLE" for a in _instructions("ARG"))
    assert "paddlepaddle-gpu" in runs


def test_dockerignore_keeps_the_context_small():
    patterns = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".venv", ".git", "results"} <= patterns
    assert any("__pycache__" in p for p in patterns)
    # the image needs these
    needed_files = ("pyproject.toml", "README.md", "placeenv", "pytest_placeenv.py", "loadtest", "locust.conf")
    for needed in needed_files:
        assert needed not in patterns


def test_sim_plugin_builds_into_the_cache_the_image_sets(tmp_path):
    """``python -m placeenv.sim build`` with PLACEENV_SIM_CACHE, as in the Dockerfile: built once, reused."""
    env = dict(os.environ, PLACEENV_SIM_CACHE=str(tmp_path / "sim-cache"))
    command = [sys.executable, "-m", "placeenv.sim", "build"]
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    built = Path(first.stdout.strip())
    assert built.parent == tmp_path / "sim-cache"
    library = built / "libpaddle-custom-sim.so"
    mtime = library.stat().st_mtime_ns
    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0 and Path(second.stdout.strip()) == built
    assert library.stat().st_mtime_ns == mtime, "a second build must reuse the cached plugin"


class _Readyz(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802
        self.send_response(self.status if self.path == "/readyz" else 404)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def _healthcheck_commands() -> dict[str, list[str]]:
    dockerfile = _instructions("HEALTHCHECK")[0]
    dockerfile = _exec_form(dockerfile[dockerfile.index("CMD") + 3:].strip())
    compose = _yaml(COMPOSE)["services"]["api"]["healthcheck"]["test"]
    assert compose[0] == "CMD"
    return {"Dockerfile": dockerfile, "docker-compose.yml": compose[1:]}


@pytest.mark.parametrize("source", ["Dockerfile", "docker-compose.yml"])
def test_healthcheck_passes_only_when_ready(source):
    command = _healthcheck_commands()[source]
    assert command[0] == "python"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_Readyz,), {}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = dict(os.environ, PLACEENV_PORT=str(server.server_address[1]))
        if "PLACEENV_PORT" not in " ".join(command):
            pytest.fail(f"the {source} healthcheck must follow PLACEENV_PORT")
        for status, healthy in ((200, True), (503, False)):
            server.RequestHandlerClass.status = status
            result = subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, timeout=30)
            assert (result.returncode == 0) == healthy, (status, result.stderr)
    finally:
        server.shutdown()
        server.server_close()


# --------------------------------------------------------------------------- Prometheus


def test_prometheus_scrapes_every_api_replica_every_5s():
    config = _yaml(PROMETHEUS_CONFIG)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    # DNS discovery of the name `api`, which the api and, with --profile scale, every replica answer to
    (api_job,) = [
        job for job in jobs.values()
        if any(sd["names"] == ["api"] and sd["port"] == 8000 for sd in job.get("dns_sd_configs", []))
    ]
    replica = _yaml(COMPOSE)["services"]["replica"]
    assert "api" in replica["networks"]["default"]["aliases"]
    assert api_job.get("scrape_interval", config["global"]["scrape_interval"]) == "5s"
    assert api_job.get("metrics_path", "/metrics") == "/metrics"


def test_promtool_check_config():
    command = [need_tool("promtool"), "check", "config", str(PROMETHEUS_CONFIG)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------- Grafana provisioning


def _datasource_uid() -> str:
    (datasource,) = _yaml(DATASOURCES)["datasources"]
    return datasource["uid"]


def test_grafana_datasource():
    (datasource,) = _yaml(DATASOURCES)["datasources"]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    assert datasource["uid"] and datasource.get("isDefault") is True
    # Grafana's $__rate_interval is max(4 x this, step + this): it must be the real scrape interval
    assert datasource["jsonData"]["timeInterval"] == _yaml(PROMETHEUS_CONFIG)["global"]["scrape_interval"]


def test_grafana_dashboard_provider():
    (provider,) = _yaml(DASHBOARD_PROVIDERS)["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"]


# --------------------------------------------------------------------------- dashboards

# title -> what its queries must contain
REQUIRED_PANELS = {
    "Requests/s per device": [r'rate\(inference_requests_total\{status="ok"\}', r"by \(device\)"],
    "Request latency p50 / p95 / p99": [
        r"histogram_quantile\(0\.5, .*inference_request_duration_seconds_bucket",
        r"histogram_quantile\(0\.95, .*inference_request_duration_seconds_bucket",
        r"histogram_quantile\(0\.99, .*inference_request_duration_seconds_bucket",
    ],
    "Queue depth per device": [r"by \(device\) \(inference_queue_depth\)"],
    "Batch size": [r"inference_batch_size_(sum|bucket|count)"],
    "Workers up per device": [r"sum by \(device\) \(worker_up\)"],
    "Place checks/s by stage": [r"by \(stage\) \(rate\(placeenv_place_checks_total"],
    "Device leaks": [r"^sum\(placeenv_device_leaks_total\) or vector\(0\)$"],
    # One line per replica (instance), for `docker compose --profile scale` and Kubernetes
    "Requests/s per replica": [r'by \(instance\) \(rate\(inference_requests_total\{status="ok"\}'],
    "Request latency p95 per replica": [r"by \(instance, le\) \(rate\(inference_request_duration_seconds_bucket"],
    "In-flight requests per replica": [r"by \(instance\) \(inference_in_flight_requests\)"],
    "Ready per replica": [r"by \(instance\) \(service_ready\)"],
}

PROMQL_WORDS = {
    "and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left", "group_right", "offset",
    "inf", "nan", "atan2",
}
PROMQL_FUNCTIONS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values",
    "group", "rate", "irate", "increase", "delta", "idelta", "deriv", "resets", "changes",
    "histogram_quantile", "vector", "scalar", "absent", "absent_over_time", "clamp", "clamp_min",
    "clamp_max", "abs", "ceil", "floor", "round", "sqrt", "exp", "ln", "log2", "log10", "time", "timestamp",
    "sort", "sort_desc", "label_replace", "label_join", "avg_over_time", "min_over_time", "max_over_time",
    "sum_over_time", "count_over_time", "last_over_time", "quantile_over_time", "stddev_over_time",
    "present_over_time", "predict_linear", "holt_winters",
}


def service_series_names() -> set[str]:
    """Every series name /metrics can expose, derived from placeenv/serve/metrics.py."""
    names = set()
    for name, kind in service_metrics.families().items():
        if kind == "counter":
            names.add(name + "_total")
        elif kind == "histogram":
            names |= {name + "_bucket", name + "_sum", name + "_count"}
        elif kind == "summary":
            names |= {name, name + "_sum", name + "_count"}
        else:
            names.add(name)
    return names


def _strip_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)


def _balanced(expr: str) -> bool:
    pairs, stack = {")": "(", "]": "[", "}": "{"}, []
    for ch in _strip_strings(expr):
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return False
    return not stack


def _identifiers(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, function names) used by a PromQL expression: a light lexer, not a parser."""
    text = _strip_strings(expr)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)  # label lists
    text = re.sub(r"\boffset\s+-?\w+", " ", text)
    text = re.sub(r"(?<![\w:.])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?![\w:])", " ", text)  # numbers
    metrics, functions = set(), set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        if re.match(r"\s*\(", text[match.end():]):
            functions.add(word)
        elif word.lower() not in PROMQL_WORDS:
            metrics.add(word)
    return metrics, functions


def _panels(path: Path = MAIN_DASHBOARD) -> list[dict]:
    return [p for p in iter_panels(load_dashboard(path)) if p.get("type") != "row"]


def test_dashboard_files_are_valid_json():
    files = dashboard_files()
    assert MAIN_DASHBOARD in files
    uids = set()
    for path in files:
        dashboard = json.loads(path.read_text())
        assert dashboard["title"] and dashboard["uid"] not in uids
        uids.add(dashboard["uid"])
        assert dashboard.get("id") is None, "provisioned dashboards carry no database id"
        assert dashboard["schemaVersion"] >= 36
        ids = [p["id"] for p in iter_panels(dashboard)]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"


def test_dashboard_has_the_required_panels():
    panels = {p["title"]: p for p in _panels()}
    missing = set(REQUIRED_PANELS) - set(panels)
    assert not missing, f"missing panels: {sorted(missing)}"
    for title, patterns in REQUIRED_PANELS.items():
        exprs = [t["expr"] for t in panels[title]["targets"]]
        for pattern in patterns:
            assert any(re.search(pattern, e) for e in exprs), f"{title}: nothing matches {pattern!r}: {exprs}"


def test_dashboard_leak_panel_is_a_stat_green_at_zero_red_from_one():
    (panel,) = [p for p in _panels() if p["title"] == "Device leaks"]
    assert panel["type"] == "stat"
    thresholds = panel["fieldConfig"]["defaults"]["thresholds"]
    assert thresholds["mode"] == "absolute"
    steps = thresholds["steps"]
    assert steps[0] == {"color": "green", "value": None}
    red = [s for s in steps[1:] if s["color"] == "red"]
    assert red and 0 < red[0]["value"] <= 1
    assert all(s["color"] == "green" for s in steps if s["value"] is None or s["value"] < red[0]["value"])
    assert panel["fieldConfig"]["defaults"]["color"]["mode"] == "thresholds"


def test_dashboard_panels_layout_and_datasource():
    # Every query names the dashboard's datasource variable, whose default is the provisioned
    # datasource: a Grafana that calls its Prometheus otherwise (Kubernetes) picks it from a list.
    uid = "${datasource}"
    for path in dashboard_files():
        (variable,) = [v for v in load_dashboard(path)["templating"]["list"] if v["name"] == "datasource"]
        assert variable["type"] == "datasource" and variable["query"] == "prometheus"
        assert variable["current"]["value"] == _datasource_uid()
    for path in dashboard_files():
        for panel in iter_panels(load_dashboard(path)):
            grid = panel["gridPos"]
            assert {"x", "y", "w", "h"} <= set(grid) and grid["x"] + grid["w"] <= 24, panel["title"]
            if panel.get("type") == "row":
                continue
            assert panel["datasource"]["uid"] == uid, f"{path.name}: {panel['title']}"
            assert panel["targets"], f"{path.name}: {panel['title']} has no query"
            refs = [t["refId"] for t in panel["targets"]]
            assert len(refs) == len(set(refs)) and all(refs), panel["title"]
            for target in panel["targets"]:
                where = f"{path.name}: {panel['title']} {target['refId']}"
                assert target.get("expr", "").strip(), f"{where}: empty expr"
                if "datasource" in target:
                    assert target["datasource"]["uid"] == uid, where


def test_dashboard_panels_do_not_overlap():
    cells: dict[tuple[int, int], str] = {}
    for panel in _panels():
        g = panel["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_dashboard_exprs_are_balanced_and_use_only_service_metrics():
    known = service_series_names()
    assert {"inference_requests_total", "inference_request_duration_seconds_bucket", "worker_up",
            "placeenv_device_leaks_total", "inference_batch_size_count"} <= known
    for target in dashboard_targets():
        where = f"{target.file}: {target.panel} {target.ref_id}: {target.expr}"
        assert _balanced(target.expr), f"unbalanced brackets in {where}"
        metrics, functions = _identifiers(target.expr)
        assert metrics, f"no metric in {where}"
        unknown = {m for m in metrics if m not in known and not m.startswith(("process_", "python_"))}
        assert not unknown, f"{where}: not exported by placeenv/serve/metrics.py: {sorted(unknown)}"
        assert functions <= PROMQL_FUNCTIONS, f"{where}: unknown functions {functions - PROMQL_FUNCTIONS}"


def test_dashboard_rate_windows_use_rate_interval():
    ranged = re.compile(r"\b(?:rate|irate|increase|delta|\w+_over_time)\([^\[]*\[([^\]]*)\]")
    for target in dashboard_targets():
        for window in ranged.findall(target.expr):
            assert window == "$__rate_interval", f"{target.panel} {target.ref_id}: window [{window}]"


def test_dashboard_exprs_helper_substitutes_grafana_intervals():
    targets = dashboard_targets()
    exprs = dashboard_exprs()
    assert len(exprs) == len(targets) >= 6
    assert not any("$" in e for e in exprs)
    assert any("[1m]" in e for e in exprs)
    assert any("[5m]" in e for e in dashboard_exprs("5m"))


def test_dashboard_exprs_parse_with_promtool(tmp_path):
    """promtool parses every expression, as the body of a recording rule (no server needed)."""
    exprs = dashboard_exprs()
    rules = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": expr} for i, expr in enumerate(exprs)
    ]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    command = [need_tool("promtool"), "check", "rules", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(exprs)} rules found" in result.stdout


def test_locust_image_requirements_cover_what_loadtest_imports():
    """The locust target installs loadtest/requirements.txt alone: every module-level import of
    loadtest/ (what `locust -f loadtest/` runs) is there, in the standard library or locust's own
    gevent. Imports in functions or under ``try: ... except ImportError`` are optional."""
    import ast

    from packaging.requirements import Requirement

    imports_as = {"pillow": "PIL"}  # a distribution whose module has another name
    listed = {imports_as.get(name, name) for name in (
        Requirement(line).name.lower().replace("-", "_") for line in
        (ROOT / "loadtest" / "requirements.txt").read_text().splitlines() if line.strip() and not line.startswith("#"))}
    imported = set()
    for path in (ROOT / "loadtest").glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                imported |= {alias.name.partition(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.partition(".")[0])
    missing = imported - listed - set(sys.stdlib_module_names) - {"loadtest", "gevent", "__future__"}
    assert not missing, missing
