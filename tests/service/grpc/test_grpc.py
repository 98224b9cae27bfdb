"""The Open Inference Protocol over gRPC (``PLACEENV_GRPC_PORT``), through tritonclient.grpc.

A real service process with both endpoints: health, metadata and the repository index agree
with HTTP; inference through raw and typed contents gives HTTP's answers; errors carry the
status codes of ``errors.OUTCOMES``; concurrent calls are each answered with their own
result; SIGTERM turns readiness off while calls are still served, then closes the port.
"""

from __future__ import annotations

import asyncio
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
    assert client.infer("mobilenet", [image]).as_numpy("output_0").shape == (1, 10)


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
    (lambda c: c.infer("digits", [tg.InferInput("p" * 5000, [1, 64], "FP32").set_data_from_numpy(
        np.ones((1, 64), np.float32))]), "INVALID_ARGUMENT", "..."),
])
def test_errors_carry_the_outcomes_status_codes(served, call, code, words):
    _, target = served
    with pytest.raises(InferenceServerException) as caught:
        call(tg.InferenceServerClient(target))
    assert caught.value.status() == f"StatusCode.{code}"
    assert words in caught.value.message() and len(caught.value.message()) < 400  # a prefix of the input at most


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
