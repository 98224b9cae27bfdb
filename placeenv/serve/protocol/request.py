"""One request for every protocol, and what a front end knows of the models: no Paddle, no HTTP.

Every adapter (``/predict``, v2 REST JSON and binary, v2 gRPC) reads its request into
one ``InferRequest`` through its ``Gateway`` (gateway.py). The gateway checks it
against the ``Catalog`` (the served models' names, versions, tensor specs and
batching) into a ``Work``, then the engine runs it: in this process (``--frontends 0``)
or across a link to the engine process. The answer is a ``Result``, or a ``ServiceError``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import msgspec
import numpy as np

from .errors import InvalidInput, NotReady, UnknownModel
from .wire import DATATYPES, datatype_of, prefix

__all__ = ["NO_PARAMETERS", "PRIORITIES", "RESERVED", "Catalog", "InferRequest", "ModelInfo", "Result", "TensorSpec",
           "VersionInfo", "Work", "check_parameters", "terms"]


class InputError(ValueError):
    """A request's inputs are invalid; the message names the tensor and what was expected."""


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output: its name, protocol datatype and shape (-1 for a dynamic dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    @property
    def dtype(self) -> np.dtype:
        return DATATYPES[self.datatype]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    def check(self, array: np.ndarray) -> None:
        """``InputError`` unless ``array`` has this datatype and a shape this spec allows."""
        if array.dtype != self.dtype:
            try:
                sent = datatype_of(array.dtype)
            except ValueError:
                sent = array.dtype
            raise InputError(f"input {self.name!r} has datatype {sent}; expected {self.datatype}")
        self.check_shape(array.shape)

    def check_shape(self, shape) -> None:
        """``InputError`` unless this spec allows ``shape`` (an array's, or a tensor's)."""
        if len(shape) != len(self.shape) or any(want not in (-1, got) for want, got in zip(self.shape, shape)):
            raise InputError(f"input {self.name!r} has shape {list(shape)}; expected {list(self.shape)} "
                             "(-1: any size)")


@dataclasses.dataclass(slots=True)
class InferRequest:
    """A request as every protocol gives it: what the client sent, and when it arrived (timed once)."""

    model: Any  # the client's model name (a str, unless a JSON body sent something else)
    version: str | int | None  # None: the default (highest) version
    inputs: Mapping[str, np.ndarray]
    outputs: list[str] | None = None  # None: every output, in the model's order
    arrived: float = 0.0  # time.perf_counter() when the adapter received it (a system-wide clock)
    size: int = 0  # bytes of the request body: a small one is preprocessed without a thread hand-off
    # The request's own terms, as the client sent them (the gateway checks them; None: not sent):
    timeout: Any = None  # its parameters' "timeout": microseconds, Triton's; 0: the service's limit alone
    priority: Any = None  # its parameters' "priority": 1 high, 0 the default
    expires: float | None = None  # the transport's own deadline (gRPC's), as time.perf_counter() reads it
    # Its parameters for the model (``RESERVED`` left out), unchecked; None: none sent.
    parameters: Any = None


class Work(msgspec.Struct, array_like=True):
    """A checked request, as the engine takes it; its arrays travel beside it (link.py)."""

    model: str
    version: int
    examples: int  # rows; 1 for a model that does not batch
    outputs: list[str]  # the outputs to answer, in order
    arrived: float
    deadline: float  # time.perf_counter() past which it is answered 504 (the gateway's one deadline)
    inline: bool  # small enough to preprocess on the engine's event loop thread
    # Last, with defaults: a Work from an older peer of the link still reads.
    priority: int = 0  # 1: taken before every normal job queued on its device (PRIORITIES)
    own_deadline: bool = False  # the deadline is the client's (its timeout or gRPC deadline), not the service's
    # The request's parameters for its model (``check_parameters``); None when it sent none, so a request
    # without them costs no dict here, on the link or in its job.
    parameters: dict[str, bool | int | float | str] | None = None


#: The priority levels a request may ask for, as Triton's two: 0 (or none) the default, 1 high.
PRIORITIES = (0, 1)


#: Request parameters the service reads itself, or that Triton reserves (tritonclient's
#: ``TRITON_RESERVED_REQUEST_PARAMS``, and every name starting ``triton_``): never handed to a model.
RESERVED = frozenset({"timeout", "priority", "sequence_id", "sequence_start", "sequence_end", "headers",
                      "binary_data_output"})
RESERVED_PREFIX = "triton_"

#: The bounds of a request's parameters: they ride with its every job, step and call, and key its batches.
MAX_PARAMETERS, MAX_KEY, MAX_TEXT = 32, 64, 256
INT64 = (-(1 << 63), (1 << 63) - 1)

#: What ``Model.request_parameters`` reads for a request that sent none (one shared, read-only mapping).
NO_PARAMETERS: Mapping[str, Any] = MappingProxyType({})


def model_parameters(sent: Mapping[str, Any]) -> dict[str, Any] | None:
    """The parameters of ``sent`` (a request's, as its protocol gave them) that go to the model: all but
    ``RESERVED``; None when none is left."""
    found = {key: value for key, value in sent.items()
             if key not in RESERVED and not (isinstance(key, str) and key.startswith(RESERVED_PREFIX))}
    return found or None


def check_parameters(parameters: Any) -> dict[str, bool | int | float | str] | None:
    """A request's parameters as a model gets them (None: none); ``InvalidInput`` naming the first key
    that is not what a parameter may be, and what to send."""
    if not parameters:
        return None
    if not isinstance(parameters, Mapping):
        raise InvalidInput(f"parameters {prefix(parameters)} is not a map; send an object of names to values")
    if len(parameters) > MAX_PARAMETERS:
        raise InvalidInput(f"{len(parameters)} parameters; send at most {MAX_PARAMETERS}")
    for key, value in parameters.items():
        if not isinstance(key, str) or not key or len(key) > MAX_KEY:
            raise InvalidInput(f"parameter name {prefix(key)} is not a name; send names of 1 to {MAX_KEY} "
                               "characters")
        kind = type(value)
        if kind is str:
            if len(value) > MAX_TEXT:
                raise InvalidInput(f"parameter {key!r} is a string of {len(value)} characters; send at most "
                                   f"{MAX_TEXT}")
        elif kind is int:
            if not INT64[0] <= value <= INT64[1]:
                raise InvalidInput(f"parameter {key!r} {prefix(value)} is past int64; send a smaller number")
        elif kind is float:
            if not math.isfinite(value):
                raise InvalidInput(f"parameter {key!r} is {value}; send a finite number")
        elif kind is not bool:
            raise InvalidInput(f"parameter {key!r} is {prefix(value)}; a parameter is a bool, a whole number, "
                               "a number or a string (Triton's InferParameter)")
    return dict(parameters)


def terms(request: InferRequest, limit: float) -> tuple[float, bool, int]:
    """A request's deadline, whether it is the client's, and its priority level: the shorter of its own
    deadline (its ``timeout``, its transport's) and ``limit`` (the service's); ``InvalidInput`` naming
    a parameter that is not what the protocol takes, and what to send."""
    deadline, own = limit, False
    timeout = request.timeout
    if timeout is not None:
        if type(timeout) is not int or timeout < 0:  # (bool is an int subclass: not a count)
            raise InvalidInput(f"parameter timeout {prefix(timeout)} is not a number of microseconds; send a "
                               "whole number >= 0 (0: the service's limit alone)")
        # Compared as microseconds: an int past a float's range (JSON has no bound) is simply longer.
        if timeout and timeout < (deadline - request.arrived) * 1e6:
            deadline, own = request.arrived + timeout / 1e6, True
    if request.expires is not None and request.expires < deadline:
        deadline, own = request.expires, True
    priority = request.priority
    if priority is None:
        return deadline, own, 0
    if type(priority) is not int or priority not in PRIORITIES:
        raise InvalidInput(f"parameter priority {prefix(priority)} is not a level; send 1 (high) or 0 "
                           "(the default), or leave it out")
    return deadline, own, priority


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """One answered request."""

    model: str
    version: int
    outputs: dict[str, np.ndarray]  # host arrays, in the model's output order (or the order asked for)
    datatypes: dict[str, str]  # each output's protocol datatype
    device: str  # the worker's device
    worker: str
    batch_size: int  # examples in the forward pass this request shared
    batched: bool  # the outputs' first dimension is the request's examples
    timings: dict[str, float]  # milliseconds: preprocess, queue, compute, total


class VersionInfo(msgspec.Struct, frozen=True):
    number: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # What runs it: "paddle_inference" (a Predictor), "paddle_jit", "paddle_python" (a model.py's own
    # forward), "ensemble" (a pipeline).
    platform: str


class ModelInfo(msgspec.Struct, frozen=True):
    """What the protocols say of a model: its versions' tensors, its batching and its config file."""

    name: str
    versions: dict[int, VersionInfo]
    max_batch_size: int
    max_batch_delay_ms: float
    description: str = ""
    config: dict[str, Any] = {}  # the config file's fields (inputs/outputs overrides left out)

    @property
    def default(self) -> VersionInfo:
        return self.versions[max(self.versions)]

    def describe(self) -> dict[str, Any]:
        version = self.default
        return {
            "name": self.name, "versions": [str(v) for v in sorted(self.versions)],
            "description": self.description, "max_batch_size": self.max_batch_size,
            "inputs": [s.describe() for s in version.inputs], "outputs": [s.describe() for s in version.outputs],
        }


class Catalog(msgspec.Struct):
    """The served models, those that failed to load (with why), and the devices: the engine's, as a
    front end needs them to check a request and answer metadata without asking the engine."""

    models: dict[str, ModelInfo]
    skipped: dict[str, str]
    devices: list[str]
    max_examples: int  # examples in one request (--max-examples-per-request)
    capacity: int | None = None  # requests the engine holds at most (queued, on its workers' batches); None: no bound
    load_errors: dict[str, str] = {}  # a model's last load that failed, while what served it serves on
    control: str = "none"  # the model control mode: none, explicit, poll

    def model(self, name: Any) -> ModelInfo:
        """The model named ``name``; ``UnknownModel`` or ``NotReady`` naming what exists."""
        found = self.models.get(name) if isinstance(name, str) else None
        if found is not None:
            return found
        if isinstance(name, str) and name in self.skipped:
            raise NotReady(f"model {name!r} is not ready: it failed to load at start (see the service log)")
        raise UnknownModel(f"unknown model {prefix(name)}; available: {', '.join(self.models)}")

    @staticmethod
    def version(model: ModelInfo, version: str | int | None) -> VersionInfo:
        if version is None or version == "":
            return model.default
        number = version if isinstance(version, int) else None
        if isinstance(version, str) and version.isascii() and version.isdigit() and len(version) <= 18:
            number = int(version)  # not "²" (isdigit, but int() refuses it), nor 4300+ digits (int() refuses)
            if str(number) != version:  # "01": as the repository, which serves only directories named "1"
                number = None
        if number is None or number not in model.versions:
            raise UnknownModel(f"model {model.name!r} has no version {prefix(version)}; it has "
                               f"{', '.join(str(v) for v in sorted(model.versions))}")
        return model.versions[number]

    def resolve(self, name: Any, version: str | int | None) -> tuple[ModelInfo, VersionInfo]:
        """The model and the version a request names; ``UnknownModel`` or ``NotReady`` naming what exists."""
        model = self.model(name)
        return model, self.version(model, version)

    def check(self, request: InferRequest, model: ModelInfo, version: VersionInfo, inline_bytes: int,
              deadline: float, priority: int = 0, own_deadline: bool = False,
              parameters: dict[str, Any] | None = None) -> tuple[Work, dict[str, np.ndarray]]:
        """The request to ``version`` of ``model`` (``resolve``) as the engine takes it, and its arrays in
        the model's input order; ``InvalidInput`` naming what is wrong and what to send. ``parameters``:
        checked (``check_parameters``)."""
        arrays, examples = self._inputs(model, version, request.inputs)
        return Work(model.name, version.number, examples, self._outputs(version, request.outputs),
                    request.arrived, deadline, request.size <= inline_bytes, priority, own_deadline,
                    parameters), arrays

    @staticmethod
    def check_names(model: ModelInfo, version: VersionInfo, names) -> None:
        """``InvalidInput`` for the first of ``names`` that is not one of the version's inputs."""
        specs = version.inputs
        for name in names:
            if all(s.name != name for s in specs):
                raise InvalidInput(f"unknown input {prefix(name)}; model {model.name!r} takes "
                                   + ", ".join(f"{s.name} ({s.datatype} {list(s.shape)})" for s in specs))

    def check_examples(self, examples: int, name: str) -> None:
        """``InvalidInput`` for input ``name`` of no examples, or of more than one request may hold."""
        if examples == 0:
            raise InvalidInput(f"input {name!r} has no examples: send at least one")
        if examples > self.max_examples:
            raise InvalidInput(f"{examples} examples in one request; the limit is {self.max_examples}")

    def _inputs(self, model: ModelInfo, version: VersionInfo, inputs: Mapping[str, np.ndarray]):
        self.check_names(model, version, inputs)
        specs = {spec.name: spec for spec in version.inputs}
        missing = [name for name in specs if name not in inputs]
        if missing:
            raise InvalidInput(f"missing input {missing[0]!r} ({specs[missing[0]].datatype} "
                               f"{list(specs[missing[0]].shape)}); model {model.name!r} takes "
                               f"{', '.join(specs)}")
        arrays = {}
        for spec in version.inputs:
            array = inputs[spec.name]
            try:
                spec.check(array)
            except InputError as exc:
                raise InvalidInput(str(exc)) from None
            arrays[spec.name] = array
        if model.max_batch_size == 0:
            return arrays, 1
        rows = {int(a.shape[0]) for a in arrays.values()}
        if len(rows) != 1:
            raise InvalidInput(f"inputs differ in their first (batch) dimension: "
                               f"{ {n: int(a.shape[0]) for n, a in arrays.items()} }; send the same number of rows")
        (examples,) = rows
        self.check_examples(examples, version.inputs[0].name)
        return arrays, examples

    @staticmethod
    def _outputs(version: VersionInfo, outputs: list[str] | None) -> list[str]:
        names = [spec.name for spec in version.outputs]
        if outputs is None:
            return names
        for name in outputs:
            if name not in names:
                raise InvalidInput(f"unknown output {prefix(name)}; the model's outputs are {', '.join(names)}")
        return list(dict.fromkeys(outputs))
