"""Model control (engine/control.py): loading and unloading models while the service serves, over
REST and gRPC with tritonclient, in one process and with front ends; version policies; warm-up
before a version serves; memory handed back on unload; a load that fails leaves the old serving."""

from __future__ import annotations

import shutil
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as triton
from support import wait_until
from support.servers import ServiceProcess, scrape, total
from tritonclient.utils import InferenceServerException

from placeenv.serve.config import BUNDLED
from placeenv.testing import free_port

PIXELS = np.zeros((1, 64), np.float32)

#: A model whose every run appends a line (its worker, its rows) to the file its parameters name, so a
#: test sees what warm-up ran; a zero input (the warm-up's) first connects to the test's port ``hold``,
#: if it names one, and waits there until the test lets it go: a test sees the service while a warm-up runs.
WARM = '''
import socket, threading

import paddle
from placeenv.serve.models import Model as Base, TensorSpec


class Model(Base):
    inputs = [TensorSpec("x", "FP32", (-1, 2))]
    outputs = [TensorSpec("y", "FP32", (-1, 2))]

    def load(self, context):
        return paddle.nn.Identity()

    def execute(self, inputs):
        x = inputs["x"]
        hold = self.context.parameters.get("hold")
        if hold and float(x.abs().sum()) == 0.0:
            with socket.create_connection(("127.0.0.1", int(hold)), timeout=120) as held:
                held.recv(1)  # the test's release: its end of the connection closing
        if self.context.parameters.get("fail"):
            raise RuntimeError("this program builds but cannot run")
        with open(self.context.parameters["log"], "a") as log:
            log.write(f"{threading.current_thread().name} {x.shape[0]}\\n")
        return {"y": x * 2}
'''

#: A model whose preprocess, for an input starting with 1, connects to the test's port ``hold`` and waits
#: there until the test lets it go: a request a test holds on its way to a worker.
SLOW = '''
import socket

import paddle
from placeenv.serve.models import Model as Base, TensorSpec


class Model(Base):
    inputs = [TensorSpec("x", "FP32", (-1, 2048))]
    outputs = [TensorSpec("x", "FP32", (-1, 2048))]

    def load(self, context):
        return paddle.nn.Identity()

    def preprocess(self, inputs):
        if inputs["x"][0, 0] == 1:
            with socket.create_connection(("127.0.0.1", int(self.context.parameters["hold"])), timeout=120) as held:
                held.recv(1)  # the test's release: its end of the connection closing
        return inputs
'''


def warm_model(repository: Path, name: str, log: Path, warmup: str, **parameters) -> Path:
    directory = repository / name
    (directory / "1").mkdir(parents=True, exist_ok=True)
    (directory / "1" / "model.py").write_text(WARM)
    params = "".join(f"\n  {k}: {v}" for k, v in {"log": str(log), **parameters}.items())
    (directory / "config.yaml").write_text(f"max_batch_size: 8\nparameters:{params}\nwarmup: {warmup}\n")
    return directory


@pytest.fixture(scope="module")
def gate():
    """Where ``slow``'s held requests connect: each connection accepted is a request held."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(60)
        yield server


@pytest.fixture(scope="module")
def repository(tmp_path_factory, gate) -> Path:
    root = tmp_path_factory.mktemp("control")
    for name in ("digits", "spare"):
        shutil.copytree(BUNDLED / "digits", root / name, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "slow" / "1").mkdir(parents=True)
    (root / "slow" / "1" / "model.py").write_text(SLOW)
    (root / "slow" / "config.yaml").write_text(f"parameters:\n  hold: {gate.getsockname()[1]}\n")
    broken = root / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.json").write_text("{ not a program")
    warm_model(root, "warm", root / "warm.log", "[{batch_sizes: [1, 4]}]")
    warm_model(root, "fails_warm", root / "fails.log", "[{batch_sizes: [2]}]", fail="true")
    return root


@pytest.fixture(scope="module", params=[0, 1], ids=["one-process", "1-frontend"])
def service_settings(request, repository):
    (repository / "warm.log").unlink(missing_ok=True)  # this service's warm-up writes it afresh
    return {"FRONTENDS": request.param, "MODEL_REPOSITORY": str(repository), "MODELS": "digits,slow,warm",
            "MODEL_CONTROL_MODE": "explicit", "DEVICES": "sim:0,sim:1", "WORKERS_PER_DEVICE": 1,
            "GRPC_PORT": free_port(), "REQUEST_TIMEOUT_S": 60}


@pytest.fixture(scope="module")
def client(service):
    with triton.InferenceServerClient(url=service.url.removeprefix("http://")) as client:
        yield client


@pytest.fixture(scope="module")
def grpc_client(service, service_settings):
    with grpcclient.InferenceServerClient(url=f"127.0.0.1:{service_settings['GRPC_PORT']}") as client:
        yield client


def infer(client, model: str = "digits", version: str = "") -> dict:
    tensor = triton.InferInput("pixels", list(PIXELS.shape), "FP32")
    tensor.set_data_from_numpy(PIXELS)
    return client.infer(model, [tensor], model_version=version).get_response()


def index(client) -> dict[str, list[tuple[str, str]]]:
    rows = {}
    for row in client.get_model_repository_index():
        rows.setdefault(row["name"], []).append((row.get("version", ""), row["state"]))
    return rows


def memory(url: str) -> dict[str, float]:
    samples = scrape(url)
    return {dict(labels)["device"]: value for (name, labels), value in samples.items()
            if name == "device_memory_used_bytes"}


def new_version(repository: Path, model: str, number: int, source: int = 1) -> None:
    shutil.copytree(repository / model / str(source), repository / model / str(number),
                    ignore=shutil.ignore_patterns("__pycache__"))


# -- loading and unloading ---------------------------------------------------------------------------------


def test_the_index_lists_the_repository_and_a_model_not_loaded_is_404(client):
    rows = index(client)
    assert rows["digits"] == [("1", "READY")] and rows["warm"] == [("1", "READY")]
    assert rows["spare"] == [("", "UNAVAILABLE")] and rows["broken"] == [("", "UNAVAILABLE")]
    reasons = {r["name"]: r.get("reason") for r in client.get_model_repository_index()}
    assert reasons["spare"] == "unloaded"
    with pytest.raises(InferenceServerException, match="unknown model 'spare'"):
        infer(client, "spare")


def test_load_serves_a_model_and_unload_takes_it_away_and_hands_its_memory_back(client, service):
    before = memory(service.url)
    client.load_model("spare")
    assert client.is_model_ready("spare") and infer(client, "spare")["model_version"] == "1"
    # Its weights, on each device (with front ends, the engine's gauges reach /metrics a moment later).
    loaded = wait_until(lambda: (m := memory(service.url)) and all(m[d] > before[d] for d in before) and m, 30,
                        lambda: f"device memory did not grow: {before} -> {memory(service.url)}")
    client.unload_model("spare")
    with pytest.raises(InferenceServerException, match="unknown model 'spare'") as refused:
        infer(client, "spare")
    assert "404" in str(refused.value)
    # Every byte of its weights handed back, on every device (and the allocator's cache with them: it
    # may read less than before the load).
    wait_until(lambda: all(v <= before[d] for d, v in memory(service.url).items()), 30,
               lambda: f"device memory not handed back: {before} -> {loaded} -> {memory(service.url)}")
    assert index(client)["spare"] == [("", "UNAVAILABLE")]
    assert infer(client)["model_version"] == "1"  # the others served on


def test_grpc_loads_and_unloads_as_rest_does(grpc_client):
    grpc_client.load_model("spare")
    assert grpc_client.is_model_ready("spare")
    assert {m.name for m in grpc_client.get_model_repository_index().models if m.state == "READY"} >= {"spare"}
    grpc_client.unload_model("spare")
    with pytest.raises(InferenceServerException, match="spare"):
        grpc_client.get_model_metadata("spare")


def test_a_new_version_replaces_the_old_under_the_default_policy(client, repository):
    new_version(repository, "digits", 2)
    try:
        client.load_model("digits")
        assert client.get_model_metadata("digits")["versions"] == ["2"]
        assert infer(client)["model_version"] == "2"
        with pytest.raises(InferenceServerException, match="has no version '1'"):
            infer(client, version="1")
    finally:
        shutil.rmtree(repository / "digits" / "2")
    client.load_model("digits")  # the repository again as it was: version 1, loaded from scratch
    assert client.get_model_metadata("digits")["versions"] == ["1"] and infer(client)["model_version"] == "1"


def test_requests_in_flight_finish_on_the_version_they_started_on(client, service, repository, gate):
    """A request to ``slow`` version 1, held in its preprocess, while a load retires version 1: the
    catalog changes at once, the request still runs on version 1, and the load answers after it."""
    new_version(repository, "slow", 2)
    # Over the inline size: preprocessed on a thread, which it holds (not the event loop).
    body = {"inputs": [{"name": "x", "shape": [1, 2048], "datatype": "FP32", "data": [1.0] * 2048}]}
    pool = ThreadPoolExecutor(2)  # (a tritonclient HTTP client is one connection: one thread's)
    try:
        held = pool.submit(httpx.post, f"{service.url}/v2/models/slow/infer", json=body, timeout=60)
        connection, _ = gate.accept()  # the request is in slow's preprocess
        with connection:
            load = pool.submit(httpx.post, f"{service.url}/v2/repository/models/slow/load", timeout=60)
            wait_until(lambda: client.get_model_metadata("slow")["versions"] == ["2"], 60,
                       "the catalog did not change to slow version 2")
            assert not load.done()  # draining version 1's request
        answer = held.result(timeout=60)
        assert answer.status_code == 200 and answer.json()["model_version"] == "1"
        assert load.result(timeout=60).status_code == 200
    finally:
        pool.shutdown()
        shutil.rmtree(repository / "slow" / "2")
    client.load_model("slow")
    assert client.get_model_metadata("slow")["versions"] == ["1"]


def test_a_load_that_fails_names_why_and_leaves_what_served_serving(client, service, repository):
    with pytest.raises(InferenceServerException, match="broken") as refused:
        client.load_model("broken")
    assert "400" in str(refused.value) and "model.json" in str(refused.value)
    reasons = {r["name"]: r.get("reason", "") for r in client.get_model_repository_index()}
    assert "the last load failed" in reasons["broken"]
    assert total(scrape(service.url), "placeenv_model_load_failed", model="broken") == 1
    # A broken new version of a served model: refused, its old version serving on.
    (repository / "digits" / "3").mkdir()
    (repository / "digits" / "3" / "model.json").write_text("{ not a program")
    try:
        with pytest.raises(InferenceServerException, match="digits"):
            client.load_model("digits")
        assert infer(client)["model_version"] == "1"
        assert total(scrape(service.url), "placeenv_model_load_failed", model="digits") == 1
    finally:
        shutil.rmtree(repository / "digits" / "3")
    client.load_model("digits")
    assert total(scrape(service.url), "placeenv_model_load_failed", model="digits") == 0
    assert total(scrape(service.url), "placeenv_model_loads_total", model="digits", outcome="failed") >= 1


@pytest.mark.parametrize("call, problem", [
    (lambda c: c.load_model("digits", config='{"max_batch_size": 1}'), "load parameter 'config' is not taken"),
    (lambda c: c.load_model("no_such_model"), "not in the repository"),
    (lambda c: c.unload_model("no_such_model"), "model 'no_such_model' is not loaded"),
])
def test_a_load_names_only_a_model_of_the_repositories(client, call, problem):
    with pytest.raises(InferenceServerException, match=problem):
        call(client)


def test_a_load_body_that_is_not_json_is_400(service):
    answer = httpx.post(f"{service.url}/v2/repository/models/digits/load", content=b"nonsense")
    assert answer.status_code == 400 and "is not a repository request" in answer.json()["error"]


# -- warm-up -----------------------------------------------------------------------------------------------


def test_each_worker_warms_each_version_up_before_it_serves(client, repository):
    """Started with ``warm``: its log has each worker's warm-up runs (batch sizes 1 and 4) and no request."""
    lines = (repository / "warm.log").read_text().split("\n")
    runs = sorted(line.split()[1] for line in lines if line)
    workers = {line.split()[0] for line in lines if line}
    assert len(workers) == 2 and runs == ["1", "1", "4", "4"], lines


def test_a_warm_up_that_fails_is_the_loads_error_naming_the_model_and_worker(client):
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("fails_warm")
    message = str(refused.value)
    assert "fails_warm" in message and "worker sim:" in message and "warmup[0] batch 2 failed" in message
    assert "cannot run" in message
    assert index(client)["fails_warm"] == [("", "UNAVAILABLE")]


def test_readiness_waits_for_warm_up(tmp_path):
    """A warm-up that waits for the test: while it does, the service is not ready (it listens once its
    models are loaded and warm); once it ran, ready."""
    with socket.create_server(("127.0.0.1", 0)) as gate:
        gate.settimeout(120)
        warm_model(tmp_path, "held", tmp_path / "held.log", "[{batch_sizes: [1]}]", hold=gate.getsockname()[1])
        # Not ``with``: entering waits until ready.
        service = ServiceProcess(MODEL_REPOSITORY=str(tmp_path), MODELS="held", DEVICES="sim:0",
                                 WORKERS_PER_DEVICE=1)
        try:
            connection, _ = gate.accept()  # the worker is in its warm-up
            with connection:
                assert not service.ready() and not (tmp_path / "held.log").exists()
            service.wait_ready()
            assert (tmp_path / "held.log").read_text().split()[1] == "1"
        finally:
            service.stop()
            service.kill()


# -- policies and the control's mode ------------------------------------------------------------------------


def test_control_off_refuses_a_load_saying_how_to_turn_it_on(tmp_path):
    with ServiceProcess(DEVICES="sim:0", WORKERS_PER_DEVICE=1) as s:
        s.wait_ready()
        answer = httpx.post(f"{s.url}/v2/repository/models/digits/load")
        assert answer.status_code == 400 and "--model-control-mode explicit" in answer.json()["error"]


def test_poll_loads_what_changes_and_a_broken_change_leaves_the_old_serving(tmp_path):
    shutil.copytree(BUNDLED / "digits", tmp_path / "digits", ignore=shutil.ignore_patterns("__pycache__"))
    settings = {"MODEL_REPOSITORY": str(tmp_path), "MODELS": "", "MODEL_CONTROL_MODE": "poll",
                "REPOSITORY_POLL_S": 0.3, "DEVICES": "sim:0", "WORKERS_PER_DEVICE": 1}
    with ServiceProcess(**settings) as s:
        s.wait_ready()
        client = triton.InferenceServerClient(url=s.url.removeprefix("http://"))
        new_version(tmp_path, "digits", 2)
        wait_until(lambda: client.get_model_metadata("digits")["versions"] == ["2"], 60, s.output)
        assert infer(client)["model_version"] == "2"
        (tmp_path / "digits" / "3").mkdir()
        (tmp_path / "digits" / "3" / "model.json").write_text("{ not a program")
        wait_until(lambda: total(scrape(s.url), "placeenv_model_load_failed", model="digits") == 1, 60, s.output)
        assert infer(client)["model_version"] == "2"
        reasons = {r["name"]: r.get("reason", "") for r in client.get_model_repository_index()}
        assert "the last load failed" in reasons["digits"] and "model.json" in reasons["digits"]
        assert "does not load; what served it serves on" in s.output()
        shutil.rmtree(tmp_path / "digits" / "3")
        wait_until(lambda: total(scrape(s.url), "placeenv_model_load_failed", model="digits") == 0, 60, s.output)
        shutil.copytree(tmp_path / "digits", tmp_path / "spare")  # a new model directory: loaded
        wait_until(lambda: "spare" in {m["name"] for m in client.get_model_repository_index()
                                       if m["state"] == "READY"}, 60, s.output)
        shutil.rmtree(tmp_path / "spare")  # gone from the repository: unloaded
        wait_until(lambda: "spare" not in {m["name"] for m in client.get_model_repository_index()
                                           if m["state"] == "READY"}, 60, s.output)
        answer = httpx.post(f"{s.url}/v2/repository/models/digits/load")
        assert answer.status_code == 400 and "polls its repository" in answer.json()["error"]
