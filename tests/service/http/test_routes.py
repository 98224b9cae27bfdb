"""The inference route table and ``InferRouter``, which serves it ahead of FastAPI, give the answers
of the ways they replace.

Each request to ``/predict`` and ``/v2/.../infer`` gets its status, and a body that is not a predict
request gets FastAPI's 422 in FastAPI's words (a FastAPI route reading the same body is the
reference); every method on an inference path is answered; one table is the router, the OpenAPI
document and the index.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError

from placeenv.serve.config import Settings
from placeenv.serve.engine.local import local_gateway
from placeenv.serve.http.app import create_app
from placeenv.serve.http.predict import PredictRequest
from placeenv.serve.http.responses import JSON as JSONAnswer
from placeenv.serve.http.responses import validation_detail

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
    control = {"/v2/repository/index", "/v2/repository/models/{name}/load", "/v2/repository/models/{name}/unload"}
    assert posts - control == {route.path for route in INFER_ROUTES}
    assert [route.path for route in app.infer.routes] == [route.path for route in INFER_ROUTES]
    assert [e["path"] for e in ENDPOINTS if e["method"] == "POST"] == [route.path for route in INFER_ROUTES]
    assert app.infer.find("/v2/models/digits/versions/1/infer")[1] == {"name": "digits", "version": "1"}
    for path in ("/v2/models/digits/infer/more", "/v2/models//infer", "/predict/", "/v2/models/digits"):
        assert app.infer.find(path) is None, path


def _counted() -> dict[tuple[str, str], float]:
    """``inference_requests_total`` of this process, by (model, status)."""
    from prometheus_client.parser import text_string_to_metric_families

    from placeenv.serve import metrics

    body, _ = metrics.exposition()
    return {(s.labels["model"], s.labels["status"]): s.value
            for family in text_string_to_metric_families(body.decode()) if family.name == "inference_requests"
            for s in family.samples if s.name == "inference_requests_total"}


@pytest.mark.parametrize("method, path, body, headers, label", [
    ("POST", "/predict", b"[" * 8001, JSON, ("unknown", "too_large")),  # the router's 413
    ("GET", "/v2/models/digits/infer", b"", {}, ("unknown", "method_not_allowed")),  # the router's 405
    ("POST", "/predict", b"{not json", JSON, ("unknown", "invalid")),  # the adapter's 422, through the gateway
    ("POST", "/v2/models/digits/infer", json.dumps(V2).encode(), {"content-type": "text/plain"},
     ("digits", "unsupported_media_type")),  # the path names the model before the body is read
    ("POST", "/v2/models/digits/infer", json.dumps(V2).encode(), JSON, ("digits", "ok")),  # the control
])
def test_every_answer_of_an_inference_route_is_counted_once_with_its_model(app, method, path, body, headers, label):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.request(method, path, content=body, headers=headers)

    before = _counted()
    app.loop.run_until_complete(go())
    after = _counted()
    grew = {key: after[key] - before.get(key, 0.0) for key in after if after[key] != before.get(key, 0.0)}
    assert grew == {label: 1.0}
