"""The service's errors, and the one table that says what each means on the wire and in the metrics.

The domain (``core.Service``) raises these; the HTTP adapters turn them into a
status, a ``Retry-After`` header when a retry may succeed, and the outcome
label of ``inference_requests_total``, all from ``OUTCOMES``.
"""

from __future__ import annotations

import dataclasses


class StartupError(RuntimeError):
    """The service cannot start as configured; the message names what (model, file, device) and why."""


class ServiceError(Exception):
    """A request the service cannot answer with a result; the message is for the client."""


class UnknownModel(ServiceError):
    """No such model, or no such version of it."""


class InvalidInput(ServiceError):
    """A tensor's name, datatype, shape or data is not what the model takes."""


class TooLarge(ServiceError):
    """The request, once decompressed, is over the body limit."""


class Overloaded(ServiceError):
    """Every queue that could take the request is full."""


class Draining(ServiceError):
    """The service is shutting down and takes no new work."""


class NotReady(ServiceError):
    """The model is in the repository but could not be loaded (skipped at start)."""


class Timeout(ServiceError):
    """No answer within the request timeout."""


class ModelFailed(ServiceError):
    """The model raised while serving the request, or its worker died."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    status: int  # HTTP
    label: str  # the status label of inference_requests_total
    retry: bool  # answered with Retry-After: the same request may succeed later


OUTCOMES: dict[type[ServiceError], Outcome] = {
    UnknownModel: Outcome(404, "not_found", False),
    InvalidInput: Outcome(400, "invalid", False),
    TooLarge: Outcome(413, "too_large", False),
    Overloaded: Outcome(503, "overloaded", True),
    Draining: Outcome(503, "draining", True),
    NotReady: Outcome(503, "not_ready", True),
    Timeout: Outcome(504, "timeout", False),
    ModelFailed: Outcome(500, "error", False),
}
OK_LABEL = "ok"


def outcome(error: ServiceError) -> Outcome:
    return OUTCOMES[type(error)]
