"""JSON on the predict path by pydantic-core (Rust) instead of the ``json`` module.

Requests: FastAPI parses a JSON body with ``json.loads`` before validating it; for the
nested number lists of a predict request, pydantic-core's parser (Rust) is faster
(docs/benchmarks.md, "Figures behind the code's choices"). Anything it does not accept
is handed to ``json.loads``, so error answers, and what is accepted, stay exactly FastAPI's.

Wired in through FastAPI's documented extension point, a custom ``APIRoute``
whose handler sees a custom ``Request``.

Responses: ``FastJSONResponse`` renders with ``pydantic_core.to_json``, also faster than
Starlette's ``json.dumps``: the same JSON (floats round-trip exactly), except that a
non-finite float becomes the string "NaN"/"Infinity" (as in the service's 422 answers)
instead of an error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

import pydantic_core
from fastapi import Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute


class FastJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = pydantic_core.from_json(body, allow_inf_nan=True)
            except ValueError:  # invalid, or valid but outside its reach (a lone surrogate)
                self._json = json.loads(body)  # the exact JSONDecodeError, or the value
        return self._json


class FastJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route_handler(request: Request) -> Response:
            return await handler(FastJSONRequest(request.scope, request.receive))

        return route_handler


class FastJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return pydantic_core.to_json(content, inf_nan_mode="strings")
