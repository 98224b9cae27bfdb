"""The gRPC front end's ceiling: a raw grpc.aio server doing the least ``ModelInfer`` can.

It parses the request, takes the first 10 numbers of each row of the first raw input and answers
them as the output ``y``: the null model's call and answer, with no servicer logic, validation,
queue, thread, metric or device. On uvloop, as the service's grpc.aio server is (uvicorn's loop).

With ``--handoff`` each call's rows go to a worker thread and back (``handoff.HandOff``, as in
handoff_floor_app.py): the floor of a gRPC front end with device worker threads.

    python benchmarks/raw_grpc_app.py PORT [--handoff]
"""

from __future__ import annotations

import sys

import grpc
import numpy as np
import tritonclient.grpc
import uvloop
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as rpc

from handoff import HandOff  # benchmarks/ is this script's folder, first on sys.path


class Raw(rpc.GRPCInferenceServiceServicer):
    def __init__(self, handoff: bool) -> None:
        self.first_ten = HandOff(lambda rows: rows[:, :10]) if handoff else None

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=True)

    async def ModelInfer(self, request, context):
        shape = tuple(request.inputs[0].shape)
        rows = np.frombuffer(request.raw_input_contents[0], np.float32).reshape(shape)
        y = rows[:, :10] if self.first_ten is None else await self.first_ten(rows)
        return pb.ModelInferResponse(
            model_name=request.model_name,
            outputs=[pb.ModelInferResponse.InferOutputTensor(name="y", datatype="FP32", shape=y.shape)],
            raw_output_contents=[y.tobytes()])


def is_ready(server) -> bool:
    """Whether the app started as ``server`` (a ``bench_service.Server``) answers ServerReady:
    that Server's ``ready`` probe."""
    return tritonclient.grpc.InferenceServerClient(f"127.0.0.1:{server.port}").is_server_ready()


async def serve(port: int, handoff: bool) -> None:
    server = grpc.aio.server()
    rpc.add_GRPCInferenceServiceServicer_to_server(Raw(handoff), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), "--handoff" in sys.argv[2:]))
