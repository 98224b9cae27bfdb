"""The request path's shortcuts give the answers of the slow ways they replace."""

from __future__ import annotations

import asyncio
import gc
import json
import math
import subprocess
import sys
import textwrap

import httpx
import numpy as np
import paddle
import pytest

import placeenv
from placeenv import PlaceEnv
from placeenv.serve.config import Settings
from placeenv.serve.engine.local import local_gateway
from placeenv.serve.http.app import create_app
from placeenv.serve.http.responses import JSON
from placeenv.serve.models import BUNDLED, scan
from placeenv.serve.models.base import host_tensor, move_to

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


def test_device_name_cache_follows_a_place_object_that_changes():
    place = type(paddle.ones([1]).place)()  # the generic place type Tensor.place returns
    place.set_place(paddle.CPUPlace())
    assert placeenv.device_name(place) == "cpu"
    place.set_place(paddle.CustomPlace("sim", 1))  # the cache keyed a copy, not this object
    assert placeenv.device_name(place) == "sim:1"
    assert placeenv.device_name(paddle.CustomPlace("sim", 3)) == "sim:3"
    assert placeenv.device_name(paddle.CPUPlace()) == "cpu"


def _objects_left_after(step, n: int = 300) -> int:
    """How many more GC-tracked objects exist after ``n`` calls of ``step`` (results dropped)."""
    for _ in range(20):
        step()
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(n):
        step()
    gc.collect()
    return len(gc.get_objects()) - before


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_host_tensor_is_to_tensor_on_cpu(dtype):
    array = (np.arange(24).reshape(2, 3, 4) * 1.5).astype(dtype)
    ours, stock = host_tensor(array), paddle.to_tensor(array, place=paddle.CPUPlace())
    assert (ours.dtype, ours.shape, ours.stop_gradient, placeenv.device_name(ours.place)) == (
        stock.dtype, stock.shape, stock.stop_gradient, "cpu"
    )
    assert np.array_equal(ours.numpy(), stock.numpy())
    array[0, 0, 0] = 99  # a copy, not a view of the caller's array
    assert ours.numpy()[0, 0, 0] == 0


@pytest.mark.parametrize("device", ["sim:2", "cpu"])
@pytest.mark.parametrize("stop_gradient", [True, False])
def test_move_to_is_tensor_to(device, stop_gradient):
    source = host_tensor(np.arange(12, dtype="float32").reshape(3, 4))
    source.stop_gradient = stop_gradient
    place = placeenv.to_place(device)
    ours, stock = move_to(source, place), source.to(place)
    assert (placeenv.device_name(ours.place), ours.dtype, ours.shape, ours.stop_gradient) == (
        placeenv.device_name(stock.place), stock.dtype, stock.shape, stock.stop_gradient
    ) == (device, source.dtype, source.shape, stop_gradient)
    assert np.array_equal(ours.numpy(), source.numpy())


def test_the_request_path_leaks_no_python_objects():
    """Paddle 3.3.1's eager Tensor constructor leaks a list per call; the request path avoids it."""
    entries, errors = scan([BUNDLED], ["digits"], max_batch_size=8, max_batch_delay_ms=2.0)
    assert errors == []
    version = entries["digits"].default
    model = version.model_class()
    model.initialize(placeenv.to_place("sim:1"), version.context)
    example = np.array([[float(i % 17) for i in range(64)]], dtype="float32")
    arrays = [np.full((1, 64), 3.0, dtype="float32") for _ in range(3)]
    jobs = [host_tensor(array) for array in arrays]

    def request():  # what the service and a worker do with one request, and with a batch of three
        with PlaceEnv("cpu"):
            host = host_tensor(model.preprocess({"pixels": example})["pixels"])
        model.postprocess(model.execute({"pixels": move_to(host, model.place)}))
        model.postprocess(model.execute({"pixels": move_to(paddle.concat(jobs), model.place)}))

    assert _objects_left_after(request) < 30
    # The negative control: the same count catches the leak host_tensor avoids.
    assert _objects_left_after(lambda: paddle.to_tensor(arrays[0], place=paddle.CPUPlace())) >= 300
