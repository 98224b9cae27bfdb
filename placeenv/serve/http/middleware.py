"""Plain ASGI pieces the app is built from: the body limit, a quiet start-up failure, and header
look-ups on a scope."""

from __future__ import annotations

from ..protocol.errors import TooLarge
from .responses import refusal


def header(scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower case), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def headers(scope, names: tuple[bytes, ...]) -> list[str | None]:
    """The first value of each header of ``names`` (lower case), decoded, or None: one walk of the
    request's headers."""
    found: dict[bytes, str] = {}
    for key, value in scope["headers"]:
        if key in names and key not in found:
            found[key] = value.decode("latin-1")
    return [found.get(name) for name in names]


class QuietStartupFailure:
    """A start-up refused with a ``StartupError`` (already logged in one line) is reported to the
    server without Starlette's formatted traceback; any other failure keeps it."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "lifespan":
            return await self.app(scope, receive, send)

        async def quiet(message):
            if message["type"] == "lifespan.startup.failed" and getattr(
                    scope["app"].state, "startup_error", None) is not None:
                message = {"type": "lifespan.startup.failed", "message": ""}
            await send(message)

        return await self.app(scope, receive, quiet)


class BodyLimit:
    """413 for bodies over ``limit`` bytes, before anything parses them."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        try:
            body = await self.read(scope, receive)
        except TooLarge as exc:
            return await refusal(exc, scope.get("path", ""), 0)({"type": "http"}, None, send)
        if body is not None:
            return await self.app(scope, replaying(body, receive), send)
        return None

    async def read(self, scope, receive) -> bytes | None:
        """The whole body; None when the client left; ``TooLarge`` past the limit."""
        declared = header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            raise self.too_large()
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                raise self.too_large()
            chunks.append(chunk)
            if not message.get("more_body"):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def too_large(self) -> TooLarge:
        return TooLarge(f"request body over the limit of {self.limit} bytes; send less")


def replaying(body: bytes, receive):
    """A ``receive`` that gives ``body`` first, then what ``receive`` gives."""
    replayed = False

    async def replay():
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
