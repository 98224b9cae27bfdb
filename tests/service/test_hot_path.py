"""The lean request path (issue 15) gives the answers of the ways it replaces.

- ``HotRoutes`` serves ``/predict`` and ``/v2/.../infer`` ahead of FastAPI: every answer, good
  or bad, equals the FastAPI route's for the same request, and the hot path really is taken;
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
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from placeenv.serve import metrics
from placeenv.serve.app import create_app
from placeenv.serve.config import Settings
from placeenv.serve.dispatch import DeviceQueue, Job
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
    ("/predict", {"model": "nope", "inputs": [DIGIT]}, JSON),  # 404
    ("/predict", {"model": "digits", "version": 7, "inputs": [DIGIT]}, JSON),  # 404, version
    ("/predict", {"model": "digits", "inputs": [[1, 2]]}, JSON),  # 400, shape
    ("/predict", {"model": "digits", "inputs": [DIGIT] * 33}, JSON),  # 413: too many for this app's limit
    ("/predict", {"model": "digits", "inputs": [DIGIT], "extra": 1}, JSON),  # 422, FastAPI's words
    ("/predict", {"inputs": [DIGIT]}, JSON),  # 422
    ("/predict", b"{not json", JSON),  # 422, json_invalid
    ("/predict", {"model": "digits", "inputs": [DIGIT]}, {"content-type": "text/plain"}),  # 415
    ("/predict", {"model": "digits", "inputs": [DIGIT]}, {"content-type": "application/vnd.x+json"}),
    ("/predict", b"[" * 3000, JSON),  # 413: over the limit
    # JSON that json.loads reads and pydantic-core does not: FastAPI reads it, the same handler answers.
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
]

#: Each request's status, either way (a body over the limit is a 413 before anything reads it).
STATUSES = [200, 200, 415, 404, 404, 400, 413, 422, 422, 422, 415, 200, 413, 404, 400, 200, 200,
            200, 200, 404, 404, 400, 400, 400]
assert len(STATUSES) == len(REQUESTS)


def _comparable(response: httpx.Response) -> tuple:
    """Status, content type, Retry-After and body, without what differs between two good answers."""
    body = response.json()
    if isinstance(body, dict):
        for varying in ("worker", "device", "batch_size", "timings"):
            body.pop(varying, None)
    return response.status_code, response.headers.get("content-type"), response.headers.get("retry-after"), body


@pytest.fixture(scope="module")
def app():
    """The app with its service started (lifespan), on the CPU; ``fallbacks`` counts what FastAPI served."""
    application = create_app(Settings(devices="cpu", models="digits", workers_per_device=1, max_body_bytes=2048))
    fastapi_way = application.hot.app
    application.fallbacks = 0

    async def counted(scope, receive, send):
        application.fallbacks += 1
        await fastapi_way(scope, receive, send)

    application.hot.app = counted
    application.fastapi_way = fastapi_way
    loop = asyncio.new_event_loop()
    lifespan = application.router.lifespan_context(application)
    loop.run_until_complete(lifespan.__aenter__())
    application.loop = loop
    yield application
    loop.run_until_complete(lifespan.__aexit__(None, None, None))
    loop.close()


def _post(app, asgi, path, body, headers) -> httpx.Response:
    async def go():
        transport = httpx.ASGITransport(app=asgi)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            return await client.post(path, content=content, headers=headers)

    return app.loop.run_until_complete(go())


@pytest.mark.parametrize("path, body, headers, status", [(*r, s) for r, s in zip(REQUESTS, STATUSES, strict=True)])
def test_the_hot_route_answers_as_the_fastapi_route(app, path, body, headers, status):
    def fastapi_way(scope, receive, send):
        scope["app"] = app
        return app.fastapi_way(scope, receive, send)

    hot = _post(app, app, path, body, headers)
    slow = _post(app, fastapi_way, path, body, headers)
    assert _comparable(hot) == _comparable(slow), (hot.text, slow.text)
    assert hot.status_code == status, hot.text


def test_good_requests_take_the_hot_path_and_fastapi_words_a_422(app):
    before = app.fallbacks
    assert _post(app, app, *REQUESTS[0]).status_code == 200
    assert _post(app, app, *next(r for r in REQUESTS if r[0].startswith("/v2"))).status_code == 200
    assert _post(app, app, "/predict", {"model": "nope", "inputs": [DIGIT]}, JSON).status_code == 404
    assert app.fallbacks == before  # the control: the next request does reach FastAPI
    answer = _post(app, app, "/predict", {"inputs": [DIGIT]}, JSON)
    assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["body", "model"]
    assert app.fallbacks == before + 1


def test_openapi_still_documents_the_hot_routes(app):
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return (await client.get("/openapi.json")).json()

    paths = app.loop.run_until_complete(go())["paths"]
    assert "post" in paths["/predict"] and "post" in paths["/v2/models/{name}/infer"]
    assert "post" in paths["/v2/models/{name}/versions/{version}/infer"]
    # The documented version is a path parameter only, not also a query parameter.
    versioned = paths["/v2/models/{name}/versions/{version}/infer"]["post"]["parameters"]
    assert [(p["name"], p["in"]) for p in versioned] == [("name", "path"), ("version", "path")]


def test_one_route_table_is_both_the_hot_path_and_the_documentation(app):
    """Every documented inference route comes from the table, and the hot path serves the table: an
    inference route added beside it (documented, but not hot, or the reverse) fails here."""
    from placeenv.serve.app import INFER_ROUTES

    posts = {path for path, operations in app.openapi()["paths"].items() if "post" in operations}
    assert posts - {"/v2/repository/index"} == {route.path for route in INFER_ROUTES}
    assert [route.path for route in app.hot.routes] == [route.path for route in INFER_ROUTES]
    assert app.hot.find("/v2/models/digits/versions/1/infer")[1] == {"name": "digits", "version": "1"}
    for path in ("/v2/models/digits/infer/more", "/v2/models//infer", "/predict/", "/v2/models/digits"):
        assert app.hot.find(path) is None, path


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
