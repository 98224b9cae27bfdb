"""BYTES tensors through every protocol of a real service, with tritonclient's own encoding: v2 JSON
(strings), v2 binary data, gRPC raw and typed contents, ``/predict``; in the single process and
across the link to an engine process. The test model (tests/repository/text) upper-cases each text
on a sim device and says its length; the answers come back as ``np.object_`` arrays of bytes."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from support.servers import free_port
from tritonclient.grpc import service_pb2 as pb

TEXTS = np.array([b"hello", "héllo wörld".encode(), b"", b"\xff\xfeok"], dtype=np.object_)
UPPER = [b"HELLO", "HéLLO WöRLD".encode(), b"", b"\xff\xfeOK"]


@pytest.fixture(scope="module", params=[0, 1], ids=["one-process", "1-frontend"])
def service_settings(request):
    return {"GRPC_PORT": free_port(), "FRONTENDS": request.param, "MODELS": "text", "DEVICES": "sim:0,sim:1",
            "WORKERS_PER_DEVICE": 1}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_http_sends_and_reads_bytes_unmodified(service, binary):
    texts = TEXTS if binary else TEXTS[:3]  # JSON carries text only: tritonclient refuses b"\xff"
    client = th.InferenceServerClient(service.url.removeprefix("http://"))
    item = th.InferInput("text", [len(texts)], "BYTES")
    item.set_data_from_numpy(texts, binary_data=binary)
    wanted = [th.InferRequestedOutput("upper", binary_data=binary), th.InferRequestedOutput("length")]
    answer = client.infer("text", [item], outputs=wanted)
    upper = answer.as_numpy("upper")  # from JSON, tritonclient gives the strings as str
    assert upper.dtype == np.object_
    assert [u if isinstance(u, bytes) else u.encode() for u in upper.tolist()] == UPPER[:len(texts)]
    assert answer.as_numpy("length").tolist() == [len(t) for t in texts]


def test_bytes_that_are_not_text_go_back_as_binary_data_even_when_json_is_asked(service):
    client = th.InferenceServerClient(service.url.removeprefix("http://"))
    item = th.InferInput("text", [len(TEXTS)], "BYTES")
    item.set_data_from_numpy(TEXTS, binary_data=True)
    answer = client.infer("text", [item], outputs=[th.InferRequestedOutput("upper", binary_data=False)])
    assert answer.as_numpy("upper").tolist() == UPPER  # exact: JSON cannot carry b"\xff"


def test_tritonclient_grpc_sends_and_reads_bytes_raw_and_typed(service, service_settings):
    address = f"127.0.0.1:{service_settings['GRPC_PORT']}"
    client = tg.InferenceServerClient(address)
    item = tg.InferInput("text", [len(TEXTS)], "BYTES")
    item.set_data_from_numpy(TEXTS)  # raw_input_contents, serialized
    answer = client.infer("text", [item])
    assert answer.as_numpy("upper").tolist() == UPPER
    typed = pb.ModelInferRequest(model_name="text")
    typed.inputs.add(name="text", datatype="BYTES", shape=[len(TEXTS)]).contents.bytes_contents.extend(TEXTS.tolist())
    stub = client._client_stub  # the generated stub: tritonclient only ever sends raw contents
    found = stub.ModelInfer(typed)
    assert found.outputs[0].name == "upper"
    from tritonclient.utils import deserialize_bytes_tensor
    assert deserialize_bytes_tensor(found.raw_output_contents[0]).tolist() == UPPER


def test_predict_takes_a_list_of_strings_and_answers_text(service):
    answer = httpx.post(f"{service.url}/predict", json={"model": "text", "inputs": ["abc", "Zoë"]}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"] == [{"upper": "ABC", "length": 3}, {"upper": "ZOë", "length": 4}]


@pytest.mark.parametrize("body, says", [
    ({"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", 1]}]}, "expected strings"),
    ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x" * 65]}]}, "at most 64 bytes"),
])
def test_bad_bytes_get_a_clear_400(service, body, says):
    answer = httpx.post(f"{service.url}/v2/models/text/infer", json=body, timeout=30)
    assert answer.status_code == 400 and says in answer.json()["error"], answer.text


def test_a_length_past_the_end_of_the_binary_data_gets_a_400_that_quotes_nothing(service):
    header = b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 8}}]}'
    body = header + b"\x40\x00\x00\x00" + b"s3cr"
    answer = httpx.post(f"{service.url}/v2/models/text/infer", content=body, timeout=30,
                        headers={"Inference-Header-Content-Length": str(len(header)),
                                 "Content-Type": "application/octet-stream"})
    assert answer.status_code == 400 and "past the end of the data" in answer.json()["error"], answer.text
    assert "s3cr" not in answer.text
