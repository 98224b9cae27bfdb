"""The Open Inference Protocol (KServe v2) over REST, with Triton's binary tensor extension.

A thin adapter: parse the request into numpy arrays, call ``Gateway.infer``,
render the result. A ``ServiceError`` raised here or below is answered by
``responses.refusal``: ``{"error": "..."}`` with the status and headers of
``errors.OUTCOMES``.

Request compression (Triton): a gzip or deflate ``Content-Encoding`` is inflated,
up to the body limit. Answers are not compressed.

Binary tensor data (Triton): the body is a JSON header of
``Inference-Header-Content-Length`` bytes, then each binary input's raw bytes, in
input order, each input saying its ``binary_data_size``. An output asked for with
``binary_data`` (or every output, with ``binary_data_output``) comes back the same
way.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..protocol import wire
from ..protocol.errors import InvalidInput, TooLarge, UnsupportedMediaType
from ..protocol.gateway import Gateway
from ..protocol.request import InferRequest, ModelInfo, Result, VersionInfo, model_parameters
from ..protocol.wire import prefix
from .responses import JSON, render_json
from .routes import Call, InferRoute

HEADER_LENGTH = "inference-header-content-length"
TAG = "Open Inference Protocol (v2)"  # the routes' heading in the documentation
MAX_ID = 256


class RequestInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] = Field(default_factory=dict)
    data: Any = None


class RequestOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    parameters: dict[str, Any] = Field(default_factory=dict)


class InferenceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    inputs: list[RequestInput]
    outputs: list[RequestOutput] | None = None


class ErrorBody(BaseModel):
    error: str


def decompressed(body: bytes, encoding: str | None, limit: int) -> bytes:
    """The body as sent before ``Content-Encoding`` (tritonclient's request_compression_algorithm),
    refused past ``limit`` bytes without inflating more than that."""
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise InvalidInput(f"Content-Encoding {prefix(encoding)} is not supported; send gzip, deflate or none")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        plain = inflater.decompress(body, limit + 1)
    except zlib.error:
        raise InvalidInput(f"the body is not valid {encoding} data (Content-Encoding: {encoding})") from None
    if len(plain) > limit or inflater.unconsumed_tail:
        raise TooLarge(f"request body over the limit of {limit} bytes once decompressed; send less")
    if not inflater.eof:
        raise InvalidInput(f"the {encoding} body ends early (Content-Encoding: {encoding})")
    return plain


def parse(body: bytes, header_length: str | None,
          expected: Mapping[str, str] = MappingProxyType({})) -> tuple[InferenceRequest, dict[str, np.ndarray]]:
    """The request and its input arrays, from a JSON body or a JSON header plus binary data;
    ``expected``: the model's datatype of each input."""
    if header_length is None:
        header, rest = body, b""
    else:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise InvalidInput(f"Inference-Header-Content-Length {prefix(header_length)} is not a byte count "
                               f"within the {len(body)}-byte body")
        header, rest = body[:int(header_length)], memoryview(body)[int(header_length):]
    try:
        request = InferenceRequest.model_validate_json(header)
    except ValidationError as exc:
        # loc holds the client's keys (an unknown field's name): each cut to a prefix, as every echo is.
        problems = "; ".join(f"{'.'.join(str(p)[:40] for p in e['loc']) or 'body'}: {e['msg']}"
                             for e in exc.errors(include_input=False)[:3])
        raise InvalidInput(f"not an inference request ({problems}); send {{\"inputs\": [{{\"name\", \"shape\", "
                           f"\"datatype\", \"data\"}}]}} as JSON (the Open Inference Protocol)") from None
    if request.id is not None and len(request.id) > MAX_ID:
        raise InvalidInput(f"id of {len(request.id)} characters; send at most {MAX_ID}")
    arrays, offset = {}, 0
    for item in request.inputs:
        wire.check_input(arrays, item.name, item.datatype, expected)
        shape = tuple(item.shape)
        size = item.parameters.get("binary_data_size")
        if size is not None:
            if type(size) is not int or size < 0 or offset + size > len(rest):
                raise InvalidInput(f"input {prefix(item.name)}: binary_data_size {prefix(size)} does not fit the "
                                   f"{len(rest) - offset} bytes left after the JSON header")
            arrays[item.name] = wire.from_binary(rest[offset:offset + size], item.datatype, item.name, shape)
            offset += size
        elif item.data is None:
            raise InvalidInput(f"input {prefix(item.name)} has no data; send \"data\" or binary_data_size")
        else:
            arrays[item.name] = wire.from_json(item.data, item.datatype, item.name, shape)
    if offset != len(rest):
        raise InvalidInput(f"{len(rest) - offset} bytes after the binary inputs; the binary_data_size values "
                           f"add up to {offset}")
    return request, arrays


def render(result: Result, request: InferenceRequest) -> Response:
    everything = bool(request.parameters.get("binary_data_output", False))
    asked = {o.name: o.parameters for o in request.outputs or []}
    outputs, blobs = [], []
    for name, array in result.outputs.items():
        described = {"name": name, "datatype": result.datatypes[name], "shape": list(array.shape)}
        binary, text = asked.get(name, {}).get("binary_data", everything), None
        if array.dtype == object and not binary:  # BYTES: strings in JSON
            try:
                text = wire.bytes_to_json(array)
            except ValueError:  # bytes that are not text go as binary data, which JSON cannot carry
                binary = True
        if binary:
            blob = wire.to_binary(array)
            described["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            described["data"] = text if text is not None else array.ravel().tolist()
        outputs.append(described)
    body = {"model_name": result.model, "model_version": str(result.version), "outputs": outputs}
    if request.id is not None:
        body["id"] = request.id
    header = render_json(body)
    if not blobs:
        return Response(header, media_type="application/json")
    return Response(b"".join([header, *blobs]), media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(len(header))})


#: Triton's binary tensor extension: a JSON header (Inference-Header-Content-Length bytes), then the tensors.
BINARY_TYPE = "application/octet-stream"


def check_content_type(content_type: str | None) -> None:
    """``UnsupportedMediaType`` for a Content-Type an infer body cannot have (a form, text/plain); none
    at all reads as JSON or binary, as tritonclient sends it."""
    if content_type is None or wire.is_json(content_type) or \
            wire.media_type(content_type) == BINARY_TYPE:
        return
    raise UnsupportedMediaType(
        f"an infer body is JSON, or Triton's binary tensor format: send the header Content-Type: "
        f"application/json, or Content-Type: {BINARY_TYPE} with Inference-Header-Content-Length: "
        f"<bytes of the JSON header> before the binary tensor data; got {wire.sent_type(content_type)}")


async def infer(gateway: Gateway, call: Call) -> Response:
    """``POST /v2/models/{name}[/versions/{version}]/infer``: parse, ``Gateway.infer``, render."""
    name, version = call.params["name"], call.params.get("version")
    encoding, length, kind = call.headers((b"content-encoding", _HEADER_LENGTH, b"content-type"))
    parsed: InferenceRequest | None = None

    def identify():
        check_content_type(kind)
        return name, version

    def read(model: ModelInfo, chosen: VersionInfo) -> InferRequest:
        nonlocal parsed
        body = decompressed(call.body, encoding, gateway.settings.max_body_bytes)
        parsed, arrays = parse(body, length, {s.name: s.datatype for s in chosen.inputs})
        outputs = [o.name for o in parsed.outputs] if parsed.outputs else None
        found = InferRequest(name, version, arrays, outputs, call.arrived, len(body))
        if parsed.parameters:  # Triton's "timeout" (microseconds) and "priority", the model's: the gateway checks
            sent = parsed.parameters
            found.timeout, found.priority = sent.get("timeout"), sent.get("priority")
            found.parameters = model_parameters(sent)
        return found

    result = await gateway.infer(identify, read, name)
    return render(result, parsed)


_HEADER_LENGTH = HEADER_LENGTH.encode()  # as ASGI scopes name headers: lower-case bytes
_FAILED = {"model": ErrorBody}
_ABOUT = ('inference: a JSON body {"inputs": [{"name", "shape", "datatype", "data"}, ...]}, or a JSON '
          "header then binary tensors (Triton's binary tensor extension)")
#: The inference routes (the app's table, with /predict's).
INFER_ROUTES = tuple(
    InferRoute(path, infer, summary="Inference" + suffix, about=about, tags=[TAG], responses={
        code: _FAILED for code in (400, 404, 413, 415, 500, 503, 504)}, openapi_extra={"requestBody": {
            "content": {"application/json": {"schema": InferenceRequest.model_json_schema()}}}})
    for path, suffix, about in (
        ("/v2/models/{name}/infer", "", _ABOUT),
        ("/v2/models/{name}/versions/{version}/infer", " (a version)",
         "inference by one version of the model, as /v2/models/{name}/infer")))


def router() -> APIRouter:
    """Every /v2 route but inference (``INFER_ROUTES``): each a few lines over the gateway."""
    api = APIRouter(prefix="/v2", tags=[TAG])
    _add_server_routes(api)
    _add_model_routes(api)
    _add_repository_routes(api)
    return api


def _gateway(request: Request) -> Gateway:
    return request.app.state.gateway


def _add_server_routes(api: APIRouter) -> None:
    @api.get("", summary="Server metadata")
    async def server_metadata() -> JSON:
        return JSON(Gateway.server_metadata())

    @api.get("/health/live", summary="Server liveness")
    async def live() -> JSON:
        return JSON({"live": True})

    @api.get("/health/ready", summary="Server readiness", responses={503: _FAILED})
    async def ready(request: Request) -> JSON:
        ok = await _gateway(request).ready()
        return JSON({"ready": ok}, 200 if ok else 503)


async def metadata(request: Request, name: str, version: str | None = None) -> JSON:
    return JSON(_gateway(request).model_metadata(name, version))


async def model_ready(request: Request, name: str, version: str | None = None) -> JSON:
    model, chosen, ok = await _gateway(request).model_ready(name, version)
    return JSON({"name": model.name, "version": str(chosen.number), "ready": ok}, 200 if ok else 503)


async def model_config(request: Request, name: str, version: str | None = None) -> JSON:
    return JSON(_gateway(request).model_config(name, version))


async def statistics(request: Request, name: str, version: str | None = None) -> JSON:
    return JSON({"model_stats": await _gateway(request).statistics(name, version)})


def _add_model_routes(api: APIRouter) -> None:
    """A model's (or one version's) metadata, readiness, config and statistics; every model's statistics."""

    # Before /models/{name}, which would take "stats" for a model name: Triton's statistics of every
    # model (what tritonclient's get_inference_statistics() asks for when no model is named).
    @api.get("/models/stats", summary="Statistics of every model")
    async def every_statistics(request: Request) -> JSON:
        return JSON({"model_stats": await _gateway(request).statistics()})

    for path, suffix in (("/models/{name}", ""), ("/models/{name}/versions/{version}", " (a version)")):
        for tail, route, summary, codes in (("", metadata, "Model metadata", (404,)),
                                            ("/ready", model_ready, "Model readiness", (404, 503)),
                                            ("/config", model_config, "Model config", (404,)),
                                            ("/stats", statistics, "Statistics", (404,))):
            api.add_api_route(path + tail, route, methods=["GET"], summary=summary + suffix,
                              responses={code: _FAILED for code in codes})


def _add_repository_routes(api: APIRouter) -> None:
    """Triton's repository extension: the index, and model control's load and unload."""

    @api.post("/repository/index", summary="Repository index")
    async def repository_index(request: Request) -> JSON:
        body = await _control_body(request)
        return JSON(await _gateway(request).repository_index(ready_only=body.get("ready") is True))

    @api.post("/repository/models/{name}/load", summary="Load a model (--model-control-mode explicit)",
              responses={400: _FAILED, 404: _FAILED})
    async def load(request: Request, name: str) -> JSON:
        body = await _control_body(request)
        await _gateway(request).load_model(name, body.get("parameters"))
        return JSON({})

    @api.post("/repository/models/{name}/unload", summary="Unload a model (--model-control-mode explicit)",
              responses={400: _FAILED, 404: _FAILED})
    async def unload(request: Request, name: str) -> JSON:
        body = await _control_body(request)
        await _gateway(request).unload_model(name, body.get("parameters"))
        return JSON({})


async def _control_body(request: Request) -> dict[str, Any]:
    """A repository request's JSON body ({} when empty): ``{"parameters": {...}}``, or the index's
    ``{"ready": true}``."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("parameters", {}), dict):
        raise InvalidInput(f"the body {prefix(raw[:40])} is not a repository request; send JSON "
                           '{"parameters": {...}} or nothing')
    return body
