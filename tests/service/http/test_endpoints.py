"""The simple JSON API and the operational endpoints of a real service (uvicorn on 127.0.0.1, httpx
clients, sim devices): /v1/models, /healthz, /readyz, /openapi.json, /docs and /metrics describe
what is served; a bad /predict request gets a clear 4xx; a body over the limit is a 413 before it
is parsed.
"""

from __future__ import annotations

import json

import httpx
import pytest

SIM = {"sim:0", "sim:1", "sim:2", "sim:3"}


@pytest.fixture(scope="module")
def service_settings():
    return {"MODELS": "digits,faulty", "MAX_BODY_BYTES": 200_000}


def test_models_health_metrics_and_docs(service):
    assert "GIL switch interval 0.5 ms" in service.output()  # the default (Python's own is 5)
    with httpx.Client(base_url=service.url, timeout=30) as http:
        listed = http.get("/v1/models").json()
        assert {m["name"] for m in listed["models"]} == {"digits", "faulty"}
        assert set(listed["devices"]) == SIM
        assert listed["not_ready"] == {}
        digits = next(m for m in listed["models"] if m["name"] == "digits")
        assert digits["versions"] == ["1"] and digits["max_batch_size"] == 8
        assert digits["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]
        assert digits["outputs"] == [{"name": "label", "datatype": "INT64", "shape": [-1]},
                                     {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}]
        assert http.get("/healthz").json() == {"status": "alive"}
        ready = http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        assert len(ready.json()["workers"]) == 8
        assert "/predict" in http.get("/openapi.json").json()["paths"]
        assert http.get("/docs").status_code == 200
        text = http.get("/metrics").text
    for name in ("inference_requests_total", "worker_up", "placeenv_place_checks_total",
                 "process_cpu_seconds_total"):
        assert name in text


NAN_BODY = '{"model": "digits", "inputs": [[NaN' + ", 0" * 63 + "]]}"
INF_BODY = '{"model": "digits", "inputs": [[Infinity' + ", 0" * 63 + "]]}"


@pytest.mark.parametrize(
    "body, status, fragment",
    [
        # 404: no such model or version; the message says what exists
        ({"model": "resnet", "inputs": [[0] * 64]}, 404, "available: digits, faulty"),
        ({"model": "digits", "version": 2, "inputs": [[0] * 64]}, 404, "no version 2; it has 1"),
        # 422: not a predict request (FastAPI's schema errors)
        ("{not json", 422, "JSON"),
        ([1, 2], 422, "valid dictionary"),
        ({"inputs": [[0] * 64]}, 422, "model"),
        ({"model": "digits", "inputs": "abc"}, 422, "valid list"),
        ({"model": "digits", "inputs": [[0] * 64], "extra": 1}, 422, "extra"),
        # 400: inputs the model does not take; the message names the tensor and what was expected
        ({"model": "digits", "inputs": []}, 400, "'pixels' has no examples"),
        ({"model": "digits", "inputs": [[0] * 63]}, 400, "shape [1, 63]; expected [-1, 64]"),
        ({"model": "digits", "inputs": [[[0] * 8] * 7]}, 400, "shape [1, 7, 8]; expected [-1, 64]"),
        # the 8x8 nested form is gone: 64 flat values only
        ({"model": "digits", "inputs": [[[0] * 8] * 8]}, 400, "shape [1, 8, 8]; expected [-1, 64]"),
        ({"model": "digits", "inputs": [[0] * 64, [0] * 63]}, 400, "ragged"),
        ({"model": "digits", "inputs": {"image": [[0] * 64]}}, 400, "unknown input 'image'"),
        ({"model": "digits", "inputs": [["a"] * 64]}, 400, "value 'a' at position [0, 0]; expected numbers"),
        ({"model": "digits", "inputs": [[0] * 63 + [17]]}, 400, "17 at position [0, 63]; expected pixels in"),
        ({"model": "digits", "inputs": [[0] * 64] * 33}, 400, "limit is 32"),
        (NAN_BODY, 400, "value nan at position [0, 0]"),
        (INF_BODY, 400, "value inf at position [0, 0]"),
    ],
)
def test_bad_requests_get_a_clear_4xx(service, body, status, fragment):
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(service.url + "/predict", content=content, headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == status, r.text
    assert fragment.lower() in r.text.lower(), r.text
    assert set(r.json()) == {"detail"}


def test_body_over_the_limit_is_413_before_parsing(service):
    big = b'{"model": "digits", "inputs": [' + b"[" + b"0," * 150_000 + b"0]]}"
    json_type = {"content-type": "application/json"}
    r = httpx.post(service.url + "/predict", content=big, headers=json_type, timeout=30)
    assert r.status_code == 413 and "200000 bytes" in r.text

    def chunks():  # no Content-Length: the limit is enforced while streaming
        yield b'{"model": "digits", "inputs": ['
        for _ in range(100):
            yield b"[" + b"1," * 2000 + b"1],"
        yield b"[0]]}"

    r = httpx.post(service.url + "/predict", content=chunks(), headers=json_type, timeout=30)
    assert r.status_code == 413
