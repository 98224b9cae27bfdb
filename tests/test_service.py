"""The inference service end to end: real uvicorn on 127.0.0.1, httpx clients, sim devices."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import numpy as np
import pytest

from placeenv.serve.models.digits import Digits, held_out_split
from servers import ServiceProcess

SIM = {"sim:0", "sim:1", "sim:2", "sim:3"}
X_TEST, Y_TEST = held_out_split()


def example(i: int) -> list[float]:
    return [float(v) for v in X_TEST[i % len(X_TEST)]]


async def hammer(url: str, clients: int, per_client: int, model: str = "digits", keepalive: bool = True,
                 make=lambda c, i: [example(c * 1000 + i)], until_unreachable: bool = False):
    """``clients`` concurrent clients sending ``per_client`` predicts each; returns (status, body|error) list.

    ``until_unreachable``: a client stops at its first connection error (the service has gone away).
    """
    limits = httpx.Limits(max_keepalive_connections=None if keepalive else 0)
    results = []
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        async def client(c):
            for i in range(per_client):
                try:
                    r = await http.post("/predict", json={"model": model, "inputs": make(c, i)})
                    results.append((r.status_code, r.json() if r.headers.get("content-type", "").startswith(
                        "application/json") else r.text, r.headers))
                except httpx.HTTPError as exc:
                    results.append((type(exc).__name__, str(exc), {}))
                    if until_unreachable:
                        return
        await asyncio.gather(*[client(c) for c in range(clients)])
    return results


@pytest.fixture(scope="module")
def service():
    with ServiceProcess(MODELS="digits,faulty", MAX_BODY_BYTES=200_000) as proc:
        yield proc


def test_requests_spread_over_every_device_and_report_their_worker(service):
    results = asyncio.run(hammer(service.url, clients=16, per_client=8))
    assert {r[0] for r in results} == {200}
    devices = {body["device"] for _, body, _ in results}
    assert devices == SIM
    for _, body, _ in results:
        assert body["worker"].split("/")[0] == body["device"]
        assert body["model"] == "digits" and len(body["outputs"]) == 1
        assert set(body["timings"]) == {"preprocess_ms", "queue_ms", "compute_ms", "total_ms"}


def test_load_32_clients_every_check_passes_no_leak(service):
    before = service.total("placeenv_place_checks_total")
    results = asyncio.run(hammer(service.url, clients=32, per_client=50))
    assert len(results) == 1600
    assert {r[0] for r in results} == {200}
    assert {body["device"] for _, body, _ in results} == SIM
    checks = service.total("placeenv_place_checks_total") - before
    # preprocess once per request; worker/batch/output once per batch (>= 1 example)
    assert checks >= 1600 + 3 * 1600 / 8
    for stage in ("preprocess", "worker", "batch", "output"):
        assert service.total("placeenv_place_checks_total", stage=stage) > 0
    assert service.total("placeenv_device_leaks_total") == 0
    for device in SIM:
        assert service.total("inference_requests_total", device=device, status="ok") > 0


def test_isolation_off_shows_leaks():
    """Negative control: the same service on stock Paddle semantics leaks, and the counters see it."""
    with ServiceProcess(ISOLATION="off") as proc:
        results = asyncio.run(hammer(proc.url, clients=32, per_client=15))
        leaks = proc.total("placeenv_device_leaks_total")
    assert len(results) == 480
    assert leaks > 0


def test_digits_answers_match_a_direct_cpu_forward(service):
    import paddle

    model = Digits()
    model.initialize(paddle.CPUPlace())
    direct = model.infer([example(i) for i in range(100)])
    with httpx.Client(base_url=service.url, timeout=60) as http:
        served = []
        for start in range(0, 100, 10):
            r = http.post("/predict", json={"model": "digits", "inputs": [example(i) for i in range(start, start + 10)]})
            assert r.status_code == 200
            served += r.json()["outputs"]
    assert [o["label"] for o in served] == [o["label"] for o in direct]
    np.testing.assert_allclose([o["probabilities"] for o in served], [o["probabilities"] for o in direct], atol=1e-5)
    assert np.mean(np.array([o["label"] for o in served]) == Y_TEST[:100]) >= 0.95


def test_requests_that_share_a_batch_each_get_their_own_answers():
    import paddle

    requests = [[example(r * 3 + k) for k in range(1 + r % 3)] for r in range(192)]  # 1 to 3 examples each

    async def send_all(url):
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            gate = asyncio.Semaphore(32)

            async def one(inputs):
                async with gate:
                    return await http.post("/predict", json={"model": "digits", "inputs": inputs})

            return await asyncio.gather(*[one(inputs) for inputs in requests])

    # One worker that waits up to 20 ms to fill a batch: requests queue behind it and share
    # batches whatever the machine's speed (8 workers could keep up with the client and never batch).
    with ServiceProcess(DEVICES="sim:0", WORKERS_PER_DEVICE=1, MAX_BATCH_DELAY_MS=20) as proc:
        answers = asyncio.run(send_all(proc.url))
    model = Digits()
    model.initialize(paddle.CPUPlace())
    shared = 0
    for inputs, answer in zip(requests, answers):
        assert answer.status_code == 200
        body, direct = answer.json(), model.infer(inputs)
        assert [o["label"] for o in body["outputs"]] == [o["label"] for o in direct]
        np.testing.assert_allclose([o["probabilities"] for o in body["outputs"]],
                                   [o["probabilities"] for o in direct], atol=1e-5)
        shared += body["batch_size"] > len(inputs)
    assert shared > 0, "no request shared a batch: the batched path was not exercised"


def test_models_health_metrics_and_docs(service):
    with httpx.Client(base_url=service.url, timeout=30) as http:
        listed = http.get("/v1/models").json()
        assert {m["name"] for m in listed["models"]} == {"digits", "faulty"}
        assert set(listed["devices"]) == SIM
        digits = next(m for m in listed["models"] if m["name"] == "digits")
        assert digits["input_shape"] == [64]
        assert http.get("/healthz").json() == {"status": "alive"}
        ready = http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        assert len(ready.json()["workers"]) == 8
        assert "/predict" in http.get("/openapi.json").json()["paths"]
        assert http.get("/docs").status_code == 200
        text = http.get("/metrics").text
    for name in ("inference_requests_total", "worker_up", "placeenv_place_checks_total", "process_cpu_seconds_total"):
        assert name in text


NAN_BODY = '{"model": "digits", "inputs": [[NaN' + ", 0" * 63 + "]]}"
INF_BODY = '{"model": "digits", "inputs": [[Infinity' + ", 0" * 63 + "]]}"


@pytest.mark.parametrize(
    "body, status, fragment",
    [
        ({"model": "resnet", "inputs": [[0] * 64]}, 404, "available: digits, faulty"),
        ("{not json", 422, "JSON"),
        ([1, 2], 422, "valid dictionary"),
        ({"inputs": [[0] * 64]}, 422, "model"),
        ({"model": "digits", "inputs": "abc"}, 422, "valid list"),
        ({"model": "digits", "inputs": []}, 422, "empty"),
        ({"model": "digits", "inputs": [[0] * 63]}, 422, "expected shape"),
        ({"model": "digits", "inputs": [[[0] * 8] * 7]}, 422, "expected shape"),
        ({"model": "digits", "inputs": [["a"] * 64]}, 422, "non-numeric"),
        ({"model": "digits", "inputs": [[0] * 63 + [17]]}, 422, "outside the allowed range"),
        ({"model": "digits", "inputs": [[0] * 64] * 33}, 422, "limit is 32"),
        ({"model": "digits", "inputs": [[0] * 64], "extra": 1}, 422, "extra"),
        (NAN_BODY, 422, "non-finite"),
        (INF_BODY, 422, "non-finite"),
    ],
)
def test_bad_requests_get_a_clear_4xx(service, body, status, fragment):
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(service.url + "/predict", content=content, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    assert fragment.lower() in r.text.lower()


def test_body_over_the_limit_is_413_before_parsing(service):
    big = b'{"model": "digits", "inputs": [' + b"[" + b"0," * 150_000 + b"0]]}"
    r = httpx.post(service.url + "/predict", content=big, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and "200000 bytes" in r.text

    def chunks():  # no Content-Length: the limit is enforced while streaming
        yield b'{"model": "digits", "inputs": ['
        for _ in range(100):
            yield b"[" + b"1," * 2000 + b"1],"
        yield b"[0]]}"

    r = httpx.post(service.url + "/predict", content=chunks(), headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413


def test_injected_model_failure_is_500_for_that_request_only(service):
    async def main():
        async with httpx.AsyncClient(base_url=service.url, timeout=60) as http:
            bad = http.post("/predict", json={"model": "faulty", "inputs": [[-1, 0, 0, 0]]})
            good_faulty = [http.post("/predict", json={"model": "faulty", "inputs": [[1, 0.5, 0, 0]]}) for _ in range(8)]
            good = [http.post("/predict", json={"model": "digits", "inputs": [example(i)]}) for i in range(16)]
            return await asyncio.gather(bad, *good_faulty, *good)

    bad, *others = asyncio.run(main())
    assert bad.status_code == 500 and "injected model failure" in bad.text
    assert all(r.status_code == 200 for r in others)
    assert all(r.json()["outputs"] == [{"sum": 1.5}] for r in others[:8])


def test_killed_worker_is_replaced_and_only_its_request_fails(service):
    restarts = service.total("worker_restarts_total")
    with httpx.Client(base_url=service.url, timeout=60) as http:
        r = http.post("/predict", json={"model": "faulty", "inputs": [[-2, 0, 0, 0]]})
        assert r.status_code == 500 and "died" in r.text
        deadline = time.monotonic() + 60
        while service.total("worker_restarts_total") == restarts or http.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "dead worker not replaced"
            time.sleep(0.2)
    results = asyncio.run(hammer(service.url, clients=8, per_client=8))
    assert {r[0] for r in results} == {200}
    assert {body["device"] for _, body, _ in results} == SIM
    assert service.total("worker_up") == 8


def _mobilenet_input(c: int, i: int):
    return [[[[((c + i) % 7) / 7.0] * 32] * 32] * 3]


def test_overload_gets_503_with_retry_after_and_every_request_one_answer():
    with ServiceProcess(DEVICES="sim:0", WORKERS_PER_DEVICE=1, QUEUE_CAPACITY=2, MODELS="mobilenet",
                        MAX_BATCH_SIZE=1) as proc:
        results = asyncio.run(hammer(proc.url, clients=24, per_client=2, model="mobilenet", make=_mobilenet_input))
        overloaded = proc.total("inference_requests_total", status="overloaded")
    statuses = [r[0] for r in results]
    assert len(statuses) == 48 and set(statuses) <= {200, 503}
    assert statuses.count(503) > 0 and statuses.count(200) > 0
    assert statuses.count(503) == overloaded
    for status, body, headers in results:
        if status == 503:
            assert headers["retry-after"] == "1" and "queues are full" in body["detail"]


def test_request_timeout_is_504():
    with ServiceProcess(DEVICES="sim:0", WORKERS_PER_DEVICE=1, QUEUE_CAPACITY=64, MODELS="mobilenet",
                        MAX_BATCH_SIZE=1, REQUEST_TIMEOUT_S=0.3) as proc:
        results = asyncio.run(hammer(proc.url, clients=16, per_client=1, model="mobilenet", make=_mobilenet_input))
        ready = httpx.get(proc.url + "/readyz").status_code
    statuses = [r[0] for r in results]
    assert len(statuses) == 16 and set(statuses) <= {200, 504}
    assert statuses.count(504) > 0
    assert all("within 0.3 s" in body["detail"] for status, body, _ in results if status == 504)
    assert ready == 200  # timeouts do not hurt the workers


def test_sigterm_under_load_drops_nothing_and_exits_0():
    proc = ServiceProcess(SHUTDOWN_DELAY_S=1.0).wait_ready()
    try:
        seen_not_ready = []

        async def main():
            # A new connection per request, and enough of them to outlast the drain (the load
            # must still be running when SIGTERM arrives), each client ending when the service has gone.
            load = asyncio.create_task(
                hammer(proc.url, clients=16, per_client=2000, keepalive=False, until_unreachable=True)
            )
            await asyncio.sleep(1.5)
            proc.proc.send_signal(__import__("signal").SIGTERM)
            await asyncio.sleep(0.3)
            async with httpx.AsyncClient(timeout=5) as http:
                try:
                    seen_not_ready.append((await http.get(proc.url + "/readyz")).status_code)
                except httpx.HTTPError as exc:
                    seen_not_ready.append(type(exc).__name__)
            return await load

        results = asyncio.run(main())
        code = proc.proc.wait(60)
        log = proc.output()
    finally:
        proc.kill()
    kinds = [r[0] for r in results]
    # 200: served; 503 + Retry-After: refused while draining. Connection errors are
    # connections the app never saw (refused, or reset in the kernel's accept queue
    # when the listener closed): the service's own count below proves that.
    answered = kinds.count(200) + kinds.count(503)
    assert set(kinds) <= {200, 503, "ConnectError", "ReadError"}, set(kinds)
    assert kinds.count(200) > 0 and kinds.count(503) > 0
    received = re.search(r"stopped: (\d+) predict requests received, (\d+) answered", log)
    assert received, log[-3000:]
    assert int(received.group(1)) == int(received.group(2)) == answered
    assert all(h.get("retry-after") for k, _, h in results if k == 503)
    assert seen_not_ready == [503]
    assert code == 0
