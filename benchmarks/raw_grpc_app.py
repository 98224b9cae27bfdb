"""The gRPC front end's ceiling: a raw grpc.aio server doing the least ``ModelInfer`` can.

It parses the request, takes the first 10 numbers of each row of the first raw input and answers
them as the output ``y``: the null model's call and answer, with no servicer logic, validation,
queue, thread, metric or device. On uvloop, as the service's grpc.aio server is (uvicorn's loop).

With ``--handoff`` each call's rows go to a worker thread and back, with batched wake-ups, as in
handoff_floor_app.py: the floor of a gRPC front end with device worker threads.

    python benchmarks/raw_grpc_app.py PORT [--handoff]
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import deque

import grpc
import numpy as np
import tritonclient.grpc
import uvloop
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as rpc


class Raw(rpc.GRPCInferenceServiceServicer):
    def __init__(self, handoff: bool) -> None:
        self.handoff = handoff
        if handoff:
            self.jobs: deque = deque()
            self.ready = threading.Condition()
            threading.Thread(target=self._worker, daemon=True).start()

    def _worker(self) -> None:
        """Takes every queued call (a batch), answers each, and wakes the loop once per batch."""
        while True:
            with self.ready:
                while not self.jobs:
                    self.ready.wait()
                batch = list(self.jobs)
                self.jobs.clear()
            done = [(future, rows[:, :10]) for loop, future, rows in batch]
            batch[0][0].call_soon_threadsafe(_settle, done)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=True)

    async def ModelInfer(self, request, context):
        shape = tuple(request.inputs[0].shape)
        rows = np.frombuffer(request.raw_input_contents[0], np.float32).reshape(shape)
        if self.handoff:
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            with self.ready:
                self.jobs.append((loop, future, rows))
                self.ready.notify()
            y = await future
        else:
            y = rows[:, :10]
        return pb.ModelInferResponse(
            model_name=request.model_name,
            outputs=[pb.ModelInferResponse.InferOutputTensor(name="y", datatype="FP32", shape=y.shape)],
            raw_output_contents=[y.tobytes()])


def is_ready(server) -> bool:
    """Whether the app started as ``server`` (a ``bench_service.Server``) answers ServerReady:
    that Server's ``ready`` probe."""
    return tritonclient.grpc.InferenceServerClient(f"127.0.0.1:{server.port}").is_server_ready()


def _settle(done: list) -> None:
    for future, value in done:
        if not future.done():
            future.set_result(value)


async def serve(port: int, handoff: bool) -> None:
    server = grpc.aio.server()
    rpc.add_GRPCInferenceServiceServicer_to_server(Raw(handoff), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), "--handoff" in sys.argv[2:]))
