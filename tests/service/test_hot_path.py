"""The lean request path gives the answers of the ways it replaces.

- ``InferRouter`` serves ``/predict`` and ``/v2/.../infer`` ahead of FastAPI, from the table that
  documents them: each request gets its status, and a body that is not a predict request gets
  FastAPI's 422 in FastAPI's words (a FastAPI route reading the same body is the reference);
- a worker gathering a batch is woken when the queue may fill it, not by every job, and sends it
  when requests stop arriving;
- ``LoopMetrics`` exports what prometheus_client's Counter, Histogram and Gauge would.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from placeenv.serve import metrics
from placeenv.serve.config import Settings
from placeenv.serve.engine.local import local_gateway
from placeenv.serve.http.app import create_app
from placeenv.serve.http.predict import PredictRequest
from placeenv.serve.http.responses import JSON as JSONAnswer
from placeenv.serve.http.responses import validation_detail
from placeenv.serve.engine.dispatch import DeviceQueue, Job
from support import ManualClock, wait_until

DIGIT = [0, 0, 5, 13, 9, 1, 0, 0] * 8
V2 = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": DIGIT}]}
JSON = {"content-type": "application/json"}
# (path, body, headers): good requests, and each kind of refusal either route gives
REQUESTS = [
    ("/predict", {"model": "digits", "inputs": [DIGIT]}, JSON),
    ("/predict", {"model": "digits", "version": 1, "inputs": [DIGIT, DIGIT]},
     {"content-type": "Application/JSON; charset=utf-8"}),
    ("/predict", {"model": "digits", "inputs": [DIGIT]}, {}),  # 415: no content type, not read as JSON
    ("/predict", b"", JSON),  # 422: no body
    ("/predict", {"model": "nope", "inputs": [DIGIT]}, JSON),  # 404
    ("/predict", {"model": "digits", "version": 7, "inputs": [DIGIT]}, JSON),  # 404, version
    ("/predict", {"model": "digits", "inputs": [[1, 2]]}, JSON),  # 400, shape
    ("/predict", {"model": "digits", "inputs": [DIGIT] * 60}, JSON),  # 413: too many for this app's limit
    ("/predict", {"model": "digits", "inputs": [DIGIT], "extra": 1}, JSON),  # 422, FastAPI's words
    ("/predict", {"inputs": [DIGIT]}, JSON),  # 422
    ("/predict", b"{not json", JSON),  # 422, json_invalid
    ("/predict", {"model": "digits", "inputs": [DIGIT]}, {"content-type": "text/plain"}),  # 415
    ("/predict", {"model": "digits", "inputs": [DIGIT]}, {"content-type": "application/vnd.x+json"}),
    ("/predict", b"[" * 8001, JSON),  # 413: over the limit
    # JSON that json.loads reads and pydantic-core does not: read as FastAPI reads it.
    ("/predict", b'{"model": "\\ud800", "inputs": [[1]]}', JSON),  # 404, a lone surrogate
    ("/predict", b'{"model": "digits", "inputs": ["\\ud800"]}', JSON),  # 400
    ("/predict", json.dumps({"model": "digits", "inputs": [DIGIT]}).encode("utf-16"), JSON),  # 200
    ("/predict", b"\xef\xbb\xbf" + json.dumps({"model": "digits", "inputs": [DIGIT]}).encode(), JSON),
    ("/v2/models/digits/infer", V2, JSON),
    ("/v2/models/digits/versions/1/infer", {**V2, "id": "x-1", "outputs": [{"name": "label"}]}, JSON),
    ("/v2/models/digits/versions/9/infer", V2, JSON),  # 404
    ("/v2/models/nope/infer", V2, JSON),  # 404
    ("/v2/models/digits/infer", {"inputs": [{**V2["inputs"][0], "datatype": "INT8"}]}, JSON),  # 400
    ("/v2/models/digits/infer", b"[]", JSON),  # 400
    ("/v2/models/digits/infer", b"\xff", JSON),  # 400
    ("/predict", b"\xff\xfe\x00", JSON),  # 400: not JSON text in any encoding
    ("/predict", b"[" * 3000 + b"]" * 3000, JSON),  # 400: nested past json.loads' depth
]

#: Each request's status, either way (a body over the limit is a 413 before anything reads it).
STATUSES = [200, 200, 415, 422, 404, 404, 400, 413, 422, 422, 422, 415, 200, 413, 404, 400, 200, 200,
            200, 200, 404, 404, 400, 400, 400, 400, 400]
assert len(STATUSES) == len(REQUESTS)


@pytest.fixture(scope="module")
def app():
    """The app with its engine started (lifespan), on the CPU, and a body limit small enough to reach."""
    application = create_app(Settings(devices="cpu", models="digits", workers_per_device=1, max_body_bytes=8000),
                             local_gateway)
    loop = asyncio.new_event_loop()
    lifespan = application.router.lifespan_context(application)
    loop.run_until_complete(lifespan.__aenter__())
    application.loop = loop
    yield application
    loop.run_until_complete(lifespan.__aexit__(None, None, None))
    loop.close()


def fastapi_reading_predict() -> FastAPI:
    """The reference for FastAPI's words: a FastAPI route that reads /predict's body itself, with the
    service's handler of FastAPI's validation errors (a prefix of each input)."""
    reference = FastAPI()

    @reference.post("/predict")
    async def predict(body: PredictRequest) -> dict:
        return {"read": True}

    @reference.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        return JSONAnswer({"detail": validation_detail(exc.errors())}, status_code=422)

    return reference


def _post(app, asgi, path, body, headers) -> httpx.Response:
    async def go():
        transport = httpx.ASGITransport(app=asgi)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            return await client.post(path, content=content, headers=headers)

    return app.loop.run_until_complete(go())


@pytest.mark.parametrize("path, body, headers, status", [(*r, s) for r, s in zip(REQUESTS, STATUSES, strict=True)])
def test_each_inference_request_gets_its_answer_and_a_422_is_in_fastapis_words(app, path, body, headers, status):
    answer = _post(app, app, path, body, headers)
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    if status == 422:
        reference = _post(app, fastapi_reading_predict(), path, body, headers)
        assert (answer.status_code, answer.json()) == (reference.status_code, reference.json())
    if status == 415:
        assert "Content-Type: application/json" in answer.json()["detail"]


def test_the_router_answers_every_method_on_an_inference_path(app):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.get("/predict"), await client.put("/v2/models/digits/infer", content=b"{}")

    get, put = app.loop.run_until_complete(go())
    assert (get.status_code, get.headers["allow"]) == (405, "POST")
    assert "use POST /predict" in get.json()["detail"] and "simple JSON API" in get.json()["detail"]
    assert (put.status_code, put.headers["allow"]) == (405, "POST") and "use POST" in put.json()["error"]


def test_openapi_documents_the_inference_routes(app):
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return (await client.get("/openapi.json")).json()

    paths = app.loop.run_until_complete(go())["paths"]
    assert "post" in paths["/predict"] and "post" in paths["/v2/models/{name}/infer"]
    assert "post" in paths["/v2/models/{name}/versions/{version}/infer"]
    assert "PredictRequest" in json.dumps(paths["/predict"]["post"]["requestBody"])
    # The documented version is a path parameter only, not also a query parameter.
    versioned = paths["/v2/models/{name}/versions/{version}/infer"]["post"]["parameters"]
    assert [(p["name"], p["in"]) for p in versioned] == [("name", "path"), ("version", "path")]


def test_one_route_table_is_the_router_the_documentation_and_the_index(app):
    """Every documented inference route comes from the table, and the router serves the table: an
    inference route added beside it (documented, but not routed, or the reverse) fails here."""
    from placeenv.serve.http.app import ENDPOINTS, INFER_ROUTES

    posts = {path for path, operations in app.openapi()["paths"].items() if "post" in operations}
    assert posts - {"/v2/repository/index"} == {route.path for route in INFER_ROUTES}
    assert [route.path for route in app.infer.routes] == [route.path for route in INFER_ROUTES]
    assert [e["path"] for e in ENDPOINTS if e["method"] == "POST"] == [route.path for route in INFER_ROUTES]
    assert app.infer.find("/v2/models/digits/versions/1/infer")[1] == {"name": "digits", "version": "1"}
    for path in ("/v2/models/digits/infer/more", "/v2/models//infer", "/predict/", "/v2/models/digits"):
        assert app.infer.find(path) is None, path


# -- batching: who wakes whom ---------------------------------------------------------------------


def _job(loop, model: tuple[str, int] = ("m", 1)) -> Job:
    return Job(model=model, inputs={}, examples=1, batched=True, loop=loop, future=loop.create_future(),
               arrived=time.perf_counter(), deadline=time.perf_counter() + 60)


def _gathering(limit: int = 4, delay: float = 2.0):
    """A queue on a hand-driven clock, two jobs in it, and a worker gathering them into a batch
    (started, and waiting on the clock). Returns (queue, clock, loop, found, thread); ``found``
    gets the batch once the worker is done."""
    clock = ManualClock()
    queue = DeviceQueue("cpu", 64, 1, clock=clock)
    loop = asyncio.new_event_loop()
    queue.models = {("m", 1)}
    for _ in range(2):  # two queued: the worker takes both, and gathers for more
        queue.offer(_job(loop))
    found: list = []
    limits = {("m", 1): (limit, delay)}
    thread = threading.Thread(target=lambda: found.extend(queue.take_batch(limits, wait=5)))
    thread.start()
    wait_until(lambda: clock.sleeping == 1, 5, "the worker did not start gathering")
    return queue, clock, loop, found, thread


def _went(clock: ManualClock, thread: threading.Thread) -> float:
    """When the batch went: the end of the worker's last wait (nothing waits after it)."""
    thread.join(5)
    assert not thread.is_alive(), "the worker is still gathering"
    return clock.log[-1][2]


@pytest.mark.parametrize("jobs, full", [(4, True), (3, False)])
def test_a_gathering_worker_wakes_when_the_queue_can_fill_its_batch(jobs, full):
    queue, clock, loop, found, thread = _gathering()
    try:
        for _ in range(jobs - 2):
            queue.offer(_job(loop))
        if not full:
            clock.advance(0.1)  # the first look: a job joined
            clock.advance(0.1)  # the second: none did
        took = _went(clock, thread)
        assert len(found) == jobs
        # Full: woken at once, by the second job (2 more may fill it; the first did not wake it), with
        # no time passing. Not full (the control): nothing woke it; it went after two looks (a
        # twentieth of its 2 s delay each), the second finding that nobody had joined.
        if full:
            assert clock.log == [("notified", 0.1, 0.0)] and took == 0.0, clock.log
        else:
            assert clock.log == [("timed out", 0.1, 0.1), ("timed out", 0.1, pytest.approx(0.2))], clock.log
            assert took == pytest.approx(0.2), took
    finally:
        loop.close()


@pytest.mark.parametrize("gap", [0.05, 1.0])
def test_a_batch_waits_while_requests_keep_arriving_and_goes_when_they_pause(gap):
    # A job every `gap` s, 4 of them, after the first two: within a look (a twentieth of a 4 s
    # delay) they all join the batch; the control, one a second, finds the worker gone after the
    # first quiet look.
    queue, clock, loop, found, thread = _gathering(limit=16, delay=4.0)
    try:
        for _ in range(4):
            clock.advance(gap)
            queue.offer(_job(loop))
        clock.advance(4.0)  # the rest of the delay: the worker goes at its first quiet look
        took = _went(clock, thread)
        assert all(how == "timed out" for how, _, _ in clock.log), clock.log  # no offer woke it
        if gap < 0.2:
            # Looks at 0.2 (3 had joined), 0.4 (the 4th), 0.6 (none): it went there.
            assert len(found) == 6 and 0.35 <= took < 2.0 and took == pytest.approx(0.6), (len(found), took)
        else:
            assert len(found) == 2 and len(queue) == 4 and took < 0.9 and took == pytest.approx(0.2), \
                (len(found), took)
    finally:
        loop.close()


def test_another_models_arrivals_do_not_keep_a_batch_waiting():
    # A job of another model every 0.05 s for 1.5 s, while a worker gathers a batch of "m" with a
    # 4 s delay (looks of 0.2 s): the batch goes at the first look that finds no "m" joined. The
    # control, counting every model's jobs as joining, held it until the arrivals stopped (1.5 s+).
    queue, clock, loop, found, thread = _gathering(limit=16, delay=4.0)
    try:
        for _ in range(30):
            clock.advance(0.05)
            queue.offer(_job(loop, ("other", 1)))
        took = _went(clock, thread)
        assert len(found) == 2 and 0.19 <= took < 1.0 and took == pytest.approx(0.2), (len(found), took)
        assert clock.log == [("timed out", 0.2, pytest.approx(0.2))], clock.log
        assert all(job.model == ("m", 1) for job in found)
        assert len(queue) == 30  # the other model's jobs, untouched
    finally:
        loop.close()


# -- metrics kept on the loop ---------------------------------------------------------------------


def _exposition(registry: CollectorRegistry) -> list[str]:
    return sorted(line for line in generate_latest(registry).decode().splitlines() if not line.startswith("#"))


def test_loop_metrics_export_what_prometheus_clients_own_metrics_would():
    ours, theirs = metrics.LoopMetrics(), CollectorRegistry()
    mine = CollectorRegistry()
    mine.register(ours)
    requests = Counter("inference_requests", "", ["model", "device", "status"], registry=theirs)
    duration = Histogram("inference_request_duration_seconds", "", ["model", "device"],
                         buckets=metrics.LATENCY_BUCKETS, registry=theirs)
    preprocess = Histogram("inference_preprocess_duration_seconds", "", ["model"],
                           buckets=metrics.LATENCY_BUCKETS, registry=theirs)
    in_flight = Gauge("inference_in_flight_requests", "", registry=theirs)
    seconds = [0.0, 0.0004, 0.001, 0.00100001, 0.0025, 0.07, 1.0, 29.9, 30.0, 31, 1e6]
    for i, value in enumerate(seconds):
        device = f"sim:{i % 2}"
        ours.count("digits", device, "ok")
        requests.labels("digits", device, "ok").inc()
        ours.observe(ours.durations, ("digits", device), value)
        duration.labels("digits", device).observe(value)
        ours.observe(ours.preprocess, ("digits",), value / 10)
        preprocess.labels("digits").observe(value / 10)
    ours.count("unknown", "none", "not_found")
    requests.labels("unknown", "none", "not_found").inc()
    ours.in_flight = 3
    in_flight.set(3)
    assert _exposition(mine) == _exposition(theirs)
    ours.observe(ours.durations, ("digits", "sim:0"), 0.002)  # the control: one more observation shows
    assert _exposition(mine) != _exposition(theirs)
