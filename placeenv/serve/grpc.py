"""The Open Inference Protocol over gRPC, as Triton serves it beside HTTP.

``GRPCInferenceService`` (package ``inference``: KServe v2's service, of which Triton's
proto is a superset) on its own port (``PLACEENV_GRPC_PORT``), served by grpc.aio on the
event loop that serves HTTP, over the same ``Gateway``: one engine, one set of queues,
batching across both protocols, the same metrics and errors (``errors.OUTCOMES`` maps
each to a gRPC status code).

Served: ServerLive, ServerReady, ServerMetadata, ModelReady, ModelMetadata, ModelConfig
(Triton's ``ModelConfig``, protocol/triton.py), ModelStatistics, ModelInfer
(``raw_input_contents`` or typed ``contents``; outputs in ``raw_output_contents``),
RepositoryIndex, RepositoryModelLoad and RepositoryModelUnload (model control). The rest
(streaming, shared memory, traces) answer UNIMPLEMENTED. The message classes and the servicer base are tritonclient's generated
code (``tritonclient[grpc]``, the ``grpc`` extra).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from types import MappingProxyType

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as rpc

from .protocol import wire
from .protocol.gateway import Gateway
from .protocol.request import InferRequest, model_parameters
from .protocol.errors import InvalidInput, ServiceError, outcome
from .protocol.wire import prefix

#: The typed field of ``InferTensorContents`` that carries each datatype (FP16 has none: raw only).
CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "FP32": "fp32_contents", "FP64": "fp64_contents"}


def inputs_of(request: pb.ModelInferRequest,
              expected: Mapping[str, str] = MappingProxyType({})) -> dict[str, np.ndarray]:
    """The request's input arrays, from ``raw_input_contents`` (one per input, in order) or ``contents``;
    ``expected``: the model's datatype of each input (from ``Catalog.resolve``)."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; "
                           "send one per input, in the inputs' order")
    arrays = {}
    for i, item in enumerate(request.inputs):
        wire.check_input(arrays, item.name, item.datatype, expected)
        shape = tuple(item.shape)
        if raw:
            arrays[item.name] = wire.from_binary(raw[i], item.datatype, item.name, shape)
            continue
        if item.datatype == "BYTES":
            arrays[item.name] = wire.bytes_from_elements(list(item.contents.bytes_contents), item.name, shape)
            continue
        field = CONTENTS.get(item.datatype)
        values = getattr(item.contents, field) if field else ()
        if not values and math.prod(shape) != 0:
            where = f"contents.{field}" if field else "raw_input_contents (FP16 has no typed contents)"
            raise InvalidInput(f"input {prefix(item.name)} has no data; send {where}")
        arrays[item.name] = wire.from_json(list(values), item.datatype, item.name, shape)
    return arrays


def _parameters(parameters) -> dict:
    """A request's ``parameters`` map (``ModelRepositoryParameter``s) as plain values."""
    return {key: getattr(value, value.WhichOneof("parameter_choice") or "string_param")
            for key, value in parameters.items()}


#: A call's gRPC deadline is the request's, a little early (a share of what is left, at most a bound): the
#: client cancels the call when its deadline passes by its own clock, and the service reads the time left
#: from the call's header, which reaches it later than the client sent it, by more than a few milliseconds
#: on a loaded machine. An answer at the deadline itself would then come after the client's cancel, and the
#: call would count as a client that left; answered before either, it counts as that deadline's.
EARLY, EARLY_MAX_S = 0.05, 0.05


def parameter(parameters, key: str):
    """The value of a request's parameter (whichever of its typed fields is set), or None."""
    if key not in parameters:
        return None
    found = parameters[key]
    return getattr(found, found.WhichOneof("parameter_choice") or "int64_param")


class InferenceServicer(rpc.GRPCInferenceServiceServicer):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def _fail(self, context: grpc.aio.ServicerContext, error: ServiceError):
        await context.abort(grpc.StatusCode[outcome(error).grpc], str(error))

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=await self.gateway.ready())

    async def ServerMetadata(self, request, context):
        return json_format.ParseDict(Gateway.server_metadata(), pb.ServerMetadataResponse())

    async def ModelReady(self, request, context):
        try:
            _, _, ready = await self.gateway.model_ready(request.name, request.version or None)
        except ServiceError as exc:
            await self._fail(context, exc)
        return pb.ModelReadyResponse(ready=ready)

    async def ModelMetadata(self, request, context):
        try:
            found = self.gateway.model_metadata(request.name, request.version or None)
        except ServiceError as exc:
            await self._fail(context, exc)
        return json_format.ParseDict(found, pb.ModelMetadataResponse())

    async def ModelConfig(self, request, context):
        try:
            found = self.gateway.model_config(request.name, request.version or None)
        except ServiceError as exc:
            await self._fail(context, exc)
        return pb.ModelConfigResponse(config=json_format.ParseDict(found, model_config_pb2.ModelConfig()))

    async def ModelStatistics(self, request, context):
        try:  # no name: every model's, as Triton answers
            found = await self.gateway.statistics(request.name or None, request.version or None)
        except ServiceError as exc:
            await self._fail(context, exc)
        return json_format.ParseDict({"model_stats": found}, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

    async def RepositoryIndex(self, request, context):
        rows = await self.gateway.repository_index(ready_only=request.ready)
        return json_format.ParseDict({"models": rows}, pb.RepositoryIndexResponse())

    async def RepositoryModelLoad(self, request, context):
        try:
            if request.repository_name:
                raise InvalidInput("repository_name is not taken: a load reads the configured repositories")
            await self.gateway.load_model(request.model_name, _parameters(request.parameters))
        except ServiceError as exc:
            await self._fail(context, exc)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):
        try:
            await self.gateway.unload_model(request.model_name, _parameters(request.parameters))
        except ServiceError as exc:
            await self._fail(context, exc)
        return pb.RepositoryModelUnloadResponse()

    async def ModelInfer(self, request, context):
        arrived = time.perf_counter()
        name, version = request.model_name, request.model_version or None
        remaining = context.time_remaining()  # the call's deadline (tritonclient's client_timeout), or None

        def read(model, chosen) -> InferRequest:
            arrays = inputs_of(request, {s.name: s.datatype for s in chosen.inputs})
            # The message's size, typed contents included: what preprocessing inline or on a thread weighs.
            found = InferRequest(name, version, arrays, [o.name for o in request.outputs] or None, arrived,
                                 request.ByteSize())
            if remaining is not None:
                found.expires = arrived + remaining - min(remaining * EARLY, EARLY_MAX_S)
            if request.parameters:
                found.timeout, found.priority = (parameter(request.parameters, key) for key in ("timeout", "priority"))
                found.parameters = model_parameters(_parameters(request.parameters))
            return found

        try:
            result = await self.gateway.infer(lambda: (name, version), read, name)
        except ServiceError as exc:
            await self._fail(context, exc)
        response = pb.ModelInferResponse(model_name=result.model, model_version=str(result.version), id=request.id)
        for output, array in result.outputs.items():
            response.outputs.add(name=output, datatype=result.datatypes[output], shape=array.shape)
            response.raw_output_contents.append(wire.to_binary(array))
        return response


async def start(gateway: Gateway, settings, shared: bool = False) -> grpc.aio.Server:
    """A started grpc.aio server on ``settings.grpc_port``, on the running event loop; ``shared``: the
    port is shared with the other front ends (SO_REUSEPORT; the supervisor checked it was free)."""
    limit = settings.max_body_bytes + 64 * 1024  # the HTTP body limit, plus the message's own fields
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                      ("grpc.max_send_message_length", -1),
                                      # A taken port is an error, as for HTTP, not a port shared
                                      # with another process (gRPC's default SO_REUSEPORT), unless
                                      # the processes sharing it are our own front ends.
                                      ("grpc.so_reuseport", 1 if shared else 0)])
    rpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(gateway), server)
    server.add_insecure_port(f"{settings.host}:{settings.grpc_port}")
    await server.start()
    return server
