"""The Open Inference Protocol over gRPC (``PLACEENV_GRPC_PORT``), through tritonclient.grpc.

A real service process with both endpoints: health, metadata and the repository index agree
with HTTP; inference through raw and typed contents gives HTTP's answers; errors carry the
status codes of ``errors.OUTCOMES``; concurrent calls are each answered with their own
result; SIGTERM turns readiness off while calls are still served, then closes the port.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tga
import tritonclient.http as th
from support import wait_until
from support.servers import ServiceProcess, free_port
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as rpc
from tritonclient.utils import InferenceServerException

SETTINGS = {"MODELS": "digits,mobilenet", "DEVICES": "sim:0,sim:1", "WORKERS_PER_DEVICE": 1}
DIGITS = np.arange(3 * 64, dtype=np.float32).reshape(3, 64) % 17


@pytest.fixture(scope="module", params=[0, 2], ids=["one-process", "2-frontends"])
def service_settings(request):
    """Every test twice: the single process, and an engine with 2 front-end processes."""
    return {"GRPC_PORT": free_port(), "FRONTENDS": request.param, **SETTINGS}


@pytest.fixture(scope="module")
def served(service, service_settings):
    """The service and its gRPC address."""
    return service, f"127.0.0.1:{service_settings['GRPC_PORT']}"


def pixels(array: np.ndarray) -> tg.InferInput:
    item = tg.InferInput("pixels", list(array.shape), "FP32")
    item.set_data_from_numpy(array)
    return item


def http_answer(proc: ServiceProcess, array: np.ndarray) -> dict[str, np.ndarray]:
    client = th.InferenceServerClient(proc.url.removeprefix("http://"))
    item = th.InferInput("pixels", list(array.shape), "FP32")
    item.set_data_from_numpy(array, binary_data=True)
    result = client.infer("digits", [item])
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


def test_health_metadata_and_index_agree_with_http(served):
    proc, target = served
    client = tg.InferenceServerClient(target)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("digits") and client.is_model_ready("mobilenet", "1")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "placeenv" and "binary_tensor_data" in meta["extensions"]
    http = httpx.get(proc.url + "/v2/models/digits").json()
    grpc_meta = client.get_model_metadata("digits", as_json=True)
    assert grpc_meta["name"] == http["name"] and grpc_meta["versions"] == http["versions"]
    for kind in ("inputs", "outputs"):  # protobuf's JSON writes int64 shapes as strings
        assert [{**t, "shape": [int(d) for d in t["shape"]]} for t in grpc_meta[kind]] == http[kind]
    index = client.get_model_repository_index(as_json=True)["models"]
    assert index == httpx.post(proc.url + "/v2/repository/index").json()


def test_inference_gives_http_answers(served):
    proc, target = served
    client = tg.InferenceServerClient(target)
    result = client.infer("digits", [pixels(DIGITS)], request_id="r-7")
    assert result.get_response().id == "r-7" and result.get_response().model_version == "1"
    expected = http_answer(proc, DIGITS)
    for name, array in expected.items():
        np.testing.assert_array_equal(result.as_numpy(name), array)
    only = client.infer("digits", [pixels(DIGITS)], outputs=[tg.InferRequestedOutput("label")])
    assert [o.name for o in only.get_response().outputs] == ["label"]
    image = tg.InferInput("image", [1, 3, 32, 32], "FP32")
    image.set_data_from_numpy(np.zeros((1, 3, 32, 32), np.float32))
    assert client.infer("mobilenet", [image]).as_numpy("fetch_name_0").shape == (1, 10)


def test_typed_contents_as_well_as_raw(served):
    """``contents.fp32_contents`` instead of raw bytes: the generated stub, as any KServe v2 client sends it."""
    proc, target = served
    with grpc.insecure_channel(target) as channel:
        stub = rpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="digits", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="pixels", datatype="FP32", shape=[3, 64],
            contents=pb.InferTensorContents(fp32_contents=DIGITS.ravel().tolist()))])
        response = stub.ModelInfer(request)
        labels = np.frombuffer(response.raw_output_contents[0], dtype="<i8")
        np.testing.assert_array_equal(labels, http_answer(proc, DIGITS)["label"])
        half = pb.ModelInferRequest(model_name="digits", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="pixels", datatype="FP16", shape=[1, 64])])
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(half)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # The datatype is checked against the model's first (tests/service/protocol/test_wrong_datatype.py).
        assert "'pixels' has datatype FP16; expected FP32" in caught.value.details()


def test_fp16_without_raw_contents_is_told_to_send_raw_input_contents():
    """FP16 has no typed field in InferTensorContents: an FP16 input of an FP16 model sent without
    raw bytes is told where its data goes (the service's models take FP32, so this is the parser's)."""
    from placeenv.serve import grpc as grpc_service
    from placeenv.serve.protocol.errors import InvalidInput

    half = pb.ModelInferRequest(model_name="m", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="pixels", datatype="FP16", shape=[1, 64])])
    with pytest.raises(InvalidInput) as caught:
        grpc_service.inputs_of(half, {"pixels": "FP16"})
    assert "raw_input_contents" in str(caught.value)
    assert "FP16 has no typed contents" in str(caught.value)


@pytest.mark.parametrize("call, code, words", [
    (lambda c: c.infer("no-such-model", [pixels(DIGITS)]), "NOT_FOUND", "available: digits, mobilenet"),
    (lambda c: c.infer("digits", [pixels(DIGITS)], model_version="9"), "NOT_FOUND", "version"),
    (lambda c: c.infer("digits", [pixels(DIGITS[:, :63].copy())]), "INVALID_ARGUMENT", "expected"),
    (lambda c: c.get_model_metadata("no-such-model"), "NOT_FOUND", "no-such-model"),
    (lambda c: c.get_model_config("no-such-model"), "NOT_FOUND", "available: digits, mobilenet"),
    (lambda c: c.get_model_config("digits", "9"), "NOT_FOUND", "version"),
    (lambda c: c.get_inference_statistics("no-such-model"), "NOT_FOUND", "available: digits, mobilenet"),
    (lambda c: c.infer("digits", [tg.InferInput("p" * 5000, [1, 64], "FP32").set_data_from_numpy(
        np.ones((1, 64), np.float32))]), "INVALID_ARGUMENT", "..."),
])
def test_errors_carry_the_outcomes_status_codes(served, call, code, words):
    _, target = served
    with pytest.raises(InferenceServerException) as caught:
        call(tg.InferenceServerClient(target))
    assert caught.value.status() == f"StatusCode.{code}"
    assert words in caught.value.message() and len(caught.value.message()) < 400  # a prefix of the input at most


def test_model_config_is_https_as_tritons_message(served):
    """ModelConfig answers the message HTTP's /config parses into: the same config, both protocols."""
    proc, target = served
    client = tg.InferenceServerClient(target)
    for model in ("digits", "mobilenet"):
        http = httpx.get(f"{proc.url}/v2/models/{model}/config").json()
        expected = json_format.ParseDict(http, model_config_pb2.ModelConfig())
        assert client.get_model_config(model).config == expected, model
        assert client.get_model_config(model, "1").config == expected, model
    config = client.get_model_config("digits", as_json=True)["config"]
    assert config["name"] == "digits" and config["platform"] == "paddle_jit"  # its program, on sim; its model.py only preprocesses
    assert config["input"] == [{"name": "pixels", "data_type": "TYPE_FP32", "dims": ["64"]}]  # (int64: a string)
    # Two sim devices, one worker each: KIND_MODEL (Triton has no kind for them), a worker per device.
    assert config["instance_group"] == [{"kind": "KIND_MODEL", "count": 1}]
    assert json.loads(config["parameters"]["parameters"]["string_value"]) == {"pixel_max": 16}


def statistics(client, model: str) -> dict:
    """Triton's statistics of ``model``'s one version over gRPC, its int64 figures as numbers."""
    (found,) = client.get_inference_statistics(model, as_json=True)["model_stats"]

    def numbers(value):
        if isinstance(value, dict):
            return {k: v if k in ("name", "version") else numbers(v) for k, v in value.items()}
        if isinstance(value, list):
            return [numbers(v) for v in value]
        return int(value)

    return numbers(found)


def test_statistics_count_what_ran_and_agree_with_http(served):
    """Known requests over gRPC: each runs alone (one at a time), so 3 requests of 3 examples are 3
    batches of 3; every stage has time. HTTP's statistics are the same figures."""
    proc, target = served
    client = tg.InferenceServerClient(target)
    before = statistics(client, "digits")
    for _ in range(3):
        client.infer("digits", [pixels(DIGITS)])
    after = statistics(client, "digits")
    assert after["name"] == "digits" and after["version"] == "1"
    assert after["inference_count"] - before.get("inference_count", 0) == 9
    assert after["execution_count"] - before.get("execution_count", 0) == 3
    stats, old = after["inference_stats"], before.get("inference_stats", {})
    for stage in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        count = stats[stage]["count"] - old.get(stage, {}).get("count", 0)
        ns = stats[stage]["ns"] - old.get(stage, {}).get("ns", 0)
        assert count == 3 and ns > 0, (stage, count, ns)
    assert "fail" not in stats or stats["fail"] == old.get("fail")  # protobuf leaves out a zero message
    threes = {row["batch_size"]: row for row in after["batch_stats"]}[3]
    was = {row["batch_size"]: row for row in before.get("batch_stats", [])}.get(3, {})
    assert threes["compute_infer"]["count"] - was.get("compute_infer", {}).get("count", 0) == 3
    # The same figures as HTTP's (no request in between), read as Triton's message.
    (http,) = th.InferenceServerClient(proc.url.removeprefix("http://")).get_inference_statistics("digits")["model_stats"]
    # HTTP's adds what runs the version on each device, which Triton's message has no field for.
    assert http["backends"] and all(b.startswith("jit") for b in http["backends"].values()), http["backends"]
    assert json_format.ParseDict(http, pb.ModelStatistics(), ignore_unknown_fields=True) == client.get_inference_statistics(
        "digits").model_stats[0]


def test_concurrent_calls_each_get_their_own_answer(served):
    proc, target = served
    rows = [np.full((1 + i % 4, 64), i % 17, np.float32) for i in range(48)]
    before = proc.total("inference_requests_total", model="digits", status="ok")

    async def main():
        async with tga.InferenceServerClient(target) as client:
            async def one(array):
                item = tga.InferInput("pixels", list(array.shape), "FP32")
                item.set_data_from_numpy(array)
                return (await client.infer("digits", [item])).as_numpy("probabilities")
            return await asyncio.gather(*(one(r) for r in rows))

    answers = asyncio.run(main())
    # Batched with other calls (batch composition moves float sums by ~1e-9), each call still
    # gets the answer to its own rows: 17 different inputs, in batches of 1 to 4.
    for row, answer in zip(rows, answers, strict=True):
        np.testing.assert_allclose(answer, http_answer(proc, row)["probabilities"], rtol=1e-5, atol=1e-7)
    # With front ends, the one that answered writes its counts for the others' /metrics within a
    # quarter second (metrics.py): wait for them.
    def counted() -> float:
        return proc.total("inference_requests_total", model="digits", status="ok") - before

    wait_until(lambda: counted() >= 48, 30, lambda: f"{counted():g} of 48 answers counted")


def test_a_taken_port_refuses_to_start():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = ServiceProcess(GRPC_PORT=taken.getsockname()[1], **SETTINGS)
        try:
            assert proc.proc.wait(120) != 0
        finally:
            proc.kill()
    assert "cannot listen on 127.0.0.1:" in proc.output() and "--grpc-port" in proc.output()


def test_sigterm_turns_readiness_off_then_closes_the_port():
    port = free_port()
    proc = ServiceProcess(GRPC_PORT=port, SHUTDOWN_DELAY_S=2.0, **SETTINGS).wait_ready()
    try:
        client = tg.InferenceServerClient(f"127.0.0.1:{port}")
        assert client.is_server_ready()
        proc.proc.send_signal(signal.SIGTERM)
        # readiness off at once ...
        wait_until(lambda: not client.is_server_ready(), 0.5, "readiness still on after SIGTERM")
        assert client.infer("digits", [pixels(DIGITS)]).as_numpy("label").shape == (3,)  # ... still serving
        assert proc.proc.wait(60) == 0
        with pytest.raises(InferenceServerException) as caught:
            tg.InferenceServerClient(f"127.0.0.1:{port}").is_server_live()
        assert caught.value.status() == "StatusCode.UNAVAILABLE"
    finally:
        proc.kill()
