"""A v2 request whose datatype is not the model's is refused for that, before its data is read.

``INT8`` with the data ``[0.5, ...]`` for mobilenet's FP32 ``image`` is answered 400 /
INVALID_ARGUMENT naming the input, the datatype sent and the model's, by one rule
(``wire.check_input`` with the model's datatypes from ``Catalog.resolve``), the same for REST JSON,
REST binary, gRPC raw and gRPC typed contents; not "has the value 0.5 at position [0]; expected
integers", which is what reading the data as the datatype sent would say. Controls: the right
datatype is served, and without the model's datatype the data check gives that other answer.
"""

from __future__ import annotations

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from support.servers import ServiceProcess, free_port
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as rpc
from tritonclient.utils import InferenceServerException

from placeenv.serve.protocol import wire
from placeenv.serve.protocol.errors import InvalidInput

SHAPE = [1, 3, 32, 32]
VALUES = [0.5] * (3 * 32 * 32)
MESSAGE = "input 'image' has datatype INT8; expected FP32, the model's datatype for it: send the data as FP32"


@pytest.fixture(scope="module")
def served():
    port = free_port()
    with ServiceProcess(devices="cpu", workers_per_device=1, models="mobilenet", grpc_port=port) as proc:
        yield proc, f"127.0.0.1:{port}"


def _json(datatype: str) -> dict:
    return {"inputs": [{"name": "image", "shape": SHAPE, "datatype": datatype, "data": VALUES}]}


def test_rest_json_names_the_input_and_both_datatypes(served):
    proc, _ = served
    answer = httpx.post(proc.url + "/v2/models/mobilenet/infer", json=_json("INT8"), timeout=30)
    assert answer.status_code == 400 and answer.json() == {"error": MESSAGE}, answer.text


def test_rest_binary_gets_the_same_answer(served):
    proc, _ = served
    item = th.InferInput("image", SHAPE, "INT8")
    item.set_data_from_numpy(np.zeros(SHAPE, np.int8), binary_data=True)
    with pytest.raises(InferenceServerException) as refused:
        th.InferenceServerClient(proc.url.removeprefix("http://")).infer("mobilenet", [item])
    assert refused.value.status() == "400" and refused.value.message() == MESSAGE, refused.value


def test_grpc_raw_contents_get_the_same_answer(served):
    _, target = served
    item = tg.InferInput("image", SHAPE, "INT8")
    item.set_data_from_numpy(np.zeros(SHAPE, np.int8))
    with pytest.raises(InferenceServerException) as refused:
        tg.InferenceServerClient(target).infer("mobilenet", [item])
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT", refused.value
    assert refused.value.message() == MESSAGE, refused.value


def test_grpc_typed_contents_get_the_same_answer_not_a_missing_field(served):
    # FP32 values in fp32_contents under datatype INT8: the datatype is named, not "send int_contents".
    _, target = served
    request = pb.ModelInferRequest(model_name="mobilenet")
    item = request.inputs.add(name="image", datatype="INT8", shape=SHAPE)
    item.contents.fp32_contents.extend(VALUES)
    with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError) as refused:
        rpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == MESSAGE, refused.value.details()


def test_control_the_models_datatype_is_served(served):
    proc, _ = served
    answer = httpx.post(proc.url + "/v2/models/mobilenet/infer", json=_json("FP32"), timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["shape"] == [1, 10]


def test_control_without_the_models_datatype_the_data_check_answers_as_before():
    with pytest.raises(InvalidInput, match=r"has the value 0\.5 at position \[0\]; expected integers"):
        wire.from_json([0.5], "INT8", "image")
    with pytest.raises(InvalidInput, match="expected FP32"):
        wire.check_input({}, "image", "INT8", {"image": "FP32"})
    wire.check_input({}, "image", "FP32", {"image": "FP32"})
    with pytest.raises(InvalidInput, match="the service takes"):  # an unknown datatype: as before
        wire.check_input({}, "image", "FLOAT", {"image": "FP32"})
    with pytest.raises(InvalidInput, match="appears twice"):
        wire.check_input({"image": np.zeros(1)}, "image", "FP32", {"image": "FP32"})
