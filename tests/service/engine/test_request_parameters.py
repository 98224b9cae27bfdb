"""A request's parameters reach its model (``Model.request_parameters``), as Triton's python backend gives a
model ``request.parameters()`` (tests/repository: ``params`` shows what its preprocess and execute read;
``params_caller`` calls it with ``Model.infer``):

* over v2 REST and gRPC (tritonclient's ``parameters=``), and across the link (``--frontends 1``); the
  parameters the service reads (``timeout``, ``priority``) and Triton's reserved ones never reach it;
* a batch joins only requests of the same parameters (``dispatch.batch_key``): queued together, requests
  of two parameter sets and none run as a batch of each, and the same parameters share one (the control);
* a model's call has its request's parameters, or its own when it gives them; a pipeline's step has them,
  unless the step says ``parameters: false`` (tests/repository/params_pipeline);
* what a parameter may be (a bool, a whole number, a number, a short string; 32 at most) is a 400 naming it.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from support.servers import TEST_REPOSITORY, ServiceProcess, batches, free_port, queued_together, ran

MAX_BATCH = 8
X = np.arange(8, dtype=np.float32).reshape(2, 4)


@pytest.fixture(scope="module")
def service_settings():
    # One worker: what a held worker leaves queued is what its next batches are made of.
    return {"MODELS": "gate,params,params_caller,params_pipeline", "DEVICES": "sim:0", "WORKERS_PER_DEVICE": 1,
            "MODEL_REPOSITORY": TEST_REPOSITORY, "MAX_BATCH_SIZE": MAX_BATCH, "GRPC_PORT": free_port()}


def body(x: np.ndarray, parameters: dict | None = None) -> dict:
    found = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    if parameters is not None:
        found["parameters"] = parameters
    return found


def seen(answer: httpx.Response) -> tuple[list[dict], np.ndarray]:
    """What the model read of the request's parameters, a row each, and its ``y``."""
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: o for o in answer.json()["outputs"]}
    y = np.reshape(outputs["y"]["data"], outputs["y"]["shape"]).astype(np.float32)
    return [json.loads(text) for text in outputs["seen"]["data"]], y


def over_rest(url: str, model: str, parameters: dict | None) -> tuple[list[dict], np.ndarray]:
    return seen(httpx.post(f"{url}/v2/models/{model}/infer", json=body(X, parameters), timeout=30))


def over_clients(url: str, target: str, parameters: dict) -> list[tuple[list[dict], np.ndarray]]:
    """``params`` asked with ``parameters`` by tritonclient's HTTP client (which adds binary_data_output,
    reserved) and its gRPC client, each with a priority and a timeout the service reads itself."""
    found = []
    for client, module in ((th.InferenceServerClient(url), th), (tg.InferenceServerClient(target), tg)):
        x = module.InferInput("x", list(X.shape), "FP32")
        x.set_data_from_numpy(X)
        result = client.infer("params", [x], parameters=parameters, priority=1, timeout=30_000_000)
        found.append(([json.loads(t) for t in result.as_numpy("seen")], result.as_numpy("y")))
    return found


SENT = {"tag": "a", "add": 2, "ratio": 0.5, "on": True}


def test_parameters_reach_the_models_preprocess_and_execute_over_v2_rest(service):
    rows, y = over_rest(service.url, "params", SENT)
    assert rows == [SENT, SENT]
    np.testing.assert_array_equal(y, X + 2)  # its preprocess read "add"
    # The control: a request without them reads none.
    rows, y = over_rest(service.url, "params", None)
    assert rows == [{}, {}] and np.array_equal(y, X)
    # Those the service reads itself, and Triton's reserved ones, are not the model's.
    reserved = {"timeout": 30_000_000, "priority": 1, "binary_data_output": False, "sequence_id": 3,
                "triton_thing": 1, "headers": "x"}
    assert over_rest(service.url, "params", {**reserved, "tag": "b"})[0] == [{"tag": "b"}] * 2


def test_parameters_reach_the_model_over_tritonclients_http_and_grpc(service, service_settings):
    for rows, y in over_clients(service.url[len("http://"):], f"127.0.0.1:{service_settings['GRPC_PORT']}", SENT):
        assert rows == [SENT, SENT]
        np.testing.assert_array_equal(y, X + 2)


def test_a_batch_joins_only_requests_of_the_same_parameters(service):
    kinds = [{"tag": "a"}, {"tag": "b"}, None, {"tag": 1}, {"tag": "a"}, {"tag": "b"}, None, {"tag": True}]
    one = X[:1]
    before = batches(service.url, "params")
    answers = queued_together(service, "params", [body(one, k) for k in kinds])
    for kind, answer in zip(kinds, answers):
        assert seen(answer)[0] == [kind or {}]  # each request's own, never a batch-mate's
    # A batch of 2 for each of a, b and none; 1 and true, each alone (a whole number is not a bool).
    assert ran(service.url, "params", before) == {1: 2, 2: 3}
    # The control: requests of the same parameters share one forward pass.
    before = batches(service.url, "params")
    answers = queued_together(service, "params", [body(one, {"tag": "a", "n": 2}) for _ in range(6)])
    assert all(seen(a)[0] == [{"n": 2, "tag": "a"}] for a in answers)
    assert ran(service.url, "params", before) == {6: 1}


def test_a_models_call_has_its_requests_parameters_or_its_own(service):
    rows, y = over_rest(service.url, "params_caller", {"tag": "outer", "add": 1})
    assert rows == [{"tag": "outer", "add": 1}] * 2
    np.testing.assert_array_equal(y, X + 1)  # the called model's preprocess read them too
    rows, y = over_rest(service.url, "params_caller", {"call_with": "inner", "add": 1})
    assert rows == [{"tag": "inner"}] * 2 and np.array_equal(y, X)  # its own, in place of the request's
    assert over_rest(service.url, "params_caller", None)[0] == [{}, {}]


def test_a_pipeline_step_has_its_requests_parameters_unless_it_says_parameters_false(service):
    answer = httpx.post(f"{service.url}/v2/models/params_pipeline/infer", json=body(X, SENT), timeout=30)
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: o for o in answer.json()["outputs"]}
    assert [json.loads(t) for t in outputs["seen"]["data"]] == [SENT, SENT]
    assert [json.loads(t) for t in outputs["seen_without"]["data"]] == [{}, {}]
    np.testing.assert_array_equal(np.reshape(outputs["y"]["data"], X.shape), X + 2)
    np.testing.assert_array_equal(np.reshape(outputs["y_without"]["data"], X.shape), X)  # "add" not read


@pytest.mark.parametrize("parameters, says", [
    ({f"p{i}": i for i in range(33)}, "33 parameters; send at most 32"),
    ({"k" * 65: 1}, "is not a name"),
    ({"tag": "x" * 257}, "parameter 'tag' is a string of 257 characters"),
    ({"tag": [1, 2]}, "parameter 'tag' is"),
    ({"tag": None}, "parameter 'tag' is"),
    ({"big": 1 << 64}, "parameter 'big'"),
])
def test_a_parameter_that_is_not_one_is_a_400_naming_it(service, parameters, says):
    answer = httpx.post(f"{service.url}/v2/models/params/infer", json=body(X, parameters), timeout=30)
    assert answer.status_code == 400, answer.text
    assert says in answer.json()["error"]


def test_parameters_cross_the_link_to_the_engine_process():
    grpc_port = free_port()
    with ServiceProcess(models="params,params_caller", devices="sim:0", workers_per_device=1,
                        model_repository=TEST_REPOSITORY, frontends=1, grpc_port=grpc_port) as proc:
        rows, y = over_rest(proc.url, "params_caller", SENT)
        assert rows == [SENT, SENT] and np.array_equal(y, X + 2)
        assert over_rest(proc.url, "params", None)[0] == [{}, {}]
        for rows, y in over_clients(proc.url[len("http://"):], f"127.0.0.1:{grpc_port}", SENT):
            assert rows == [SENT, SENT] and np.array_equal(y, X + 2)
