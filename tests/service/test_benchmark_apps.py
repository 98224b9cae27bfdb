"""The benchmarks' reference apps answer the digits body as the service does.

A benchmark against a reference that answers 500 measures nothing: each app runs under a real
uvicorn on 127.0.0.1 and must give the service's outputs for the same body.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest
from support import blocked_at, wait_until
from support.servers import ServiceProcess

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_service import Server, example_body, free_port  # noqa: E402
import raw_grpc_app  # noqa: E402


@pytest.fixture(scope="module")
def expected() -> dict:
    with ServiceProcess(DEVICES="sim:0", WORKERS_PER_DEVICE=1) as service:
        answer = httpx.post(service.url + "/predict", content=example_body("digits"),
                            headers={"content-type": "application/json"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _post_to_app(app: str, body: str) -> httpx.Response:
    """``body`` to ``/predict`` of ``benchmarks/<app>.py`` under a real uvicorn, as the benchmarks run it."""
    port = free_port()
    server = Server([sys.executable, "-m", "uvicorn", f"benchmarks.{app}:app", "--port", str(port),
                     "--log-level", "warning"], {"PLACEENV_DEVICES": "sim:0", "PLACEENV_MODELS": "digits"}, port)
    try:
        return httpx.post(server.url + "/predict", content=body, headers={"content-type": "application/json"},
                          timeout=30)
    finally:
        server.stop()


@pytest.mark.parametrize("app", ["http_floor_app", "global_lock_app"])
def test_reference_app_answers_as_the_service(app, expected):
    answer = _post_to_app(app, example_body("digits"))
    assert answer.status_code == 200, answer.text[:500]
    assert json.loads(answer.text)["outputs"] == expected["outputs"]


@pytest.mark.parametrize("app", ["raw_asgi_app", "handoff_floor_app"])
def test_front_end_floor_app_answers_as_the_null_model(app):
    rows = [[float(i + j) for i in range(64)] for j in range(2)]
    answer = _post_to_app(app, json.dumps({"model": "null", "inputs": rows}))
    assert answer.status_code == 200, answer.text[:500]
    assert answer.json() == {"model": "null", "outputs": [{"y": row[:10]} for row in rows]}


def test_raw_grpc_app_answers_as_the_services_grpc_endpoint():
    """benchmarks/raw_grpc_app.py, gRPC's ceiling in front_end_ceiling.py, gives the null model's
    output by tritonclient.grpc, with and without its hand-off to a thread, as the service's own
    gRPC endpoint does for the same call."""
    import numpy as np
    import tritonclient.grpc as triton

    rows = np.arange(128, dtype=np.float32).reshape(2, 64)

    def call(port: int) -> np.ndarray:
        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        x = triton.InferInput("x", list(rows.shape), "FP32")
        x.set_data_from_numpy(rows)
        return client.infer("null", [x], outputs=[triton.InferRequestedOutput("y")]).as_numpy("y")

    port, handoff_port = free_port(), free_port()
    raw = Server([sys.executable, "benchmarks/raw_grpc_app.py", str(port)], {}, port,
                 ready=raw_grpc_app.is_ready)
    handoff = Server([sys.executable, "benchmarks/raw_grpc_app.py", str(handoff_port), "--handoff"], {},
                     handoff_port, ready=raw_grpc_app.is_ready)
    try:
        from_raw, from_handoff = call(port), call(handoff_port)
    finally:
        raw.stop()
        handoff.stop()
    grpc_port = free_port()
    with ServiceProcess(DEVICES="cpu", WORKERS_PER_DEVICE=1, MODELS="null", GRPC_PORT=grpc_port,
                        MODEL_REPOSITORY=str(ROOT / "benchmarks" / "repository")):
        from_service = call(grpc_port)
    np.testing.assert_array_equal(from_raw, rows[:, :10])
    np.testing.assert_array_equal(from_handoff, from_raw)
    np.testing.assert_array_equal(from_service, from_raw)


def test_null_model_device_runs_one_sleep_at_a_time(tmp_path):
    """The null model's sleep stands in for a device kernel, and a device runs one at a time: a
    second worker on the same device waits for the first's sleep (so device_scaling.py's ideal,
    1000 / sleep_ms a device, holds with two workers a device), while another device's does not.
    Negative control: drop the ``with self.engine`` in its model.py and the same-device call
    ends while the engine is held."""
    import threading

    import device_scaling
    import numpy as np

    from placeenv.serve.models.base import host_tensor
    from placeenv.serve.engine.standalone import replica
    from placeenv.serve.models.repository import scan

    entries, errors = scan([device_scaling.repository(tmp_path, 1.0)], ["null"], max_batch_size=1,
                           max_batch_delay_ms=0)
    assert not errors
    first, second, other = (replica(entries["null"], place) for place in ("sim:0", "sim:0", "sim:1"))
    assert first.engine is second.engine and first.engine is not other.engine
    x = {"x": host_tensor(np.zeros((1, 64), np.float32))}
    failures: list[BaseException] = []

    def execute(model) -> None:
        try:
            model.execute(x)
        except BaseException as exc:  # noqa: BLE001 - a worker's exception fails the test below
            failures.append(exc)

    with first.engine:  # the first worker's kernel runs on sim:0
        same, elsewhere = (threading.Thread(target=execute, args=(m,)) for m in (second, other))
        same.start()
        elsewhere.start()
        elsewhere.join(10)
        assert not elsewhere.is_alive(), "another device's sleep waited for sim:0's"
        # The same device's call waits at the engine's lock, or, without the lock, ends after its sleep.
        wait_until(lambda: blocked_at(same, "with self.engine:") or not same.is_alive(), 60,
                   "the same-device call neither waited for the engine nor ended")
        assert same.is_alive(), "two kernels ran on sim:0 at once"
    same.join(10)
    assert not same.is_alive() and not failures, failures
