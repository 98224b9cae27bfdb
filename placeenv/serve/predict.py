"""``POST /predict``: the simple JSON API, a list of examples in and one ``{output: value}`` per
example out, over the same ``Gateway`` as the Open Inference Protocol (v2.py)."""

from __future__ import annotations

from typing import Any

from fastapi import Response
from pydantic import BaseModel, ConfigDict, Field

from . import wire
from .errors import InvalidInput, ServiceError
from .fastjson import FastJSONResponse
from .gateway import Gateway
from .request import Catalog, InferRequest, ModelInfo, Result, TensorSpec
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


async def predict(gateway: Gateway, call: Call) -> Response | None:
    """The route: parse, ``Gateway.infer``, one output dict per example. None for a body FastAPI
    reads itself (not sent as JSON: its 415; not a predict request: its 422, in its words; JSON
    pydantic-core does not read: ``json.loads``, then here again with ``call.parsed``)."""
    body = call.parsed
    if body is None:
        if not wire.is_json(call.header(b"content-type")):
            return None
        try:
            body = PredictRequest.model_validate_json(call.body)
        except ValueError:  # pydantic's ValidationError, or JSON pydantic-core does not read
            return None
    try:
        target = gateway.catalog.resolve(body.model, body.version)
        inputs = predict_inputs(gateway.catalog, target, body)
    except ServiceError as exc:
        gateway.refused(body.model, exc)  # infer counts its own refusals
        raise
    result = await gateway.infer(InferRequest(body.model, body.version, inputs, None, call.arrived,
                                              len(call.body), target))
    # Built here to PredictResponse's shape (the route's documentation): FastAPI's re-validation
    # of every output would be a measurable share of a small request.
    return FastJSONResponse({
        "model": result.model, "version": result.version, "outputs": per_example(result),
        "device": result.device, "worker": result.worker, "batch_size": result.batch_size,
        "timings": result.timings,
    })


ROUTE = InferRoute(
    "/predict", predict, body=PredictRequest, response_model=PredictResponse, summary="Predict",
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


def predict_inputs(catalog: Catalog, target, body: PredictRequest) -> dict:
    """``/predict``'s examples as the model's input arrays: a list for a one-input model, else by name."""
    entry, version = target
    specs = version.inputs
    if isinstance(body.inputs, list):
        if len(specs) != 1:
            raise InvalidInput(f"model {entry.name!r} takes {len(specs)} inputs; send inputs as "
                               f"{{{', '.join(repr(s.name) + ': [examples]' for s in specs)}}}")
        given = {specs[0].name: body.inputs}
    else:
        given = body.inputs
        catalog.check_names(entry, version, given)
    arrays = {}
    for spec in specs:
        examples = given.get(spec.name)
        if examples is None:
            continue  # Catalog.check names what is missing
        unlisted = not_a_list_of_examples(entry, spec, examples, isinstance(body.inputs, dict))
        if unlisted is not None:
            raise unlisted
        catalog.check_examples(len(examples), spec.name)  # before reading them
        if entry.max_batch_size:
            arrays[spec.name] = wire.from_json(examples, spec.datatype, spec.name)
        elif len(examples) != 1:
            raise InvalidInput(f"model {entry.name!r} does not batch: send one example")
        else:  # no batch dimension: the one example is the tensor
            arrays[spec.name] = wire.from_json(examples, spec.datatype, spec.name)[0]
    return arrays


def not_a_list_of_examples(entry: ModelInfo, spec: TensorSpec, examples: list, named: bool) -> InvalidInput | None:
    """The 400 for numbers nested too shallow to be a list of examples, decided from the model's
    example shape: most often one example sent without the list around it (64 numbers, where digits
    takes [[64 numbers]], and where the batch limit would otherwise be the complaint). None otherwise:
    deeper data, or not numbers, is ``wire.from_json``'s to check."""
    example = list(spec.shape[1:] if entry.max_batch_size else spec.shape)  # unbatched: one in a list
    lengths, leaf = wire.outline(examples)
    if len(lengths) > len(example) or isinstance(leaf, bool) or not isinstance(leaf, (int, float)):
        return None
    subject = f'input "{spec.name}"' if named else '"inputs"'
    inputs = f'{{"{spec.name}": [[{numbers(example)}]]}}' if named else f"[[{numbers(example)}]]"
    fix = f'e.g. {{"model": "{entry.name}", "inputs": {inputs}}}'
    if len(lengths) == len(example) and all(want in (-1, got) for want, got in zip(example, lengths)):
        return InvalidInput(f"{subject} looks like one example ({numbers(lengths).strip('.')}), "
                            f"not a list of examples: wrap it in a list, {fix}")
    return InvalidInput(f"{subject} holds {numbers(lengths).strip('.')}, not a list of examples: model "
                        f"{entry.name!r} takes a list of examples of shape {example} each, {fix}")


def numbers(shape: list[int]) -> str:
    """How a message writes the numbers of one example of ``shape`` (for [64], "...64 numbers...")."""
    if len(shape) == 1:
        return f"...{shape[0]} numbers..." if shape[0] >= 0 else "...numbers..."
    return f"...numbers of shape {shape}..."


def per_example(result: Result) -> list[dict[str, Any]]:
    """``[{output: value}]`` per example; ``tolist`` makes Python numbers in one C call per output."""
    columns = {name: array.tolist() for name, array in result.outputs.items()}
    if not result.batched:
        return [columns]
    rows = len(next(iter(columns.values())))
    return [{name: column[i] for name, column in columns.items()} for i in range(rows)]
