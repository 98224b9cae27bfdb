"""The service's errors, and the one table that says what each means on the wire and in the metrics.

The engine and the gateway raise these; the protocols turn them into an HTTP status
(with ``Retry-After`` when a retry may succeed, ``Allow`` for a method the path does
not take) or a gRPC status code, and the gateway into the outcome label of
``inference_requests_total``, all from ``OUTCOMES``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


class StartupError(RuntimeError):
    """The service cannot start as configured; the message names what (model, file, device) and why."""


class ServiceError(Exception):
    """A request the service cannot answer with a result; the message is for the client."""

    device = "none"  # the device whose worker answered it, when one did (a metric label)
    counted = False  # the gateway has counted its answer

    @property
    def detail(self):
        """The error answer's body: the message."""
        return str(self)


class UnknownModel(ServiceError):
    """No such model, or no such version of it."""


class InvalidInput(ServiceError):
    """A tensor's name, datatype, shape or data is not what the model takes."""


class Unprocessable(ServiceError):
    """A body that is not the request the route reads: FastAPI's 422, its list of problems as ``detail``."""

    def __init__(self, problems: list[dict]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{'.'.join(map(str, p['loc']))}: {p['msg']}" for p in problems[:3]))

    @property
    def detail(self):
        return self.problems


class TooLarge(ServiceError):
    """The request, once decompressed, is over the body limit."""


class UnsupportedMediaType(ServiceError):
    """A body sent with a Content-Type the endpoint does not read."""


class MethodNotAllowed(ServiceError):
    """A method the path does not take (``GET /predict``); the message says which to use, and for what."""

    def __init__(self, method: str, path: str, allow: str, about: Mapping[str, str]) -> None:
        self.allow = allow  # the Allow header: the path's methods, as the router lists them
        methods = [m for m in allow.split(", ") if m != "HEAD"] or ["HEAD"]
        shown = path if len(path) <= 80 else f"{path[:80]}..."  # a long model name in the path
        what = f" ({about[methods[0]]})" if len(methods) == 1 and methods[0] in about else ""
        super().__init__(f"{method[:20]} {shown} is not allowed: use {' or '.join(methods)} {shown}{what}")


class Overloaded(ServiceError):
    """Every queue that could take the request is full."""


class Draining(ServiceError):
    """The service is shutting down and takes no new work."""


class NotReady(ServiceError):
    """Not ready to serve it: the model is in the repository but could not be loaded (skipped at
    start), or the service is still starting."""


class EngineUnavailable(ServiceError):
    """The engine process is not there (it died and is restarting): the request may be sent again."""


class Timeout(ServiceError):
    """No answer within the request timeout."""


class LoadFailed(ServiceError):
    """A model could not be loaded (model control): the message names the model, the file or worker,
    and why; what served it before serves on."""


class Cancelled(ServiceError):
    """The client left before its answer (an HTTP disconnect, a cancelled gRPC call): the engine withdraws
    the request, and the answer goes nowhere. ``stage``: where the engine held it, for the metrics."""

    stage = "queued"  # or "running": a worker had begun its forward pass


class ModelFailed(ServiceError):
    """The model raised while serving the request, or its worker died."""


def internal_error(exc: BaseException, log: str = "the service log") -> ModelFailed:
    """The answer to a bug of ours (an exception that is no ``ServiceError``), wherever one is caught: its
    type but not its message, which may quote anything, and the ``log`` that holds its traceback."""
    return ModelFailed(f"internal error ({type(exc).__name__}); see {log}")


@dataclasses.dataclass(frozen=True)
class Outcome:
    status: int  # HTTP
    label: str  # the status label of inference_requests_total
    retry: bool  # answered with Retry-After: the same request may succeed later
    grpc: str  # the gRPC status code's name (grpc.StatusCode), for the gRPC endpoint
    allow: bool = False  # answered with Allow: the methods the path takes (the error's ``allow``)


OUTCOMES: dict[type[ServiceError], Outcome] = {
    UnknownModel: Outcome(404, "not_found", False, "NOT_FOUND"),
    InvalidInput: Outcome(400, "invalid", False, "INVALID_ARGUMENT"),
    Unprocessable: Outcome(422, "invalid", False, "INVALID_ARGUMENT"),
    TooLarge: Outcome(413, "too_large", False, "RESOURCE_EXHAUSTED"),
    UnsupportedMediaType: Outcome(415, "unsupported_media_type", False, "INVALID_ARGUMENT"),
    MethodNotAllowed: Outcome(405, "method_not_allowed", False, "UNIMPLEMENTED", allow=True),
    Overloaded: Outcome(503, "overloaded", True, "UNAVAILABLE"),
    Draining: Outcome(503, "draining", True, "UNAVAILABLE"),
    NotReady: Outcome(503, "not_ready", True, "UNAVAILABLE"),
    EngineUnavailable: Outcome(503, "engine_unavailable", True, "UNAVAILABLE"),
    Timeout: Outcome(504, "timeout", False, "DEADLINE_EXCEEDED"),
    # nginx's status for a client that closed its connection: logged and counted, never received.
    Cancelled: Outcome(499, "cancelled", False, "CANCELLED"),
    ModelFailed: Outcome(500, "error", False, "INTERNAL"),
    # As Triton answers a load that fails: the request named a model whose files do not load.
    LoadFailed: Outcome(400, "load_failed", False, "INVALID_ARGUMENT"),
}
OK_LABEL = "ok"


def outcome(error: ServiceError) -> Outcome:
    return OUTCOMES[type(error)]
