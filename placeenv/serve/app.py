"""The FastAPI application: the simple JSON API (``POST /predict``), the Open Inference
Protocol (``/v2``, see v2.py) and the operational endpoints, over one gateway (gateway.py).

Request path: arrival stamped -> body size limit (before parsing) -> parse into an
``InferRequest`` -> ``Gateway.infer`` (checks against the catalog; then the engine:
CPU preprocessing under ``@PlaceEnv('cpu')``, least-loaded device queue, a worker
pinned to that device) -> render. Paddle is imported only where the engine runs.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import math
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import metrics, v2, wire
from .config import Settings
from .gateway import Gateway
from .request import ARRIVED, InferRequest, Result, arrival
from .errors import InvalidInput, MethodNotAllowed, ServiceError, StartupError, UnsupportedMediaType, outcome
from .fastjson import FastJSONResponse, FastJSONRoute
from .wire import prefix

log = logging.getLogger(__name__)


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
    detail: str


class InvalidRequest(BaseModel):
    """422: the service's own message, or FastAPI's list of schema errors for a malformed body."""

    detail: str | list[dict[str, Any]]


class EscapedJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: a lone surrogate from the client stays encodable."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


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
    app.hot = HotRoutes(super(ServiceApp, app).__call__, settings)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(QuietStartupFailure)
    app.router.route_class = FastJSONRoute  # bodies parsed by pydantic-core (see fastjson.py)
    errors = {
        400: {"model": Error, "description": "inputs the model does not take, or a body not readable as JSON"},
        404: {"model": Error, "description": "unknown model or version"},
        413: {"model": Error, "description": "body over the limit"},
        415: {"model": Error, "description": "a body not sent as Content-Type: application/json"},
        422: {"model": InvalidRequest, "description": "a body that is not a predict request"},
        500: {"model": Error, "description": "the model failed on this request"},
        503: {"model": Error, "description": "overloaded, shutting down or model not ready; see Retry-After"},
        504: {"model": Error, "description": "not answered within the request timeout"},
    }

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        unread = not_json(request, exc)
        if unread is not None:
            count_refusal(request, unread)
            return refusal(unread, request.url.path, settings)
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
            if HotRoutes.serves(path):  # an inference request, with the wrong method
                count_refusal(request, error)
            return refusal(error, path, settings)
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
        return refusal(exc, request.url.path, settings)

    # The documented route, and the one a body pydantic refuses takes (HotRoutes serves the rest).
    @app.post("/predict", response_model=PredictResponse, responses=errors)
    async def predict_route(body: PredictRequest, request: Request) -> Response:
        size = request.headers.get("content-length", "")
        return await predict(request.app.state.gateway, body, int(size) if size.isdigit() else 1 << 62,
                             arrival(request.scope))

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

    app.include_router(v2.router(settings))
    return app


#: ``GET /``: where things are, for a person or a script that found the port (not on the hot path);
#: a 405 quotes the line of the method to use.
ENDPOINTS = [
    {"method": "GET", "path": "/docs", "about": "Swagger UI: every endpoint, with a form to try it"},
    {"method": "GET", "path": "/redoc", "about": "the same documentation as one page (ReDoc)"},
    {"method": "GET", "path": "/openapi.json", "about": "the OpenAPI schema"},
    {"method": "POST", "path": "/predict",
     "about": 'the simple JSON API: a JSON body {"model": "digits", "inputs": [[...64 numbers...], ...]}'},
    {"method": "GET", "path": "/v1/models", "about": "the models, their inputs and outputs, and the devices"},
    {"method": "GET", "path": "/v2", "about": "the Open Inference Protocol (KServe v2): server metadata"},
    {"method": "GET", "path": "/v2/models/{name}", "about": "a model's metadata: inputs, outputs, versions"},
    {"method": "POST", "path": "/v2/models/{name}/infer",
     "about": 'inference: a JSON body {"inputs": [{"name", "shape", "datatype", "data"}, ...]}, or a JSON '
              "header then binary tensors (Triton's binary tensor extension)"},
    {"method": "POST", "path": "/v2/models/{name}/versions/{version}/infer",
     "about": "inference by one version of the model, as /v2/models/{name}/infer"},
    {"method": "GET", "path": "/v2/health/ready", "about": "the Open Inference Protocol's readiness"},
    {"method": "GET", "path": "/metrics", "about": "Prometheus metrics"},
    {"method": "GET", "path": "/healthz", "about": "liveness"},
    {"method": "GET", "path": "/readyz", "about": "readiness: every worker started"},
]

DOCS_URL, REDOC_URL = "/docs", "/redoc"
#: Where the documentation pages' files are served from.
ASSETS_URL = "/docs/assets"


def add_offline_docs(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) and ``/redoc`` as FastAPI serves them, with their scripts, stylesheet and
    icon served by the app from the fastapi-offline package (FastAPI's own pages load them from a CDN):
    the documentation works with no internet."""
    app.mount(ASSETS_URL, StaticFiles(packages=[("fastapi_offline", "static")]), name="docs-assets")

    def url(request: Request, path: str) -> str:
        """``path`` as the browser reaches it (behind a proxy that serves the app under a prefix)."""
        return f"{request.scope.get('root_path', '')}{path}"

    @app.get(DOCS_URL, include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=url(request, app.openapi_url), title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=url(request, app.swagger_ui_oauth2_redirect_url),
            swagger_js_url=url(request, f"{ASSETS_URL}/swagger-ui-bundle.js"),
            swagger_css_url=url(request, f"{ASSETS_URL}/swagger-ui.css"),
            swagger_favicon_url=url(request, f"{ASSETS_URL}/favicon.png"),
            swagger_ui_parameters=app.swagger_ui_parameters,
        )

    @app.get(app.swagger_ui_oauth2_redirect_url, include_in_schema=False)
    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        return get_redoc_html(
            openapi_url=url(request, app.openapi_url), title=f"{app.title} - ReDoc",
            redoc_js_url=url(request, f"{ASSETS_URL}/redoc.standalone.js"),
            redoc_favicon_url=url(request, f"{ASSETS_URL}/favicon.png"),
            with_google_fonts=False,  # Google's fonts are another host: ReDoc falls back to the browser's
        )


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


def refusal(exc: ServiceError, path: str, settings: Settings) -> Response:
    """Both APIs' answer to a domain error: one table (errors.OUTCOMES), each API's error key."""
    found = outcome(exc)
    headers = {"Retry-After": str(settings.retry_after_s)} if found.retry else None
    if found.allow:
        headers = {**(headers or {}), "Allow": exc.allow}
    return EscapedJSONResponse({error_key(path): str(exc)}, status_code=found.status, headers=headers)


async def predict(gateway: Gateway, body: PredictRequest, size: int, arrived: float) -> Response:
    """``POST /predict`` (a body of ``size`` bytes): the examples as input arrays, ``Gateway.infer``,
    one output dict per example."""
    try:
        inputs = predict_inputs(gateway, body)
    except ServiceError as exc:
        gateway.refused(body.model, exc)  # infer counts its own refusals
        raise
    result = await gateway.infer(InferRequest(body.model, body.version, inputs, None, arrived, size))
    # A response object, not a dict: the payload is built here to PredictResponse's
    # shape (the route's response_model documents it), and skipping FastAPI's
    # re-validation of every output saves a measurable share of a small request.
    return FastJSONResponse({
        "model": result.model, "version": result.version, "outputs": per_example(result),
        "device": result.device, "worker": result.worker, "batch_size": result.batch_size,
        "timings": result.timings,
    })


def error_key(path: str) -> str:
    """The key of an error answer: the Open Inference Protocol's "error" under /v2, FastAPI's "detail" elsewhere."""
    return "error" if path.startswith("/v2") else "detail"


def predict_inputs(gateway: Gateway, body: PredictRequest) -> dict:
    """``/predict``'s examples as the model's input arrays: a list for a one-input model, else by name."""
    catalog = gateway.catalog
    entry = catalog.model(body.model)
    version = catalog.version(entry, body.version)
    specs = version.inputs
    if isinstance(body.inputs, list):
        if len(specs) != 1:
            raise InvalidInput(f"model {entry.name!r} takes {len(specs)} inputs; send inputs as "
                               f"{{{', '.join(repr(s.name) + ': [examples]' for s in specs)}}}")
        given = {specs[0].name: body.inputs}
    else:
        given = body.inputs
    unknown = [name for name in given if all(s.name != name for s in specs)]
    if unknown:
        raise InvalidInput(f"unknown input {prefix(unknown[0])}; model {entry.name!r} takes "
                           f"{', '.join(s.name for s in specs)}")
    limit = catalog.max_examples
    arrays = {}
    for spec in specs:
        examples = given.get(spec.name)
        if examples is None:
            continue  # Service.infer names what is missing
        if not examples:
            raise InvalidInput(f"input {spec.name!r} has no examples: send at least one")
        unlisted = not_a_list_of_examples(entry, spec, examples, isinstance(body.inputs, dict))
        if unlisted is not None:
            raise unlisted
        if len(examples) > limit:
            raise InvalidInput(f"{len(examples)} examples in one request; the limit is {limit}")
        if entry.max_batch_size:
            arrays[spec.name] = wire.from_json(examples, spec.datatype, spec.name)
        elif len(examples) != 1:
            raise InvalidInput(f"model {entry.name!r} does not batch: send one example")
        else:  # no batch dimension: the one example is the tensor
            arrays[spec.name] = wire.from_json(examples, spec.datatype, spec.name)[0]
    return arrays


def not_a_list_of_examples(entry, spec, examples: list, named: bool) -> InvalidInput | None:
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


class ServiceApp(FastAPI):
    """The FastAPI app, with its inference routes served first by ``HotRoutes``."""

    hot: HotRoutes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            scope[ARRIVED] = time.perf_counter()  # the one arrival time every route reads
            if scope["method"] == "POST" and HotRoutes.serves(scope["path"]):
                scope["app"] = self  # as Starlette sets it
                return await self.hot(scope, receive, send)
        return await super().__call__(scope, receive, send)


class HotRoutes:
    """ASGI: the inference routes, ``POST /predict`` and ``POST /v2/models/{m}[/versions/{v}]/infer``,
    ahead of FastAPI's per-request machinery.

    Six middleware layers, routing through every route, a ``Request``, dependency solving and
    body validation by FastAPI were the largest share of a small request's time on the event loop
    (the profile in docs/benchmarks.md). Here the route's own work is called directly: ``predict``
    and ``v2.infer``, which the FastAPI routes call too, with the same body limit and error
    answers. Those routes stay the documentation (OpenAPI) and the way for everything else: a
    ``/predict`` body that pydantic refuses, or one not sent as JSON, goes on to FastAPI (``app``),
    so every 422 and 415 comes from FastAPI's handlers, worded the same either way.
    """

    def __init__(self, app, settings: Settings) -> None:
        self.app, self.settings = app, settings
        self.limit = BodyLimit(None, settings.max_body_bytes)

    @staticmethod
    def serves(path: str) -> bool:
        return path == "/predict" or (path.startswith("/v2/models/") and path.endswith("/infer"))

    async def __call__(self, scope, receive, send):
        path = scope["path"]
        route = self._predict if path == "/predict" else self._infer
        gateway = getattr(scope["app"].state, "gateway", None)
        if gateway is None:  # not started
            return await self.app(scope, receive, send)
        body = await self.limit.read(scope, receive, send)
        if body is None:  # the client left, or 413 answered
            return None
        try:
            response = await route(gateway, scope, body)
        except ServiceError as exc:
            response = refusal(exc, path, self.settings)
        except Exception as exc:
            # As FastAPI's handler answers a bug of ours; raised on, uvicorn logs the traceback.
            await JSONResponse({error_key(path): f"internal error ({type(exc).__name__}); see the service log"},
                               status_code=500)(scope, receive, send)
            raise
        if response is None:  # FastAPI's to answer
            return await self.app(scope, replaying(body, receive), send)
        return await response(scope, receive, send)

    @staticmethod
    async def _predict(gateway: Gateway, scope, body: bytes) -> Response | None:
        if not wire.is_json(header(scope, b"content-type")):
            return None  # FastAPI reads only JSON content types as JSON: its 415 for the rest
        try:
            request = PredictRequest.model_validate_json(body)
        except ValueError:  # pydantic's ValidationError: FastAPI words the 422
            return None
        return await predict(gateway, request, len(body), scope[ARRIVED])

    async def _infer(self, gateway: Gateway, scope, body: bytes) -> Response | None:
        parts = scope["path"][len("/v2/models/"):-len("/infer")].split("/")
        if len(parts) == 1 and parts[0]:
            name, version = parts[0], None
        elif len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
            name, version = parts[0], parts[2]
        else:
            return None
        encoding, length, kind = headers(scope, (b"content-encoding", _HEADER_LENGTH, b"content-type"))
        return await v2.infer(gateway, self.settings, name, version, body, encoding, length, kind, scope[ARRIVED])


def header(scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower case), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


_HEADER_LENGTH = v2.HEADER_LENGTH.encode()  # as ASGI scopes name headers: lower-case bytes


def headers(scope, names: tuple[bytes, ...]) -> list[str | None]:
    """The first value of each header of ``names`` (lower case), decoded, or None: one walk of the
    request's headers."""
    found: dict[bytes, str] = {}
    for key, value in scope["headers"]:
        if key in names and key not in found:
            found[key] = value.decode("latin-1")
    return [found.get(name) for name in names]


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


class QuietStartupFailure:
    """ASGI middleware: a start-up refused with a ``StartupError`` (already logged in one line) is
    reported to the server without Starlette's formatted traceback; any other failure keeps it."""

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
    """ASGI middleware: 413 for bodies over ``limit`` bytes, before anything parses them."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        body = await self.read(scope, receive, send)
        if body is not None:
            return await self.app(scope, replaying(body, receive), send)
        return None

    async def read(self, scope, receive, send) -> bytes | None:
        """The whole body; None when the client left or the body was over the limit (413 sent)."""
        declared = header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._too_large(scope, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await self._too_large(scope, send)
            chunks.append(chunk)
            if not message.get("more_body"):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _too_large(self, scope, send) -> None:
        response = JSONResponse({error_key(scope.get("path", "")): f"request body over the limit of {self.limit} bytes; send less"},
                                status_code=413)
        await response({"type": "http"}, None, send)
