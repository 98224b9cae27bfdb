"""The app as ``create_app`` assembles it, and its one JSON renderer, give the answers of the slow ways
they replace: the renderer writes the JSON of ``json.dumps`` (and names the floats it cannot write);
the OpenTelemetry setting turns FastAPI's tracing on and off; the body limit comes before anything
reads a body.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import textwrap

import httpx
import pytest

from placeenv.serve.config import Settings
from placeenv.serve.engine.local import local_gateway
from placeenv.serve.http.app import create_app
from placeenv.serve.http.responses import JSON

ANSWERS = [
    {"model": "digits", "outputs": [{"label": 3, "probabilities": [0.1 + 0.2, 1e-300, 5e-324, 1 / 3, 0.0]}],
     "device": "sim:0", "worker": "sim:0/1", "batch_size": 7, "timings": {"total_ms": 1.234}},
    {"text": "é ü \u2028 \"quoted\" \\ \n", "nested": [[], {}, [None, True, False]], "big": 2**63},
]


@pytest.mark.parametrize("answer", ANSWERS)
def test_the_json_renderer_writes_the_json_of_json_dumps(answer):
    fast = JSON(answer)
    plain = json.dumps(answer, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    assert json.loads(fast.body) == json.loads(plain) == answer  # every float round-trips exactly
    assert fast.headers["content-type"] == "application/json"


def test_the_json_renderer_names_non_finite_floats_where_json_dumps_raises():
    answer = {"outputs": [math.nan, math.inf, -math.inf]}
    with pytest.raises(ValueError):
        json.dumps(answer, allow_nan=False)
    assert json.loads(JSON(answer).body) == {"outputs": ["NaN", "Infinity", "-Infinity"]}


def test_the_json_renderer_escapes_a_lone_surrogate_which_utf8_cannot_encode():
    answer = {"error": "unknown model '\ud800'", "nan": math.nan}
    body = JSON(answer).body
    assert body.isascii() and json.loads(body) == {**answer, "nan": "NaN"}


# In a child process: an OpenTelemetry tracer provider is process-global and can be set once.
_OTEL_PROBE = textwrap.dedent("""
    import sys, httpx, asyncio
    from opentelemetry import trace
    from placeenv.serve.config import Settings
    from placeenv.serve.engine.local import local_gateway
    from placeenv.serve.http.app import create_app

    class Counting(trace.TracerProvider):  # a configured provider, to FastAPI
        asked = 0
        def get_tracer(self, *args, **kwargs):
            Counting.asked += 1
            return trace.NoOpTracer()

    trace.set_tracer_provider(Counting())
    app = create_app(Settings(opentelemetry=sys.argv[1] == "on", devices="cpu", models="digits"), local_gateway)

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            assert (await client.get("/healthz")).status_code == 200
    asyncio.run(main())
    print(Counting.asked)
""")


@pytest.mark.parametrize("setting, traced", [("on", True), ("off", False)])
def test_opentelemetry_setting_turns_fastapis_tracing_on_and_off(setting, traced):
    # "on" is the control: the same probe sees FastAPI ask the configured provider for a tracer.
    out = subprocess.run([sys.executable, "-c", _OTEL_PROBE, setting], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (int(out.stdout.split()[-1]) > 0) is traced


def test_create_app_returns_the_complete_app_with_its_body_limit():
    # No lifespan here (ASGITransport runs none): no service, no workers; the limit comes first.
    app = create_app(Settings(devices="cpu", models="digits", max_body_bytes=1024), local_gateway)

    async def post(path: str, content) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.post(path, content=content, headers={"content-type": "application/json"})

    async def chunks(size: int):  # no content-length: the limit counts what arrives
        for _ in range(size // 100 + 1):
            yield b"{" * 100

    at_limit = asyncio.run(post("/predict", b"{" * 1024))
    assert at_limit.status_code == 503, at_limit.text  # read (the control): then no engine yet
    for path, key in (("/predict", "detail"), ("/v2/models/digits/infer", "error")):
        over = asyncio.run(post(path, b"{" * 1025))
        assert over.status_code == 413 and "1024 bytes" in over.json()[key], over.text
    streamed = asyncio.run(post("/predict", chunks(1025)))
    assert streamed.status_code == 413, streamed.text
