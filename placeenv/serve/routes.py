"""The inference routes: one table, read by both ways a request comes in.

Each ``InferRoute`` is a path, the handler that serves it, and what its documentation says.
``HotRoutes`` matches a POST against the table and calls the handler directly, ahead of FastAPI:
six middleware layers, routing through every route, a ``Request``, dependency solving and body
validation were the largest share of a small request's time on the event loop (the profile in
docs/benchmarks.md). ``document`` adds the same table to the FastAPI app, as routes whose endpoint
calls the same handler: they are the OpenAPI documentation, and the way for a body the handler
leaves to FastAPI (a ``/predict`` body pydantic-core does not read or validate, or one not sent as
JSON), so ``/predict``'s 422 and 415 come from FastAPI's handlers, worded the same either way.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.routing import compile_path

from .errors import ServiceError, outcome
from .middleware import BodyLimit, error_key, header, headers, replaying
from .request import ARRIVED, arrival


class EscapedJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: a lone surrogate from the client stays encodable."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def refusal(exc: ServiceError, path: str, retry_after_s: int) -> Response:
    """Every API's answer to a domain error: one table (errors.OUTCOMES), each API's error key."""
    found = outcome(exc)
    headers = {"Retry-After": str(retry_after_s)} if found.retry else None
    if found.allow:
        headers = {**(headers or {}), "Allow": exc.allow}
    return EscapedJSONResponse({error_key(path): str(exc)}, status_code=found.status, headers=headers)


@dataclass(frozen=True, slots=True)
class Call:
    """One inference request as a route's handler reads it, whichever way it came in."""

    params: dict[str, str]  # the path's parameters
    body: bytes  # whole, within the body limit
    scope: dict
    # The body as FastAPI read and validated it (the route's ``body`` model), on the documented way:
    # FastAPI reads what pydantic-core cannot (a lone surrogate, UTF-16), by ``json.loads``.
    parsed: Any = None

    def header(self, name: bytes) -> bytes | None:
        return header(self.scope, name)

    def headers(self, names: tuple[bytes, ...]) -> list[str | None]:
        return headers(self.scope, names)

    @property
    def arrived(self) -> float:
        return arrival(self.scope)


#: A route's handler: its answer, or None for a body FastAPI answers itself (its 415 or 422).
Handler = Callable[[Any, Call], Awaitable["Response | None"]]


@dataclass(frozen=True)
class InferRoute:
    """A POST route of the table: ``path`` as FastAPI writes it, ``handle(gateway, call)``, and the
    documentation: ``body``, a pydantic model FastAPI validates before the documented endpoint runs."""

    path: str
    handle: Handler
    summary: str
    body: type | None = None
    response_model: type | None = None
    responses: dict = field(default_factory=dict)
    openapi_extra: dict | None = None
    tags: list[str] | None = None

    def __post_init__(self) -> None:
        regex, _, params = compile_path(self.path)  # as Starlette's router matches it
        object.__setattr__(self, "regex", regex)
        object.__setattr__(self, "params", tuple(params))

    def match(self, path: str) -> dict[str, str] | None:
        found = self.regex.match(path)
        return None if found is None else found.groupdict()

    def endpoint(self):
        """The FastAPI endpoint: the handler behind FastAPI's parameters (the path's, and ``body``)."""
        handle = self.handle

        async def documented(request: Request, **params) -> Response:
            call = Call(request.path_params, await request.body(), request.scope, params.get("body"))
            response = await handle(request.app.state.gateway, call)
            assert response is not None, "FastAPI validated a body that the handler leaves to it"
            return response

        keyword = inspect.Parameter.KEYWORD_ONLY
        parameters = [inspect.Parameter("request", keyword, annotation=Request)]
        parameters += [inspect.Parameter(name, keyword, annotation=str) for name in self.params]
        if self.body is not None:
            parameters.append(inspect.Parameter("body", keyword, annotation=self.body))
        documented.__signature__ = inspect.Signature(parameters, return_annotation=Response)
        documented.__name__ = handle.__name__  # FastAPI's operationId starts with it
        return documented


def document(app: FastAPI, routes: Sequence[InferRoute]) -> None:
    """Add ``routes`` to ``app``: its OpenAPI documentation, and FastAPI's way in."""
    for route in routes:
        app.add_api_route(route.path, route.endpoint(), methods=["POST"], summary=route.summary,
                          response_model=route.response_model, responses=route.responses,
                          openapi_extra=route.openapi_extra, tags=route.tags)


class HotRoutes:
    """ASGI: ``routes`` served ahead of FastAPI (``app``), with the same body limit and error answers."""

    def __init__(self, app, routes: Sequence[InferRoute], limit: int, retry_after_s: int) -> None:
        self.app, self.routes, self.retry_after_s = app, tuple(routes), retry_after_s
        self.limit = BodyLimit(None, limit)

    def find(self, path: str) -> tuple[InferRoute, dict[str, str]] | None:
        for route in self.routes:
            params = route.match(path)
            if params is not None:
                return route, params
        return None

    async def __call__(self, scope, receive, send, route: InferRoute, params: dict[str, str]):
        gateway = getattr(scope["app"].state, "gateway", None)
        if gateway is None:  # not started
            return await self.app(scope, receive, send)
        body = await self.limit.read(scope, receive, send)
        if body is None:  # the client left, or 413 answered
            return None
        path = scope["path"]
        try:
            response = await route.handle(gateway, Call(params, body, scope))
        except ServiceError as exc:
            response = refusal(exc, path, self.retry_after_s)
        except Exception as exc:
            # As FastAPI's handler answers a bug of ours; raised on, uvicorn logs the traceback.
            await JSONResponse({error_key(path): f"internal error ({type(exc).__name__}); see the service log"},
                               status_code=500)(scope, receive, send)
            raise
        if response is None:  # FastAPI's to answer
            return await self.app(scope, replaying(body, receive), send)
        return await response(scope, receive, send)


class ServiceApp(FastAPI):
    """The FastAPI app, with its inference routes served first by ``HotRoutes``."""

    hot: HotRoutes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            scope[ARRIVED] = time.perf_counter()  # the one arrival time every route reads
            if scope["method"] == "POST":
                found = self.hot.find(scope["path"])
                if found is not None:
                    scope["app"] = self  # as Starlette sets it
                    return await self.hot(scope, receive, send, *found)
        return await super().__call__(scope, receive, send)
