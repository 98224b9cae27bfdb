"""The FastAPI application, assembled from its rooms over one gateway (gateway.py): the simple
JSON API (predict.py), the Open Inference Protocol (v2.py; grpc_v2.py over gRPC), the inference
route table both ways in read (routes.py), plain ASGI middleware (middleware.py), the pages a
person reads (pages.py), and here the operational endpoints, the error handlers and the start-up.

Request path: arrival stamped -> body size limit (before parsing) -> parse into an
``InferRequest`` -> ``Gateway.infer`` (checks against the catalog; then the engine:
CPU preprocessing under ``@PlaceEnv('cpu')``, least-loaded device queue, a worker
pinned to that device) -> render. Paddle is imported only where the engine runs.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import metrics, predict, v2, wire
from .config import Settings
from .errors import MethodNotAllowed, ServiceError, StartupError, UnsupportedMediaType
from .fastjson import FastJSONRoute
from .gateway import Gateway
from .middleware import BodyLimit, QuietStartupFailure, error_key
from .pages import DOCS_URL, ENDPOINTS, add_offline_docs
from .predict import Error
from .routes import EscapedJSONResponse, HotRoutes, ServiceApp, document, refusal
from .wire import prefix

log = logging.getLogger(__name__)

#: The inference routes: one table, which ``HotRoutes`` serves and ``document`` documents.
INFER_ROUTES = (predict.ROUTE, *v2.INFER_ROUTES)


def _json_safe(value: Any) -> Any:
    """Non-finite floats (``NaN``/``Infinity``, which ``json.loads`` accepts) as strings; the rest as is."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


def create_app(settings: Settings, connect=None, shared_ports: bool = False) -> FastAPI:
    """The complete app: routes, error handlers and the request body limit.

    ``connect``: an async context manager factory giving the ``Gateway`` (a front end's, whose
    engine is another process); by default the engine runs in this process (``--frontends 0``).
    ``shared_ports``: the gRPC port is shared with the other front ends (SO_REUSEPORT).
    """
    if connect is None:
        # Paddle installs its own SIGTERM handler (a fatal error) when it is imported: import it now,
        # so that uvicorn's, installed when it starts serving, is the one that stays.
        importlib.import_module("placeenv.serve.core")
        connect = local_engine

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        try:
            async with connect(settings) as gateway:
                app.state.gateway = gateway
                async with serve_grpc(gateway, settings, shared_ports) as close_grpc:
                    app.state.close_grpc = close_grpc
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
        lifespan=lifespan,
        # Served by add_offline_docs from installed files: FastAPI's own pages load them from a CDN.
        docs_url=None,
        redoc_url=None,
        # Swagger UI's default "validator badge" loads an image from validator.swagger.io.
        swagger_ui_parameters={"validatorUrl": None},
    )
    add_offline_docs(app)
    app.hot = HotRoutes(super(ServiceApp, app).__call__, INFER_ROUTES, settings.max_body_bytes,
                        settings.retry_after_s)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(QuietStartupFailure)
    app.router.route_class = FastJSONRoute  # bodies parsed by pydantic-core (see fastjson.py)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        unread = not_json(request, exc)
        if unread is not None:
            count_refusal(request, unread)
            return refusal(unread, request.url.path, settings.retry_after_s)
        # FastAPI's default handler echoes the offending input, and would answer 500 when
        # that input is NaN/Infinity or holds a lone surrogate ("\ud800"): strict UTF-8
        # JSON cannot encode either. Same 422 body otherwise, each input cut to a prefix.
        # loc holds the client's keys too (an unknown field's name, an inputs key): cut them alike;
        # and the first 10 errors only, so a body of many unknown keys cannot make a huge answer.
        found = [{**e, "loc": [p if not isinstance(p, str) or len(p) <= 40 else prefix(p) for p in e["loc"]],
                  **({"input": prefix(e["input"])} if "input" in e else {})} for e in exc.errors()[:10]]
        return EscapedJSONResponse({"detail": _json_safe(jsonable_encoder(found))}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def routing_error(request: Request, exc: StarletteHTTPException) -> Response:
        # The framework's own answers (404, 405), in each API's shape; a 405 says what to use.
        path = request.url.path
        if exc.status_code == 405:
            error = method_not_allowed(request, exc)
            if app.hot.find(path) is not None:  # an inference request, with the wrong method
                count_refusal(request, error)
            return refusal(error, path, settings.retry_after_s)
        if error_key(path) == "detail":
            return await http_exception_handler(request, exc)
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug of ours still answers in the API's own error shape (uvicorn logs the traceback).
        return JSONResponse({error_key(request.url.path): f"internal error ({type(exc).__name__}); see the service log"},
                            status_code=500)

    @app.exception_handler(ServiceError)
    async def refused(request: Request, exc: ServiceError) -> JSONResponse:
        return refusal(exc, request.url.path, settings.retry_after_s)

    document(app, INFER_ROUTES)

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
    async def readyz(request: Request):
        status = await request.app.state.gateway.status()
        return JSONResponse(status, status_code=200 if status["ready"] else 503)

    @app.get("/metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    app.include_router(v2.router())
    return app


def not_json(request: Request, exc: RequestValidationError) -> UnsupportedMediaType | None:
    """The 415 for a body FastAPI did not read because its Content-Type is not JSON's; its 422 (a
    "model_attributes_type" about the raw bytes) would never mention the header."""
    sent = request.headers.get("content-type")
    if request.method != "POST" or wire.is_json(sent) or all(e["loc"][:1] != ("body",) for e in exc.errors()):
        return None
    return UnsupportedMediaType(f"{request.url.path} reads a JSON body: send the header "
                                f"Content-Type: application/json; got {wire.sent_type(sent)}")


def method_not_allowed(request: Request, exc: StarletteHTTPException) -> MethodNotAllowed:
    """The router's 405, saying which method the path takes and, from ``ENDPOINTS``, what for."""
    # StaticFiles (the documentation's files) raises its 405 without Allow: it serves GET and HEAD.
    allow = (exc.headers or {}).get("Allow", "GET, HEAD")
    route = getattr(request.scope.get("route"), "path", None)
    about = {e["method"]: e["about"] for e in ENDPOINTS if e["path"] == route}
    return MethodNotAllowed(request.method, request.url.path, allow, about)


def count_refusal(request: Request, error: ServiceError) -> None:
    """Count a request refused before it named its model (in ``inference_requests_total``, as "unknown")."""
    gateway = getattr(request.app.state, "gateway", None)
    if gateway is not None:  # None until started
        gateway.refused(None, error)


@asynccontextmanager
async def local_engine(settings: Settings):
    """The engine in this process (``--frontends 0``): the models, devices and workers, and its gateway."""
    from .core import Service  # imports Paddle: only where the engine runs
    from .gateway import LocalEngine

    service = Service(settings)
    await asyncio.to_thread(service.start)
    try:
        yield Gateway(settings, LocalEngine(service))
    finally:
        await asyncio.to_thread(service.stop)


@asynccontextmanager
async def serve_grpc(gateway: Gateway, settings: Settings, shared: bool = False):
    """The gRPC endpoint (grpc_v2) when ``grpc_port`` is set, started on the running loop; gives a
    function any thread may call to close its listener (running RPCs get the shutdown grace), or None."""
    if not settings.grpc_port:
        yield None
        return
    try:
        from . import grpc_v2
    except ImportError as exc:
        raise StartupError(f"PLACEENV_GRPC_PORT is set but {exc.name} is not installed: "
                           "pip install 'placeenv[grpc]', or unset it") from None
    try:
        server = await grpc_v2.start(gateway, settings, shared)
    except RuntimeError as exc:  # grpc.aio: the port is taken or the address does not bind
        raise StartupError(f"cannot serve gRPC on {settings.host}:{settings.grpc_port}: {exc}") from None
    log.info("Open Inference Protocol over gRPC on %s:%d", settings.host, settings.grpc_port)
    loop, grace = asyncio.get_running_loop(), settings.shutdown_grace_s
    try:
        yield lambda: asyncio.run_coroutine_threadsafe(server.stop(grace), loop)
    finally:  # already closing when the shutdown delay ended (__main__)
        await server.stop(grace)
