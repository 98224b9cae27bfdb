"""The Open Inference Protocol (KServe v2) over REST, with Triton's binary tensor extension.

A thin adapter: parse the request into numpy arrays, call ``Gateway.infer``,
render the result. A ``ServiceError`` raised here or below is answered by
``routes.refusal``: ``{"error": "..."}`` with the status and headers of
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

import importlib.metadata
import zlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
import pydantic_core
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import wire
from .gateway import Gateway
from .request import InferRequest, Result
from .routes import Call, InferRoute
from .errors import InvalidInput, ServiceError, TooLarge, UnsupportedMediaType
from .wire import prefix

HEADER_LENGTH = "inference-header-content-length"
TAG = "Open Inference Protocol (v2)"  # the routes' heading in the documentation
VERSION = importlib.metadata.version("placeenv")
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


def json_response(body: Any, status: int = 200) -> Response:
    return Response(pydantic_core.to_json(body, inf_nan_mode="strings"), status_code=status,
                    media_type="application/json")


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
        if item.name in arrays:
            raise InvalidInput(f"input {prefix(item.name)} appears twice; send each input once")
        shape = tuple(item.shape)
        wire.check_datatype(item.datatype, item.name, expected.get(item.name))  # before the data's checks
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
        entry = {"name": name, "datatype": result.datatypes[name], "shape": list(array.shape)}
        if asked.get(name, {}).get("binary_data", everything):
            blob = wire.to_binary(array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = array.ravel().tolist()
        outputs.append(entry)
    body = {"model_name": result.model, "model_version": str(result.version), "outputs": outputs}
    if request.id is not None:
        body["id"] = request.id
    header = pydantic_core.to_json(body, inf_nan_mode="strings")
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
    try:
        check_content_type(kind)
        body = decompressed(call.body, encoding, gateway.settings.max_body_bytes)
        target = gateway.catalog.resolve(name, version)
        parsed, arrays = parse(body, length, {s.name: s.datatype for s in target[1].inputs})
    except ServiceError as exc:
        gateway.refused(name, exc)  # infer counts its own refusals
        raise
    outputs = [o.name for o in parsed.outputs] if parsed.outputs else None
    result = await gateway.infer(InferRequest(name, version, arrays, outputs, call.arrived, len(body), target))
    return render(result, parsed)


_HEADER_LENGTH = HEADER_LENGTH.encode()  # as ASGI scopes name headers: lower-case bytes
_FAILED = {"model": ErrorBody}
#: The inference routes (the app's table, with /predict's).
INFER_ROUTES = tuple(
    InferRoute(path, infer, summary="Inference" + suffix, tags=[TAG], responses={
        code: _FAILED for code in (400, 404, 413, 415, 500, 503, 504)}, openapi_extra={"requestBody": {
            "content": {"application/json": {"schema": InferenceRequest.model_json_schema()}}}})
    for path, suffix in (("/v2/models/{name}/infer", ""), ("/v2/models/{name}/versions/{version}/infer", " (a version)")))


def server_metadata() -> dict[str, Any]:
    return {"name": "placeenv", "version": VERSION, "extensions": ["binary_tensor_data", "model_repository", "statistics"]}


def model_metadata(model, chosen) -> dict[str, Any]:
    """A model version's metadata (``request.ModelInfo``, ``VersionInfo``), for HTTP and gRPC alike."""
    return {
        "name": model.name, "versions": [str(v) for v in sorted(model.versions)], "platform": chosen.platform,
        "inputs": [s.describe() for s in chosen.inputs], "outputs": [s.describe() for s in chosen.outputs],
    }


async def repository_rows(gateway: Gateway) -> list[dict[str, str]]:
    """The repository index: every served version, and every model that could not be loaded."""
    catalog, ready = gateway.catalog, await gateway.ready()
    rows = [{"name": m.name, "version": str(v), "state": "READY" if ready else "UNAVAILABLE"}
            for m in catalog.models.values() for v in sorted(m.versions)]
    rows += [{"name": name, "state": "UNAVAILABLE", "reason": why[:300]} for name, why in catalog.skipped.items()]
    return sorted(rows, key=lambda r: r["name"])


def router() -> APIRouter:
    """Every /v2 route but inference (``INFER_ROUTES``)."""
    api = APIRouter(prefix="/v2", tags=[TAG])
    failed = _FAILED

    def gateway_of(request: Request) -> Gateway:
        return request.app.state.gateway

    api.add_api_route("", server_metadata, methods=["GET"], summary="Server metadata")

    @api.get("/health/live", summary="Server liveness")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @api.get("/health/ready", summary="Server readiness", responses={503: failed})
    async def ready(request: Request) -> Response:
        ok = await gateway_of(request).ready()
        return json_response({"ready": ok}, 200 if ok else 503)

    def lookup(request: Request, name: str, version: str | None):
        gateway = gateway_of(request)
        return gateway, *gateway.catalog.resolve(name, version)

    async def metadata(request: Request, name: str, version: str | None = None) -> Response:
        _, model, chosen = lookup(request, name, version)
        return json_response(model_metadata(model, chosen))

    async def model_ready(request: Request, name: str, version: str | None = None) -> Response:
        gateway, model, chosen = lookup(request, name, version)
        ok = await gateway.model_ready(model.name)
        return json_response({"name": model.name, "version": str(chosen.number), "ready": ok}, 200 if ok else 503)

    async def model_config(request: Request, name: str, version: str | None = None) -> Response:
        _, entry, chosen = lookup(request, name, version)
        # The config file's fields first: the effective values below replace its unset (None) ones.
        return json_response({**entry.config,
                              "name": entry.name, "max_batch_size": entry.max_batch_size,
                              "max_batch_delay_ms": entry.max_batch_delay_ms,
                              "input": [s.describe() for s in chosen.inputs],
                              "output": [s.describe() for s in chosen.outputs]})

    async def statistics(request: Request, name: str, version: str | None = None) -> Response:
        gateway, model, chosen = lookup(request, name, version)
        found = await gateway.statistics(model.name, chosen.number if version is not None else None)
        return json_response({"model_stats": found})

    # Before /models/{name}, which would take "stats" for a model name: Triton's statistics of every
    # model (what tritonclient's get_inference_statistics() asks for when no model is named).
    @api.get("/models/stats", summary="Statistics of every model")
    async def every_statistics(request: Request) -> Response:
        return json_response({"model_stats": await gateway_of(request).statistics()})

    for path, suffix in (("/models/{name}", ""), ("/models/{name}/versions/{version}", " (a version)")):
        api.add_api_route(path, metadata, methods=["GET"], summary="Model metadata" + suffix,
                          responses={404: failed})
        api.add_api_route(path + "/ready", model_ready, methods=["GET"], summary="Model readiness" + suffix,
                          responses={404: failed, 503: failed})
        api.add_api_route(path + "/config", model_config, methods=["GET"], summary="Model config" + suffix,
                          responses={404: failed})
        api.add_api_route(path + "/stats", statistics, methods=["GET"], summary="Statistics" + suffix,
                          responses={404: failed})

    @api.post("/repository/index", summary="Repository index (read-only)")
    async def repository_index(request: Request) -> list[dict[str, str]]:
        return await repository_rows(gateway_of(request))

    return api

