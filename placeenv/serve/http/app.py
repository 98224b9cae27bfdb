"""The FastAPI application over one gateway (protocol/gateway.py): the inference routes' table
(``INFER_ROUTES``: the simple JSON API of predict.py and the Open Inference Protocol of v2.py),
served by the router of routes.py and documented from the same table; the rest of /v2; the
pages a person reads (pages.py); and here the operational endpoints, the error handlers and the
start-up.

Request path: arrival stamped -> ``InferRouter`` (body size limit before parsing) -> the route's
adapter -> ``Gateway.infer`` (reads and checks the request against the catalog; then the engine:
CPU preprocessing under ``@PlaceEnv('cpu')``, least-loaded device queue, a worker pinned to that
device) -> render. Paddle is not imported here: the engine is the gateway's, in this process or
another.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import metrics
from ..config import Settings
from ..protocol.errors import MethodNotAllowed, ServiceError, StartupError, Unprocessable, internal_error
from . import paddlex, predict, v2
from .middleware import BodyLimit, QuietStartupFailure
from .pages import DOCS_URL, add_offline_docs, endpoints
from .predict import Error
from .responses import JSON, error_body, refusal, validation_detail
from .routes import InferRouter, ServiceApp, document

log = logging.getLogger(__name__)

#: The inference routes: one table, which ``InferRouter`` serves and ``document`` documents.
INFER_ROUTES = (predict.ROUTE, *v2.INFER_ROUTES, *paddlex.ROUTES)
#: ``GET /``: where things are, for a person or a script that found the port; a 405 quotes the line
#: of the method to use.
ENDPOINTS = endpoints(INFER_ROUTES)


def create_app(settings: Settings, connect) -> FastAPI:
    """The complete app: routes, error handlers and the request body limit.

    ``connect(settings)``: an async context manager giving the ``Gateway`` for the app's life: the
    engine in this process (engine/local.py) or a front end's link to the engine process.
    """
    otel = settings.opentelemetry
    app = ServiceApp(
        # Off, FastAPI skips its per-request look-up of OpenTelemetry providers, a cost on every request
        # (docs/benchmarks.md, "Figures behind the code's choices").
        telemetry={"tracing": otel, "metrics": otel, "logs": otel},
        title="placeenv inference service",
        version="0.1.0",
        description="Paddle models from a model repository on several devices from one process; each worker "
        "thread pins its own device with placeenv, and every request's tensors are checked to be where they "
        "belong. POST /predict is the simple JSON API; /v2 is the Open Inference Protocol (KServe v2, with "
        "Triton's binary tensor extension).",
        lifespan=lifespan(settings, connect),
        default_response_class=JSON,
        # Served by add_offline_docs from installed files: FastAPI's own pages load them from a CDN.
        docs_url=None,
        redoc_url=None,
        # Swagger UI's default "validator badge" loads an image from validator.swagger.io.
        swagger_ui_parameters={"validatorUrl": None},
    )
    add_offline_docs(app)
    app.infer = InferRouter(INFER_ROUTES, settings.max_body_bytes, settings.retry_after_s)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(QuietStartupFailure)
    add_error_handlers(app, settings.retry_after_s)
    document(app, INFER_ROUTES)
    add_operational_routes(app)
    app.include_router(v2.router())
    return app


def lifespan(settings: Settings, connect):
    """The app's life: the gateway ``connect(settings)`` gives, held as ``app.state.gateway``."""

    @asynccontextmanager
    async def life(app: FastAPI):
        try:
            async with connect(settings) as gateway:
                app.state.gateway = gateway
                catalog = gateway.catalog
                log.info("serving %s on %s (isolation %s)", ", ".join(catalog.models),
                         ", ".join(catalog.devices), settings.isolation)
                yield
        except StartupError as exc:
            # Said once, as it is (it names the model, file or device); QuietStartupFailure keeps
            # Starlette from repeating it as a traceback of our own frames.
            log.error("cannot start: %s", exc)
            app.state.startup_error = exc
            raise

    return life


def add_error_handlers(app: FastAPI, retry_after_s: int) -> None:
    """Every error answered in its API's shape (``responses.refusal``): FastAPI's own, a
    ``ServiceError``, and a bug of ours."""

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        # FastAPI's default handler echoes the offending input whole; this one cuts it to a prefix.
        return refusal(Unprocessable(validation_detail(exc.errors())), request.url.path, retry_after_s)

    @app.exception_handler(StarletteHTTPException)
    async def routing_error(request: Request, exc: StarletteHTTPException) -> Response:
        # The framework's own answers (404, 405), in each API's shape; a 405 says what to use.
        path = request.url.path
        if exc.status_code == 405:
            return refusal(method_not_allowed(request, exc), path, retry_after_s)
        return JSON(error_body(path, exc.detail, exc.status_code), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        # A bug of ours still answers in the API's own error shape (uvicorn logs the traceback).
        return refusal(internal_error(exc), request.url.path, retry_after_s)

    @app.exception_handler(ServiceError)
    async def refused(request: Request, exc: ServiceError) -> Response:
        return refusal(exc, request.url.path, retry_after_s)


def add_operational_routes(app: FastAPI) -> None:
    """The index, /v1/models, the health checks and the metrics."""

    @app.get("/", summary="Index of the endpoints")
    async def index() -> dict[str, Any]:
        return {"service": app.title, "version": app.version, "docs": DOCS_URL, "openapi": app.openapi_url,
                "endpoints": ENDPOINTS}

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, Any]:
        catalog = request.app.state.gateway.catalog
        return {"models": [m.describe() for m in catalog.models.values()], "devices": catalog.devices,
                "not_ready": catalog.skipped}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/readyz", responses={503: {"model": Error}})
    async def readyz(request: Request) -> Response:
        status = await request.app.state.gateway.status()
        return JSON(status, status_code=200 if status["ready"] else 503)

    @app.get("/metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)


def method_not_allowed(request: Request, exc: StarletteHTTPException) -> MethodNotAllowed:
    """The router's 405, saying which method the path takes and, from ``ENDPOINTS``, what for."""
    # StaticFiles (the documentation's files) raises its 405 without Allow: it serves GET and HEAD.
    allow = (exc.headers or {}).get("Allow", "GET, HEAD")
    route = getattr(request.scope.get("route"), "path", None)
    about = {e["method"]: e["about"] for e in ENDPOINTS if e["path"] == route}
    return MethodNotAllowed(request.method, request.url.path, allow, about)
