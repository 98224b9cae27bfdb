"""deploy/k8s, validated offline: no cluster, the schemas of a pinned Kubernetes version.

- Core kinds: ``kubernetes_validate`` (strict: unknown fields are errors), for the base
  files as written and for each overlay as ``kubectl kustomize`` renders it.
- Custom resources (PodMonitor, InferenceService, ServingRuntime): the published CRDs'
  schemas, vendored in ``deploy/k8s/schemas``, closed the way the API server's strict field
  validation closes them; the prometheus-adapter config against a schema of its Go structs.
- Each validator has a negative control: a broken copy must fail.
- Cross-checks against the service: probe paths are routes, ports agree, grace periods cover
  the drain, the HPA's metric is exported and served by the adapter rule, selectors select.
"""

from __future__ import annotations

import ast
import copy
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import jsonschema
import kubernetes_validate
import pytest
import yaml
from support.servers import ServiceProcess
from support.tools import need_tool

import placeenv.sim as placeenv_sim
from placeenv.serve import metrics as service_metrics

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SCHEMAS = K8S / "schemas"
#: The Kubernetes version whose schemas the manifests must meet.
KUBERNETES_VERSION = "1.32"
OVERLAYS = ["cpu", "gpu"]
#: Where the service writes at run time: the emptyDirs (test_the_service_runs_on_a_read_only_root).
SCRATCH = ["/tmp"]
CRDS = {
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor.v1.json.gz",
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice.v1beta1.json.gz",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "servingruntime.v1alpha1.json.gz",
}


def _load(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def base_objects() -> list[dict]:
    return [obj for path in sorted((K8S / "base").glob("*.yaml")) if path.name != "kustomization.yaml"
            for obj in _load(path)]


def render(overlay: str | Path) -> list[dict]:
    """An overlay by name, or any kustomization folder, as ``kubectl kustomize`` renders it."""
    folder = overlay if isinstance(overlay, Path) else K8S / "overlays" / overlay
    result = subprocess.run([need_tool("kubectl"), "kustomize", str(folder)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def kserve_objects() -> list[dict]:
    return [obj for path in sorted((K8S / "kserve").glob("*.yaml")) for obj in _load(path)]


def _closed(schema):
    """A CRD schema as the API server applies it with strict field validation: objects
    that declare properties accept no others, unless they preserve unknown fields."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {k: _closed(v) if k not in ("enum", "required", "default", "example") else v for k, v in schema.items()}
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        schema["additionalProperties"] = False
    return schema


def crd_validator(api_version: str, kind: str) -> jsonschema.Validator:
    with gzip.open(SCHEMAS / CRDS[api_version, kind]) as f:
        schema = json.load(f)["openAPIV3Schema"]
    return jsonschema.Draft7Validator(_closed(schema))


def validate(obj: dict) -> None:
    """Raises on any schema violation."""
    key = (obj["apiVersion"], obj["kind"])
    if key in CRDS:
        crd_validator(*key).validate(obj)
    else:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def adapter_config() -> dict:
    (configmap,) = _load(K8S / "prometheus-adapter.yaml")
    return yaml.safe_load(configmap["data"]["config.yaml"])


def adapter_validator() -> jsonschema.Validator:
    return jsonschema.Draft202012Validator(json.loads((SCHEMAS / "prometheus-adapter-config.json").read_text()))


def by_kind(objects: list[dict], kind: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


# --------------------------------------------------------------------------- schemas


def test_base_objects_validate():
    objects = base_objects()
    assert {o["kind"] for o in objects} == {
        "Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "PodMonitor"}
    for obj in objects:
        validate(obj)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates(overlay):
    objects = render(overlay)
    assert {o["kind"] for o in objects} == {
        "Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "PodMonitor", "ConfigMap"}
    for obj in objects:
        validate(obj)


def test_kserve_and_adapter_objects_validate():
    for obj in kserve_objects() + _load(K8S / "prometheus-adapter.yaml"):
        validate(obj)
    adapter_validator().validate(adapter_config())


def test_every_validator_catches_a_mistake():
    """The negative controls: each validator refuses a broken copy."""
    deployment = by_kind(base_objects(), "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/readyz"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)
    broken = copy.deepcopy(deployment)
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)

    isvc = by_kind(kserve_objects(), "InferenceService")
    for mutate in (lambda o: o["spec"]["predictor"]["model"].update(protocolVersion=2),
                   lambda o: o["spec"]["predictor"]["model"].update(storageURI="pvc://x"),
                   lambda o: o["spec"]["predictor"].update(minReplicas="2")):
        broken = copy.deepcopy(isvc)
        mutate(broken)
        with pytest.raises(jsonschema.ValidationError):
            validate(broken)

    podmonitor = by_kind(base_objects(), "PodMonitor")
    broken = copy.deepcopy(podmonitor)
    broken["spec"]["podMetricsEndpoints"][0]["portName"] = "http"  # it is `port`
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)

    runtime = by_kind(kserve_objects(), "ServingRuntime")
    broken = copy.deepcopy(runtime)
    broken["spec"]["protocolVersion"] = "v2"  # it is protocolVersions, a list
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)

    config = adapter_config()
    config["rules"][0]["metricQuery"] = config["rules"][0].pop("metricsQuery")
    with pytest.raises(jsonschema.ValidationError):
        adapter_validator().validate(config)


def prometheus_config_validator() -> jsonschema.Validator:
    with gzip.open(SCHEMAS / "prometheus-config.json.gz") as f:
        return jsonschema.Draft7Validator(json.load(f))


def test_plain_prometheus_scrape_config_validates():
    config = yaml.safe_load((K8S / "prometheus-scrape.yml").read_text())
    prometheus_config_validator().validate(config)
    config["scrape_configs"][0]["kubernetes_sd_configs"][0]["rol"] = "pod"  # the negative control
    with pytest.raises(jsonschema.ValidationError):
        prometheus_config_validator().validate(config)


def test_plain_prometheus_scrape_config_passes_promtool(tmp_path):
    """Prometheus's own parser on the rest of the job (relabelling, regexes): Debian's build
    has no Kubernetes discovery, so the copy it checks discovers from a static list instead."""
    config = yaml.safe_load((K8S / "prometheus-scrape.yml").read_text())
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": ["placeenv:8000"]}]
    del job["kubernetes_sd_configs"]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([need_tool("promtool"), "check", "config", str(path)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------- cross-checks


def _routes(module: Path) -> set[str]:
    """The paths of ``@<app or router>.get/post("...")`` in a module's source, under its
    ``APIRouter(prefix=...)``, and of its ``InferRoute("...")``: read, not imported, since the app
    imports Paddle."""
    tree = ast.parse(module.read_text())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    prefix = "".join(kw.value.value for call in calls if getattr(call.func, "id", None) == "APIRouter"
                     for kw in call.keywords if kw.arg == "prefix")
    functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    decorators = [d for function in functions for d in function.decorator_list
                  if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)]
    routes = {prefix + d.args[0].value for d in decorators
              if d.func.attr in ("get", "post") and d.args and isinstance(d.args[0], ast.Constant)}
    # The inference routes' table (routes.InferRoute): full paths, no prefix.
    return routes | {call.args[0].value for call in calls if getattr(call.func, "id", None) == "InferRoute"
                     and call.args and isinstance(call.args[0], ast.Constant)}


@pytest.fixture(scope="module")
def routes() -> set[str]:
    serve = ROOT / "placeenv" / "serve"
    found = _routes(serve / "http" / "app.py") | _routes(serve / "http" / "v2.py") | _routes(serve / "http" / "predict.py")
    assert {"/predict", "/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"} <= found, found
    return found


def deployments() -> list[dict]:
    found = [by_kind(base_objects(), "Deployment")]
    found += [by_kind(render(o), "Deployment") for o in OVERLAYS]
    return found


def containers() -> list[tuple[dict, dict]]:
    """(pod spec, container) for every Deployment and the ServingRuntime."""
    pods = [(d["spec"]["template"]["spec"], c) for d in deployments() for c in d["spec"]["template"]["spec"]["containers"]]
    runtime = by_kind(kserve_objects(), "ServingRuntime")["spec"]
    return pods + [(runtime, c) for c in runtime["containers"]]


def _dockerfile_port() -> str:
    return re.search(r"PLACEENV_PORT=(\d+)", (ROOT / "Dockerfile").read_text())[1]


def test_probes_are_routes_on_the_service_port(routes):
    for _, container in containers():
        ports = {p.get("name", ""): p["containerPort"] for p in container["ports"]}
        assert str(env_of(container)["PLACEENV_PORT"]) == _dockerfile_port() == "8000"
        assert list(ports.values()) == [8000]
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = container[kind]["httpGet"]
            assert get["path"] in routes, (kind, get["path"])
            assert ports.get(get["port"], get["port"]) == 8000
        # Readiness and start-up ask whether the models are loaded; liveness only whether it runs.
        assert container["readinessProbe"]["httpGet"]["path"] in ("/readyz", "/v2/health/ready")
        assert container["livenessProbe"]["httpGet"]["path"] in ("/healthz", "/v2/health/live")


def test_service_and_scrapers_use_the_named_port():
    objects = base_objects()
    (port,) = by_kind(objects, "Service")["spec"]["ports"]
    assert port["targetPort"] == "http" and port["port"] == 8000
    (endpoint,) = by_kind(objects, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    (job,) = yaml.safe_load((K8S / "prometheus-scrape.yml").read_text())["scrape_configs"]
    keep = {r["source_labels"][0]: r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"}
    assert keep["__meta_kubernetes_pod_container_port_name"] == "http"
    assert keep["__meta_kubernetes_pod_label_app_kubernetes_io_name"] == "placeenv"
    # The labels the adapter rule maps to resources.
    assert {r.get("target_label") for r in job["relabel_configs"]} >= {"namespace", "pod"}


def test_selectors_select_the_pods():
    objects = base_objects()
    deployment = by_kind(objects, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selectors = [deployment["spec"]["selector"]["matchLabels"], by_kind(objects, "Service")["spec"]["selector"],
                 by_kind(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
                 by_kind(objects, "PodMonitor")["spec"]["selector"]["matchLabels"]]
    for selector in selectors:
        assert selector.items() <= labels.items(), selector
    target = by_kind(objects, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])


def test_grace_periods_cover_the_drain():
    for deployment in deployments():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = env_of(container)
        drain = float(env["PLACEENV_SHUTDOWN_DELAY_S"]) + float(env["PLACEENV_SHUTDOWN_GRACE_S"])
        assert pod["terminationGracePeriodSeconds"] >= drain + 5
        assert float(env["PLACEENV_SHUTDOWN_DELAY_S"]) >= 5  # endpoints and proxies need seconds
        assert "lifecycle" not in container  # the delay is the service's own (deployment.yaml says why)
    runtime = by_kind(kserve_objects(), "ServingRuntime")
    env = env_of(runtime["spec"]["containers"][0])
    isvc = by_kind(kserve_objects(), "InferenceService")
    drain = float(env["PLACEENV_SHUTDOWN_DELAY_S"]) + float(env["PLACEENV_SHUTDOWN_GRACE_S"])
    assert isvc["spec"]["predictor"]["terminationGracePeriodSeconds"] >= drain + 5


def _exported() -> set[str]:
    return set(service_metrics.families())


def test_the_hpa_metric_is_exported_and_served_by_the_adapter_rule():
    hpa = by_kind(base_objects(), "HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    assert name == "inference_in_flight_requests" and name in _exported()
    (rule,) = adapter_config()["rules"]
    assert rule["name"]["as"] == name and re.fullmatch(rule["name"]["matches"], name)
    assert rule["seriesQuery"].startswith(name + "{")
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    # Each overlay keeps the metric; its target is 3/4 of its pods' saturation
    from placeenv.serve.config import Settings

    batch = Settings(_cli_parse_args=[]).max_batch_size
    for overlay in OVERLAYS:
        objects = render(overlay)
        (metric,) = by_kind(objects, "HorizontalPodAutoscaler")["spec"]["metrics"]
        (container,) = by_kind(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
        env = env_of(container)
        devices = int(container["resources"]["limits"].get("nvidia.com/gpu") or env["PLACEENV_SIM_DEVICES"])
        saturation = devices * int(env["PLACEENV_WORKERS_PER_DEVICE"]) * batch
        assert metric["pods"]["metric"]["name"] == name
        assert int(metric["pods"]["target"]["averageValue"]) == saturation * 3 // 4, overlay


def test_the_adapter_query_is_valid_promql(tmp_path):
    """The rule's metricsQuery as the adapter renders it for two pods, parsed by promtool."""
    (rule,) = adapter_config()["rules"]
    query = (rule["metricsQuery"].replace("<<.Series>>", "inference_in_flight_requests")
             .replace("<<.LabelMatchers>>", 'namespace="default",pod=~"placeenv-a|placeenv-b"')
             .replace("<<.GroupBy>>", "pod"))
    assert "<<" not in query
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "adapter", "rules": [
        {"record": "adapter:query", "expr": query}]}]}))
    result = subprocess.run([need_tool("promtool"), "check", "rules", str(rules)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_runs_as_non_root_on_a_read_only_root_with_writable_scratch():
    for pod, container in containers():
        security = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
        assert security["runAsNonRoot"] is True and security["runAsUser"] == 10001
        assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"] and security["seccompProfile"]["type"] == "RuntimeDefault"
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        empty = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
        assert empty <= set(mounts), "an emptyDir that nothing mounts"
        assert {mounts[n] for n in empty} == set(SCRATCH)
    assert "useradd --create-home --uid 10001 placeenv" in (ROOT / "Dockerfile").read_text()


#: resource.Quantity's syntax: the schemas type quantities as any string, so a typo passes them.
QUANTITY = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?")


def test_requests_limits_and_devices():
    for _, container in containers():
        resources = container["resources"]
        assert resources["requests"]["cpu"] and resources["requests"]["memory"] and resources["limits"]["memory"]
        for value in [*resources["requests"].values(), *resources["limits"].values()]:
            assert QUANTITY.fullmatch(str(value)), value
    cpu, gpu = (by_kind(render(o), "Deployment")["spec"]["template"]["spec"]["containers"][0]
                for o in OVERLAYS)
    assert "nvidia.com/gpu" not in cpu["resources"]["limits"] and cpu["image"].endswith(":cpu")
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1" and gpu["image"].endswith(":gpu")
    assert env_of(gpu)["PLACEENV_DEVICES"] == "auto" and env_of(cpu)["PLACEENV_SIM_DEVICES"] == "2"


def test_kserve_predictor_is_scaled_and_scraped_like_the_deployment():
    objects = kserve_objects()
    isvc = by_kind(objects, "InferenceService")
    assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "external"
    (hpa,) = [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == isvc["metadata"]["name"] + "-predictor"
    base = by_kind(base_objects(), "HorizontalPodAutoscaler")["spec"]
    assert hpa["spec"]["metrics"] == base["metrics"] and hpa["spec"]["behavior"] == base["behavior"]
    monitor = by_kind(objects, "PodMonitor")["spec"]
    assert monitor["selector"]["matchLabels"] == {"serving.kserve.io/inferenceservice": isvc["metadata"]["name"]}
    (container,) = by_kind(objects, "ServingRuntime")["spec"]["containers"]
    assert monitor["podMetricsEndpoints"][0]["portNumber"] == container["ports"][0]["containerPort"]


def test_kserve_runtime_matches_the_inference_service():
    runtime, isvc = by_kind(kserve_objects(), "ServingRuntime"), by_kind(kserve_objects(), "InferenceService")
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["protocolVersion"] == "v2" and "v2" in runtime["spec"]["protocolVersions"]
    assert model["modelFormat"] in [{k: f[k] for k in ("name", "version")} for f in runtime["spec"]["supportedModelFormats"]]
    assert model["storageUri"]
    # KServe's storage initializer downloads storageUri to /mnt/models (the CRD's default mount).
    (container,) = runtime["spec"]["containers"]
    assert container["name"] == "kserve-container"
    assert env_of(container)["PLACEENV_MODEL_REPOSITORY"] == "/mnt/models"
    # Why a runtime (inferenceservice.yaml): the CRD has the protocol and the storage URI on
    # `predictor.model`, and no protocol for a custom predictor's containers.
    with gzip.open(SCHEMAS / CRDS["serving.kserve.io/v1beta1", "InferenceService"]) as f:
        spec = json.load(f)["openAPIV3Schema"]["properties"]["spec"]
    predictor = spec["properties"]["predictor"]["properties"]
    assert {"protocolVersion", "storageUri", "runtime"} <= set(predictor["model"]["properties"])
    assert "containers" in predictor and "protocolVersion" not in predictor


def test_the_model_repository_component(tmp_path):
    """An overlay with components/model-repository: the claim mounted read-only where
    PLACEENV_MODEL_REPOSITORY points, the same claim and folder as KServe's storageUri."""
    k8s = os.path.relpath(K8S, tmp_path)  # kustomize refuses absolute paths to other roots
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [f"{k8s}/overlays/cpu"], "components": [f"{k8s}/components/model-repository"]}))
    objects = render(tmp_path)
    for obj in objects:
        validate(obj)
    pod = by_kind(objects, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (volume,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert env_of(container)["PLACEENV_MODEL_REPOSITORY"] == mount["mountPath"]
    assert mount["readOnly"] is True and volume["persistentVolumeClaim"]["readOnly"] is True
    assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}  # the patch keeps the scratch mount
    uri = by_kind(kserve_objects(), "InferenceService")["spec"]["predictor"]["model"]["storageUri"]
    assert uri == f"pvc://{volume['persistentVolumeClaim']['claimName']}/{mount['subPath']}"


def test_the_dashboard_configmap_is_the_compose_dashboard():
    for overlay in OVERLAYS:
        configmap = by_kind(render(overlay), "ConfigMap")
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        shipped = (ROOT / "deploy" / "grafana" / "dashboards" / "placeenv.json").read_text()
        assert configmap["data"]["placeenv.json"] == shipped, \
            "copy deploy/grafana/dashboards/placeenv.json to deploy/k8s/base/grafana-dashboard.json"


@pytest.mark.skipif(os.geteuid() != 0,
                    reason="needs root for a private read-only mount of / (CI runs as root)")
@pytest.mark.parametrize("scratch", [SCRATCH, []], ids=["with the emptyDirs", "without (the control)"])
def test_the_service_runs_on_a_read_only_root(scratch):
    """The service in a mount namespace where / is read-only and only the manifests' emptyDir
    paths are writable, as with readOnlyRootFilesystem; without them it cannot start."""
    unshare = need_tool("unshare")
    sim_cache = str(placeenv_sim.cache_root())  # built outside /tmp, readable in the namespace
    subprocess.run([sys.executable, "-m", "placeenv.sim", "build"], check=True, capture_output=True,
                   env={**os.environ, "PLACEENV_SIM_CACHE": sim_cache}, timeout=300)
    home = tempfile.mkdtemp(dir="/var/tmp", prefix="placeenv-ro-home-")  # read-only, like the image's
    # Each scratch path becomes a mount of its own before / turns read-only, so it stays
    # writable (an emptyDir); a tmpfs over it would hide a checkout or a venv under /tmp.
    setup = " && ".join(["mount --bind / /", *(f"mount --bind {path} {path}" for path in scratch),
                         "mount -o remount,ro,bind /"])
    proc = ServiceProcess(
        wrap=[unshare, "--mount", "--propagation", "private", "sh", "-c", setup + ' && exec "$@"', "sh"],
        extra_env={"HOME": home, "PYTHONDONTWRITEBYTECODE": "1", "PLACEENV_SIM_CACHE": sim_cache},
        DEVICES="sim:0", WORKERS_PER_DEVICE=1, MODELS="digits",
    )
    try:
        if not scratch:
            assert proc.proc.wait(120) != 0
            assert "No usable temporary directory" in proc.output()
            return
        proc.wait_ready(120)
        answer = httpx.post(proc.url + "/predict", json={"model": "digits", "inputs": [[8.0] * 64]}, timeout=30)
        assert answer.status_code == 200, answer.text
        assert proc.stop() == 0
    finally:
        proc.kill()
        shutil.rmtree(home, ignore_errors=True)
