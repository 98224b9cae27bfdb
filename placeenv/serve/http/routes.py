"""The inference routes: one table, one router, one JSON renderer.

Each ``InferRoute`` is a path, the adapter that serves it (``handle(gateway, call)``: read the body,
``Gateway.infer``, render) and what its documentation says. ``InferRouter`` serves every request
to those paths, ahead of FastAPI: six middleware layers, routing through every route, a
``Request``, dependency solving and body validation were the largest share of a small request's
time on the event loop (the profile in docs/benchmarks.md). ``document`` adds the same table to
the FastAPI app for its OpenAPI documentation only: those endpoints are never reached.

The router owns what every route shares: the arrival time, the body limit, the method, a client
that leaves while its request waits (``Departures``), the answer to a ``ServiceError``
(``errors.OUTCOMES``) and to a bug of ours. What it refuses before
an adapter runs (413, 405) it counts through the gateway; the gateway counts the rest. Before
the gateway exists (the models still loading) it answers 503, which nothing counts yet.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Response
from starlette.routing import compile_path

from ..protocol.errors import MethodNotAllowed, NotReady, ServiceError, internal_error
from .middleware import BodyLimit, header, headers
from .responses import refusal

#: The ASGI scope key of a request's arrival time (``time.perf_counter()``), stamped once by the app.
ARRIVED = "placeenv.arrived"


def arrival(scope) -> float:
    """When the request arrived: as the app received it (``ServiceApp``)."""
    return scope.get(ARRIVED) or time.perf_counter()


@dataclass(frozen=True, slots=True)
class Call:
    """One inference request as a route's adapter reads it."""

    params: dict[str, str]  # the path's parameters
    body: bytes  # whole, within the body limit
    scope: dict

    def header(self, name: bytes) -> bytes | None:
        return header(self.scope, name)

    def headers(self, names: tuple[bytes, ...]) -> list[str | None]:
        return headers(self.scope, names)

    @property
    def arrived(self) -> float:
        return arrival(self.scope)


#: A route's adapter: the answer to one call, or a ``ServiceError``.
Handler = Callable[[Any, Call], Awaitable[Response]]


@dataclass(frozen=True)
class InferRoute:
    """A POST route of the table: ``path`` as FastAPI writes it, ``handle(gateway, call)``, and the
    documentation: ``body``, the pydantic model of its request body."""

    path: str
    handle: Handler
    summary: str
    about: str  # what GET / and a 405 say of it
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

    def documented(self):
        """The FastAPI endpoint that documents the route (the path's parameters, and ``body``); the
        router answers every request to the path, so it never runs."""

        async def documented(**params) -> Response:
            raise AssertionError(f"{self.path} is served by the InferRouter, ahead of FastAPI")

        keyword = inspect.Parameter.KEYWORD_ONLY
        parameters = [inspect.Parameter(name, keyword, annotation=str) for name in self.params]
        if self.body is not None:
            parameters.append(inspect.Parameter("body", keyword, annotation=self.body))
        documented.__signature__ = inspect.Signature(parameters, return_annotation=Response)
        documented.__name__ = self.handle.__name__  # FastAPI's operationId starts with it
        return documented


def document(app: FastAPI, routes: Sequence[InferRoute]) -> None:
    """Add ``routes`` to ``app``'s OpenAPI documentation."""
    for route in routes:
        app.add_api_route(route.path, route.documented(), methods=["POST"], summary=route.summary,
                          description=route.about, response_model=route.response_model,
                          responses=route.responses, openapi_extra=route.openapi_extra, tags=route.tags)


#: How often the router looks for requests that have waited long enough to watch for their client
#: leaving: a request waiting across two looks gets a watcher.
WATCH_S = 0.1


class Departures:
    """Requests waiting for their answers whose clients may leave: an HTTP client that disconnects has
    its request's task cancelled, which withdraws its job from the engine (the gateway counts it).

    ASGI says a client left only to a ``receive()`` awaited after the body, which takes a task; most
    requests are answered before it would matter. So a request is only noted as waiting (a dict's
    entry, its own task's), and one sweep a ``WATCH_S``, run while requests wait, starts a watcher
    for each that waited across two of them. A client that leaves sooner is seen when its answer
    cannot be sent, as before."""

    def __init__(self) -> None:
        self.waiting: dict[asyncio.Task, Any] = {}  # a request's task -> its receive
        self.watchers: dict[asyncio.Task, asyncio.Task] = {}
        self.left: set[asyncio.Task] = set()  # requests cancelled because their client left
        self.sweeper: asyncio.Task | None = None

    def enter(self, task: asyncio.Task, receive) -> None:
        self.waiting[task] = receive
        if self.sweeper is None:
            self.sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def leave(self, task: asyncio.Task) -> None:
        """The request has its answer (or is gone): stop watching it, before its answer is sent."""
        del self.waiting[task]
        if self.watchers:
            watcher = self.watchers.pop(task, None)
            if watcher is not None:
                watcher.cancel()

    def gone(self, task: asyncio.Task) -> bool:
        """Whether ``task`` was cancelled because its client left (once)."""
        if task in self.left:
            self.left.discard(task)
            return True
        return False

    async def _sweep(self) -> None:
        seen: set[asyncio.Task] = set()
        try:
            while True:  # until a look finds nothing waiting: at most one sweeper started a WATCH_S
                await asyncio.sleep(WATCH_S)
                if not self.waiting:
                    return
                now = set(self.waiting)
                for task in now & seen:
                    if task not in self.watchers:
                        self.watchers[task] = asyncio.ensure_future(self._watch(task, self.waiting[task]))
                seen = now
        finally:
            self.sweeper = None

    async def _watch(self, task: asyncio.Task, receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass  # (nothing more comes after a whole body: only the disconnect)
        # Before its answer is sent (``leave``), a disconnect is the client's: the answer has nowhere to go.
        self.watchers.pop(task, None)
        if task in self.waiting:
            self.left.add(task)
            task.cancel()


class InferRouter:
    """ASGI: every request to a path of ``routes``, with the body limit and the error answers."""

    def __init__(self, routes: Sequence[InferRoute], limit: int, retry_after_s: int) -> None:
        self.routes, self.retry_after_s = tuple(routes), retry_after_s
        self.limit = BodyLimit(None, limit)
        self.departures = Departures()

    def find(self, path: str) -> tuple[InferRoute, dict[str, str]] | None:
        """The route of ``path`` (as Starlette's router sees it: without the app's ``root_path``)."""
        for route in self.routes:
            params = route.match(path)
            if params is not None:
                return route, params
        return None

    async def __call__(self, scope, receive, send, route: InferRoute, params: dict[str, str]):
        path = scope["path"]
        gateway = getattr(scope["app"].state, "gateway", None)
        try:
            if scope["method"] != "POST":
                raise MethodNotAllowed(scope["method"], path, "POST", {"POST": route.about})
            body = await self.limit.read(scope, receive)
            if body is None:  # the client left
                return None
            if gateway is None:
                raise NotReady("the service is starting: its models are loading; retry later")
            task, departures = asyncio.current_task(), self.departures
            departures.enter(task, receive)
            try:
                response = await route.handle(gateway, Call(params, body, scope))
            except asyncio.CancelledError:
                if not departures.gone(task):
                    raise
                task.uncancel()
                return None  # the client left: nothing to answer (the gateway counted it)
            finally:
                departures.leave(task)
        except ServiceError as exc:
            if gateway is not None and not exc.counted:
                gateway.refuse(exc)
            response = refusal(exc, path, self.retry_after_s)
        except Exception as exc:
            # As FastAPI's handler answers a bug of ours; raised on, uvicorn logs the traceback.
            await refusal(internal_error(exc), path, self.retry_after_s)(scope, receive, send)
            raise
        return await response(scope, receive, send)


def route_path(scope) -> str:
    """The request's path without the prefix the app is served under (``root_path``), as Starlette's
    router matches it: behind a proxy that serves the app under a prefix, the same routes match."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root):len(root) + 1] == "/":
        return path[len(root):]
    return path


class ServiceApp(FastAPI):
    """The FastAPI app, with its inference routes served first by ``InferRouter``."""

    infer: InferRouter

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            scope[ARRIVED] = time.perf_counter()  # the one arrival time every route reads
            found = self.infer.find(route_path(scope))
            if found is not None:
                scope["app"] = self  # as Starlette sets it
                return await self.infer(scope, receive, send, *found)
        return await super().__call__(scope, receive, send)
