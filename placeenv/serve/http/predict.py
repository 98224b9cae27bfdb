"""``POST /predict``: the simple JSON API, a list of examples in and one ``{output: value}`` per
example out, over the same ``Gateway`` as the Open Inference Protocol (v2.py)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from fastapi import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..protocol import wire
from ..protocol.errors import InvalidInput, Unprocessable, UnsupportedMediaType
from ..protocol.gateway import Gateway
from ..protocol.request import InferRequest, ModelInfo, Result, TensorSpec, VersionInfo
from .responses import JSON, validation_detail
from .routes import Call, InferRoute


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="a name from GET /v1/models", examples=["digits"])
    version: int | None = Field(None, description="a version of the model; default: its highest")
    inputs: list[Any] | dict[str, list[Any]] = Field(
        description="a list of examples for a model with one input (digits: 64 numbers in [0, 16] each); "
        "{input name: list of examples} for a model with several",
        examples=[[[0, 0, 5, 13, 9, 1, 0, 0] * 8]],
    )


class PredictResponse(BaseModel):
    model: str
    version: int
    outputs: list[dict[str, Any]] = Field(description="per example, {output name: value}")
    device: str = Field(description="the device of the worker that served the request")
    worker: str
    batch_size: int = Field(description="examples in the forward pass this request shared")
    timings: dict[str, float] = Field(description="milliseconds: preprocess, queue, compute, total")


class Error(BaseModel):
    """An error answer outside /v2 (the Open Inference Protocol's is v2.ErrorBody)."""

    detail: str


class InvalidRequest(BaseModel):
    """422: the service's own message, or FastAPI's list of schema errors for a malformed body."""

    detail: str | list[dict[str, Any]]


async def predict(gateway: Gateway, call: Call) -> Response:
    """The adapter: read the body, ``Gateway.infer``, one output dict per example."""
    body: PredictRequest | None = None

    def identify():
        nonlocal body
        body = read_body(call)
        return body.model, body.version

    def read(model: ModelInfo, version: VersionInfo) -> InferRequest:
        return InferRequest(body.model, body.version, predict_inputs(model, version, body), None,
                            call.arrived, len(call.body))

    result = await gateway.infer(identify, read)
    # Built here to PredictResponse's shape (the route's documentation): FastAPI's re-validation
    # of every output would be a measurable share of a small request.
    return JSON({
        "model": result.model, "version": result.version, "outputs": per_example(result),
        "device": result.device, "worker": result.worker, "batch_size": result.batch_size,
        "timings": result.timings,
    })


def read_body(call: Call) -> PredictRequest:
    """The body as a ``PredictRequest``, read as FastAPI reads a JSON body: 415 without a JSON
    Content-Type (FastAPI's strict content type), 422 with FastAPI's list of problems for a body that
    is not a predict request."""
    sent = call.header(b"content-type")
    if not wire.is_json(sent):
        got = wire.sent_type(None if sent is None else sent.decode("latin-1"))
        raise UnsupportedMediaType(f"/predict reads a JSON body: send the header Content-Type: application/json; "
                                   f"got {got}")
    try:
        return PredictRequest.model_validate_json(call.body)  # pydantic-core's parser: the common case
    except ValueError:  # not a predict request, or JSON pydantic-core does not read (UTF-16, a lone surrogate)
        pass
    if not call.body:
        raise Unprocessable(validation_detail([{"type": "missing", "loc": ["body"], "msg": "Field required",
                                                "input": None}]))
    try:
        data = json.loads(call.body)  # FastAPI's parser, for its problems in its words
    except json.JSONDecodeError as exc:
        raise Unprocessable(validation_detail([{"type": "json_invalid", "loc": ["body", exc.pos],
                                                "msg": "JSON decode error", "input": {},
                                                "ctx": {"error": exc.msg}}])) from None
    except (ValueError, RecursionError):  # bytes in no JSON encoding, or nested past the parser's depth
        raise InvalidInput("There was an error parsing the body: send JSON text (UTF-8)") from None
    try:
        return PredictRequest.model_validate(data)
    except ValidationError as exc:
        problems = exc.errors(include_url=False)
        raise Unprocessable(validation_detail([{**e, "loc": ["body", *e["loc"]]} for e in problems])) from None


ROUTE = InferRoute(
    "/predict", predict, body=PredictRequest, response_model=PredictResponse, summary="Predict",
    about='the simple JSON API: a JSON body {"model": "digits", "inputs": [[...64 numbers...], ...]}',
    responses={
        400: {"model": Error, "description": "inputs the model does not take, or a body not readable as JSON"},
        404: {"model": Error, "description": "unknown model or version"},
        413: {"model": Error, "description": "body over the limit"},
        415: {"model": Error, "description": "a body not sent as Content-Type: application/json"},
        422: {"model": InvalidRequest, "description": "a body that is not a predict request"},
        500: {"model": Error, "description": "the model failed on this request"},
        503: {"model": Error, "description": "overloaded, shutting down or model not ready; see Retry-After"},
        504: {"model": Error, "description": "not answered within the request timeout"},
    })


def predict_inputs(model: ModelInfo, version: VersionInfo, body: PredictRequest) -> dict:
    """``/predict``'s examples as the model's input arrays: a list for a one-input model, else by name."""
    specs = version.inputs
    if isinstance(body.inputs, list):
        if len(specs) != 1:
            raise InvalidInput(f"model {model.name!r} takes {len(specs)} inputs; send inputs as "
                               f"{{{', '.join(repr(s.name) + ': [examples]' for s in specs)}}}")
        given, arrays = {specs[0].name: body.inputs}, {}
    else:
        given = body.inputs
        # A name the model does not take stays, unread (None): Catalog.check refuses it, naming the inputs.
        arrays = {name: None for name in given if all(spec.name != name for spec in specs)}
    for spec in specs:
        examples = given.get(spec.name)
        if examples is None:
            continue  # Catalog.check names what is missing
        unlisted = not_a_list_of_examples(model, spec, examples, isinstance(body.inputs, dict))
        if unlisted is not None:
            raise unlisted
        if model.max_batch_size:
            arrays[spec.name] = wire.from_json(examples, spec.datatype, spec.name)
        elif len(examples) != 1:
            raise InvalidInput(f"model {model.name!r} does not batch: send one example")
        else:  # no batch dimension: the one example is the tensor
            arrays[spec.name] = wire.from_json(examples, spec.datatype, spec.name)[0]
    return arrays


def not_a_list_of_examples(model: ModelInfo, spec: TensorSpec, examples: list, named: bool) -> InvalidInput | None:
    """The 400 for numbers nested too shallow to be a list of examples, decided from the model's
    example shape: most often one example sent without the list around it (64 numbers, where digits
    takes [[64 numbers]], and where the batch limit would otherwise be the complaint). None otherwise:
    deeper data, or not numbers, is ``wire.from_json``'s to check."""
    example = list(spec.shape[1:] if model.max_batch_size else spec.shape)  # unbatched: one in a list
    if examples == []:
        return InvalidInput(f"input {spec.name!r} has no examples: send at least one")
    lengths, leaf = wire.outline(examples)
    if len(lengths) > len(example) or isinstance(leaf, bool) or not isinstance(leaf, (int, float)):
        return None
    subject = f'input "{spec.name}"' if named else '"inputs"'
    inputs = f'{{"{spec.name}": [[{numbers(example)}]]}}' if named else f"[[{numbers(example)}]]"
    fix = f'e.g. {{"model": "{model.name}", "inputs": {inputs}}}'
    if len(lengths) == len(example) and all(want in (-1, got) for want, got in zip(example, lengths)):
        return InvalidInput(f"{subject} looks like one example ({numbers(lengths).strip('.')}), "
                            f"not a list of examples: wrap it in a list, {fix}")
    return InvalidInput(f"{subject} holds {numbers(lengths).strip('.')}, not a list of examples: model "
                        f"{model.name!r} takes a list of examples of shape {example} each, {fix}")


def numbers(shape: list[int]) -> str:
    """How a message writes the numbers of one example of ``shape`` (for [64], "...64 numbers...")."""
    if len(shape) == 1:
        return f"...{shape[0]} numbers..." if shape[0] >= 0 else "...numbers..."
    return f"...numbers of shape {shape}..."


def per_example(result: Result) -> list[dict[str, Any]]:
    """``[{output: value}]`` per example; ``tolist`` makes Python numbers in one C call per output."""
    columns = {name: _text(array).tolist() if array.dtype == object else array.tolist()
               for name, array in result.outputs.items()}
    if not result.batched:
        return [columns]
    rows = len(next(iter(columns.values())))
    return [{name: column[i] for name, column in columns.items()} for i in range(rows)]


def _text(array: np.ndarray) -> np.ndarray:
    """A BYTES output as JSON carries it: each element's text (bytes that are not UTF-8 with the
    replacement character; v2's binary data carries them exactly)."""
    return np.vectorize(lambda b: b.decode("utf-8", "replace") if isinstance(b, bytes) else b, otypes=[object])(array)
