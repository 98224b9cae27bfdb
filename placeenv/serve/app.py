"""The FastAPI application: ``POST /predict`` and the operational endpoints.

Request path: body size limit (before parsing) -> JSON schema -> model lookup
-> CPU preprocessing under ``@PlaceEnv('cpu')`` on a preprocessing thread ->
least-loaded device queue -> a worker pinned to that device -> answer.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from pydantic import BaseModel, ConfigDict, Field

import placeenv
from .models import registry
from .models.base import InputError

from . import metrics
from .config import Settings
from .dispatch import DeviceQueue, Dispatcher, Draining, Job, QueueFull
from .fastjson import FastJSONResponse, FastJSONRoute
from .workers import ModelError, PlaceChecker, WorkerDied, WorkerPool

log = logging.getLogger(__name__)


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="a name from GET /v1/models", examples=["digits"])
    inputs: list[Any] = Field(
        description="one or more examples; digits: 64 numbers in [0, 16], flat or 8x8",
        examples=[[[0, 0, 5, 13, 9, 1, 0, 0] * 8]],
    )


class PredictResponse(BaseModel):
    model: str
    outputs: list[dict[str, Any]]
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


def resolve_devices(settings: Settings) -> list[str]:
    """Device names to serve, validated; 'auto' is every accelerator, else cpu."""
    names = settings.device_list()
    if names == ["auto"]:
        names = [d for d in placeenv.available_devices() if d != "cpu"] or ["cpu"]
    good = []
    for name in names:
        try:
            good.append(placeenv.device_name(placeenv.to_place(name)))
        except ValueError as exc:
            if settings.on_device_failure == "fail":
                raise RuntimeError(f"device {name!r} cannot be used: {exc}") from None
            log.error("skipping device %r: %s", name, exc)
    if not good:
        raise RuntimeError(f"no usable device in {settings.devices!r}")
    return list(dict.fromkeys(good))


class Service:
    """Everything the endpoints share; built by the app's lifespan."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # CPU-side templates for preprocessing; an unknown name fails here, listing the known ones.
        self.models = {name: registry.create(name) for name in settings.model_list()}
        self.devices = resolve_devices(settings)
        queues = {
            d: DeviceQueue(d, settings.queue_capacity, settings.workers_per_device) for d in self.devices
        }
        self.dispatcher = Dispatcher(queues)
        self.pool = WorkerPool(queues, settings.model_list(), settings)
        self.preprocess_pool = ThreadPoolExecutor(settings.preprocess_threads, thread_name_prefix="preprocess")
        self.check_cpu = PlaceChecker("preprocess", "cpu")
        self.received = self.answered = 0  # predict calls that reached the handler / returned from it
        self.accepted = 0  # requests past the draining check, not yet answered
        self._accepted_lock = threading.Lock()
        self.draining = False

    def start(self) -> None:
        self.pool.start()
        # Paddle, FastAPI and the models leave ~150k long-lived objects: a full
        # collection walks them all (~60 ms with the GIL held, a latency spike for
        # every request in flight). Frozen, they are skipped from now on.
        gc.collect()
        gc.freeze()
        metrics.READY.set(1)

    def begin_drain(self) -> None:
        self.draining = self.dispatcher.draining = True
        metrics.READY.set(0)

    def idle(self) -> bool:
        return self.accepted == 0 and self.dispatcher.idle()

    def stop(self) -> None:
        self.begin_drain()
        self.pool.stop(self.settings.shutdown_grace_s)
        for queue in self.dispatcher.queues.values():
            for job in queue.drain_unstarted():
                job.fail(Draining())
        self.preprocess_pool.shutdown(wait=True)
        log.info("stopped: %d predict requests received, %d answered", self.received, self.answered)

    def ready(self) -> bool:
        return not self.draining and self.pool.ready()

    def _count(self, delta: int) -> None:
        with self._accepted_lock:
            self.accepted += delta


def create_app(settings: Settings) -> FastAPI:
    if settings.isolation == "off":
        placeenv.uninstall()  # the stock-Paddle demonstration
    else:
        placeenv.install()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        service = Service(settings)
        app.state.service = service
        await asyncio.to_thread(service.start)
        log.info("serving %s on %s (isolation %s)", ", ".join(service.models), ", ".join(service.devices),
                 settings.isolation)
        try:
            yield
        finally:
            await asyncio.to_thread(service.stop)

    otel = settings.opentelemetry
    app = FastAPI(
        # Off, FastAPI skips its per-request look-up of OpenTelemetry providers (~4% of saturated throughput).
        telemetry={"tracing": otel, "metrics": otel, "logs": otel},
        title="placeenv inference service",
        version="0.1.0",
        description="Paddle models on several devices from one process; each worker thread pins its own "
        "device with placeenv, and every request's tensors are checked to be where they belong.",
        lifespan=lifespan,
    )
    app.router.route_class = FastJSONRoute  # bodies parsed by pydantic-core (see fastjson.py)
    errors = {
        400: {"model": Error, "description": "body not readable as JSON (not UTF-8, too deep)"},
        404: {"model": Error, "description": "unknown model"},
        413: {"model": Error, "description": "body over the limit"},
        422: {"model": InvalidRequest, "description": "malformed request or inputs"},
        500: {"model": Error, "description": "the model failed on this request"},
        503: {"model": Error, "description": "overloaded or shutting down; see Retry-After"},
        504: {"model": Error, "description": "not answered within the request timeout"},
    }

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's default handler echoes the offending input, and would answer 500 when
        # that input is NaN/Infinity or holds a lone surrogate ("\ud800"): strict UTF-8
        # JSON cannot encode either. Same 422 body otherwise.
        return EscapedJSONResponse({"detail": _json_safe(jsonable_encoder(exc.errors()))}, status_code=422)

    def retry_after() -> dict[str, str]:
        return {"Retry-After": str(settings.retry_after_s)}

    @app.post("/predict", response_model=PredictResponse, responses=errors)
    async def predict(body: PredictRequest, request: Request) -> Response:
        service: Service = request.app.state.service
        service.received += 1  # event-loop thread only
        size = request.headers.get("content-length", "")
        inline = size.isdigit() and int(size) <= settings.inline_preprocess_bytes
        try:
            return await _admit(service, body, inline, time.perf_counter())
        finally:
            service.answered += 1

    async def _admit(service: Service, body: PredictRequest, inline: bool, arrived: float) -> Response:
        if service.draining:
            metrics.REQUESTS.labels(body.model, "none", "draining").inc()
            raise HTTPException(503, "the service is shutting down", headers=retry_after())
        template = service.models.get(body.model)
        if template is None:
            metrics.REQUESTS.labels("unknown", "none", "not_found").inc()
            raise HTTPException(404, f"unknown model {body.model!r}; available: {', '.join(service.models)}")
        if len(body.inputs) > settings.max_examples_per_request:
            metrics.REQUESTS.labels(body.model, "none", "invalid").inc()
            raise HTTPException(
                422, f"{len(body.inputs)} examples in one request; the limit is {settings.max_examples_per_request}"
            )
        if not service.dispatcher.has_room():  # refuse before spending CPU on preprocessing
            metrics.REQUESTS.labels(body.model, "none", "overloaded").inc()
            raise HTTPException(503, "all device queues are full; retry later", headers=retry_after())
        service._count(+1)
        metrics.IN_FLIGHT.inc()
        try:
            return await _predict(service, template, body, inline, arrived)
        finally:
            service._count(-1)
            metrics.IN_FLIGHT.dec()

    async def _predict(
        service: Service, template, body: PredictRequest, inline: bool, arrived: float
    ) -> Response:
        loop = asyncio.get_running_loop()
        try:
            if inline:  # small: cheaper here than two thread hand-offs
                tensor = template.preprocess(body.inputs)
            else:
                tensor = await loop.run_in_executor(service.preprocess_pool, template.preprocess, body.inputs)
        except InputError as exc:
            metrics.REQUESTS.labels(body.model, "none", "invalid").inc()
            raise HTTPException(422, str(exc)) from None
        preprocessed = time.perf_counter()
        metrics.child(metrics.PREPROCESS_DURATION, body.model).observe(preprocessed - arrived)
        service.check_cpu("preprocess", placeenv.device_name(tensor.place))
        job = Job(
            model=body.model, inputs=tensor, examples=int(tensor.shape[0]), loop=loop,
            future=loop.create_future(), arrived=arrived, deadline=arrived + settings.request_timeout_s,
        )
        try:
            service.dispatcher.submit(job)
        except QueueFull:
            metrics.REQUESTS.labels(body.model, "none", "overloaded").inc()
            raise HTTPException(503, "all device queues are full; retry later", headers=retry_after()) from None
        except Draining:
            metrics.REQUESTS.labels(body.model, "none", "draining").inc()
            raise HTTPException(503, "the service is shutting down", headers=retry_after()) from None
        # A timer, not asyncio.wait(timeout=): one handle instead of a waiter future and callbacks.
        timer = loop.call_later(max(0.0, job.deadline - time.perf_counter()), job.fail, TimeoutError())
        try:
            result = await job.future
        except (ModelError, WorkerDied) as exc:
            metrics.REQUESTS.labels(body.model, job.device, "error").inc()
            raise HTTPException(500, f"model {body.model!r} failed on this request: {exc}") from None
        except TimeoutError:
            metrics.REQUESTS.labels(body.model, job.device, "timeout").inc()
            raise HTTPException(504, f"no answer within {settings.request_timeout_s:g} s") from None
        except Draining:
            metrics.REQUESTS.labels(body.model, job.device, "draining").inc()
            raise HTTPException(503, "the service is shutting down", headers=retry_after()) from None
        finally:
            timer.cancel()
        done = time.perf_counter()
        metrics.child(metrics.REQUESTS, body.model, result["device"], "ok").inc()
        metrics.child(metrics.REQUEST_DURATION, body.model, result["device"]).observe(done - arrived)
        started = result["compute_started"]
        # A response object, not a dict: the payload is built here to PredictResponse's
        # shape (the response_model above documents it), and skipping FastAPI's
        # re-validation of every output saves a measurable share of a small request.
        return FastJSONResponse({
            "model": body.model, "outputs": result["outputs"], "device": result["device"],
            "worker": result["worker"], "batch_size": result["batch_size"],
            "timings": {
                "preprocess_ms": round((preprocessed - arrived) * 1000, 3),
                "queue_ms": round((started - job.enqueued) * 1000, 3),
                "compute_ms": round((done - started) * 1000, 3),
                "total_ms": round((done - arrived) * 1000, 3),
            },
        })

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, Any]:
        service: Service = request.app.state.service
        return {"models": [m.describe() for m in service.models.values()], "devices": service.devices}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/readyz", responses={503: {"model": Error}})
    async def readyz(request: Request):
        service: Service = request.app.state.service
        workers = {w.name: w.alive() and w.ready.is_set() for w in service.pool.workers}
        ready = service.ready()
        body = {"ready": ready, "draining": service.draining, "workers": workers}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return app


class BodyLimit:
    """ASGI middleware: 413 for bodies over ``limit`` bytes, before anything parses them."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._too_large(send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await self._too_large(send)
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    async def _too_large(self, send) -> None:
        response = JSONResponse({"detail": f"request body over the limit of {self.limit} bytes"}, status_code=413)
        await response({"type": "http"}, None, send)
